/// @file
/// Hugging Face causal LM checkpoints (Llama, Mistral, Qwen2) imported into graft's own
/// DecoderOnlyLM: config.json plus model.safetensors, or shards listed by
/// model.safetensors.index.json. What is supported and what is refused (naming the field) is in
/// docs/hub-models.md, "Llama-family checkpoints".
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "graft/models/decoder_only_lm.h"
#include "graft/ops/precision.h"

namespace graft::models {

/// The facts of a Hugging Face config.json a DecoderOnlyLM does not hold.
struct HfLMFacts {
  std::string model_type;        ///< "llama", "mistral" or "qwen2"
  std::vector<int64_t> eos_ids;  ///< eos_token_id (one id or a list; empty when null)
  int64_t bos_id = -1;           ///< bos_token_id (-1 when absent or null)
  bool attention_bias = false;   ///< q/k/v/o biases (Llama/Mistral attention_bias)
  bool qkv_bias = false;         ///< q/k/v biases without an o_proj bias (Qwen2)
  bool mlp_bias = false;         ///< gate/up/down biases (Llama mlp_bias)
  /// max_position_embeddings (the family's default when absent); the LM's max_len is this up
  /// to graft's limit of 65536 positions (kMaxLen).
  int64_t max_positions = 0;
};

/// A config.json read into the LMConfig it needs (RMSNorm, SwiGLU, rope, grouped-query
/// attention, no pad masking) and the facts the LM does not keep.
struct HfLMConfig {
  LMConfig lm;   ///< the model's config (dtype float32: load_hf_causal_lm() sets the files')
  HfLMFacts hf;  ///< eos/bos ids and the bias layout
};

/// Reads a Hugging Face config.json of model_type llama, mistral or qwen2 (transformers 4.x
/// `rope_theta`/`rope_scaling` and 5.x `rope_parameters` forms).
/// @throws graft::Error `<where>: field "<name>" ...` for a missing or mistyped field, an unknown
///         model_type or hidden_act, a rope type other than default (`rope_scaling.rope_type`),
///         a head_dim other than hidden_size / num_attention_heads, or an active sliding window
///         (`sliding_window`, `use_sliding_window`).
HfLMConfig hf_lm_config(const nlohmann::json& j, const std::string& where = "config.json");

/// An imported causal LM: the model and its config facts.
struct HfCausalLM {
  std::unique_ptr<DecoderOnlyLM> model;  ///< in eval mode, weights in the files' dtype
  HfLMFacts hf;                          ///< eos/bos ids and the bias layout
};

/// Loads a Hugging Face causal LM directory: config.json (hf_lm_config()) and model.safetensors
/// or model.safetensors.index.json with its shards. The names may carry the `model.` prefix or
/// not; `lm_head.weight` is absent (or ignored) when tie_word_embeddings, and
/// `*.rotary_emb.inv_freq` buffers are ignored. A file whose float weights all have one dtype
/// (float32, bfloat16, float16) gives a model of that dtype; mixed dtypes give float32.
/// Every shape is checked against the config before the model is allocated.
/// @throws graft::Error naming the file and the tensor for a missing, unexpected, mis-shaped or
///         non-float tensor, a shard the index names that is missing, or as hf_lm_config().
HfCausalLM load_hf_causal_lm(const std::string& dir);
/// load_hf_causal_lm(dir) made ready for inference at `precision` (keep_for_inference). fp32 and
/// bf16: the model loaded in the files' dtype, converted (fp32: to float32; bf16: a float32 file
/// to bf16) and kept. int8: the float32 model is never held: parameters are read one at a time
/// (in float32), each linear weight and the embedding table quantized as it arrives
/// (quantize_weight_int8_from), so loading peaks near the int8 model plus one float32 tensor.
/// Run it under PrecisionGuard(precision).
/// @throws graft::Error as load_hf_causal_lm(dir), or keep_for_inference's errors.
HfCausalLM load_hf_causal_lm(const std::string& dir, Precision precision);

}  // namespace graft::models
