/// @file
/// Hugging Face Marian translation checkpoints (MarianMTModel, the Opus-MT models) imported into
/// graft's own encoder-decoder Transformer: config.json plus model.safetensors (or shards listed
/// by model.safetensors.index.json). What is read and what is refused (naming the field or the
/// tensor) is in docs/hub-models.md, "Marian translation models".
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "graft/models/transformer.h"

namespace graft::models {

/// The generation facts of a Marian config.json (and generation_config.json) that the
/// Transformer does not hold.
struct HfMarianFacts {
  int64_t forced_eos_id = -1;  ///< forced_eos_token_id: the only token at the last step (-1: none)
  std::vector<int64_t> bad_words;  ///< bad_words_ids of one token each (Opus-MT: [[pad]])
  int64_t num_beams = 1;           ///< num_beams (1: greedy)
  int64_t max_length = 512;        ///< max_length: tokens generated, the decoder start included
  double length_penalty = 1.0;     ///< length_penalty of Hugging Face's beam scores
};

/// A config.json read into the TransformerConfig it needs (post-LN, no final norms, the halves
/// sinusoid layout, no target pad masking, final_logits_bias, bos_id = decoder_start_token_id)
/// and the generation facts.
struct HfMarianConfig {
  TransformerConfig t;  ///< the model's config (dtype float32: load_hf_marian() sets the files')
  HfMarianFacts hf;     ///< forced eos, banned tokens, beams, lengths
};

/// Reads a Hugging Face config.json of model_type marian, with MarianConfig's defaults for absent
/// fields (vocab_size 58101, d_model 1024, 12 + 12 layers, 16 heads, FFN 4096, activation gelu,
/// max_position_embeddings 1024, scale_embedding false, pad and decoder start 58100, eos 0).
/// The legacy BART fields Hugging Face's Marian ignores (normalize_before, normalize_embedding,
/// static_position_embeddings, add_bias_logits, extra_pos_embeddings, add_final_layer_norm) are
/// ignored too.
/// @throws graft::Error `<where>: field "<name>" ...` for a mistyped field, a model_type other
///         than marian, an activation_function graft lacks, share_encoder_decoder_embeddings or
///         tie_word_embeddings false, a decoder_vocab_size other than vocab_size, encoder and
///         decoder sizes that differ (decoder_ffn_dim, decoder_attention_heads), or a value out
///         of range.
HfMarianConfig hf_marian_config(const nlohmann::json& j, const std::string& where = "config.json");

/// Reads generation_config.json's fields over `f` (those it holds: forced_eos_token_id,
/// bad_words_ids, num_beams, max_length, length_penalty) for a vocabulary of `vocab` tokens.
/// @throws graft::Error `<where>: field "<name>" ...` for a mistyped field, a bad_words_ids
///         entry of more than one token, a token outside [0, vocab), num_beams < 1 or
///         max_length < 2.
void read_marian_generation(const nlohmann::json& j, HfMarianFacts& f, int64_t vocab,
                            const std::string& where = "generation_config.json");

/// An imported Marian model: the Transformer and its generation facts.
struct HfMarian {
  std::unique_ptr<Transformer> model;  ///< in eval mode, weights in the files' dtype
  HfMarianFacts hf;                    ///< forced eos, banned tokens, beams, lengths
};

/// Loads a Hugging Face Marian directory: config.json (hf_marian_config()), generation_config.json
/// when present (read_marian_generation()), and model.safetensors or its shards. Names may carry
/// the `model.` prefix or not. The shared embedding may be stored as any non-empty subset of
/// `shared.weight`, `encoder.embed_tokens.weight`, `decoder.embed_tokens.weight` and
/// `lm_head.weight`, whose values must then be equal; `final_logits_bias` (1, V) is optional
/// (zeros); `*.embed_positions.weight` (the fixed sinusoids, recomputed) and `*.version` are
/// ignored. The model gets `dtype` when given (the weights converted: a bfloat16 file widened
/// exactly, its sinusoid table computed in that dtype); otherwise a file whose float weights all
/// have one dtype (float32, bfloat16, float16) gives a model of that dtype, mixed dtypes float32.
/// Every shape is checked before the model is allocated.
/// @throws graft::Error naming the file and the tensor for a missing, unexpected, mis-shaped or
///         non-float tensor, embedding copies that differ, a dtype that is not a float one, or as
///         hf_marian_config().
HfMarian load_hf_marian(const std::string& dir, std::optional<DType> dtype = std::nullopt);

}  // namespace graft::models
