/// @file
/// Decoder-only language model (GPT-style, pre-LN by default): a causal self-attention block
/// stack (nn::CausalStack), a final LayerNorm and logits through the tied embedding. The
/// config's Llama-style fields give RMSNorm, a SwiGLU FFN, grouped-query attention, no biases
/// and an untied output (with rope positions: a Llama-style model).
/// ids (B, T) int64 -> logits (B, T, V); train with cross_entropy on ids shifted by one.
#pragma once

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/models/decoding.h"
#include "graft/nn/transformer.h"

namespace graft::models {

/// The LM's config: a StackConfig with learned positions and pre-LN by default.
struct LMConfig : StackConfig {
  /// The defaults of StackConfig, but learned positions and pre-LN.
  LMConfig() {
    positions.kind = nn::Positions::learned;
    norm_first = true;
  }
  /// Multiply the token embeddings by sqrt(d_model) before the positions are added, as the
  /// original Transformer does, so that sinusoidal positions (values in [-1, 1]) do not drown
  /// the tokens (the lm program sets it for sinusoidal positions). A config file without the
  /// field reads as false, which is what runs made before it did.
  bool scale_embedding = false;
  /// The Llama-style options (each absent from an older config file, which reads as the GPT
  /// defaults): "rms_norm" (RMSNorm instead of LayerNorm; older files say "norm": "rmsnorm"),
  /// "activation" relu|gelu|gelu_tanh|swiglu (older files: "ffn"), "kv_heads" (grouped-query
  /// attention; 0 = heads, else dividing heads), "bias" in every linear and LayerNorm, and
  /// "tied_output" (logits through the embedding, else through an "output" (V, d) linear).
  ///@{
  bool rms_norm = false;
  nn::Activation activation = nn::Activation::relu;
  int64_t kv_heads = 0;
  bool bias = true;
  bool tied_output = true;
  ///@}
  /// "eps" of every LayerNorm/RMSNorm (an imported Llama's rms_norm_eps); absent: 1e-5.
  double eps = 1e-5;
  /// "mask_pad": forward() masks the keys whose id is pad_id. Hugging Face decoders mask
  /// nothing without an attention mask, so an imported model sets it false; absent: true.
  /// Without it, pad_id is not special at all: its embedding row trains like any other.
  bool mask_pad = true;
  /// The field table (stack_fields() plus the above), which to_json(), from_json() and
  /// validate() follow.
  static const ConfigFields<LMConfig>& fields();
  /// The fields as JSON (from_json() reads them back).
  nlohmann::json to_json() const;
  /// num_parameters() of the model it builds, without building it.
  /// @throws graft::Error when the count overflows int64.
  int64_t parameter_count() const;
  /// StackConfig::layer() with the Llama-style options above.
  nn::LayerConfig layer() const;
  /// Reads a config written by to_json(), then validate()s it.
  /// Errors name the field (and `where`, e.g. the file) for a missing, mistyped or out-of-range
  /// value.
  /// @throws graft::Error as read_fields() and validate().
  static LMConfig from_json(const nlohmann::json& j, const std::string& where = "LMConfig");
  /// Checks every range (stack_fields()', and kv_heads in [0, heads] dividing heads), the one
  /// check both from_json() and DecoderOnlyLM's constructor make.
  /// @throws graft::Error `<where>: field "<name>" ...` for the first field out of range.
  void validate(const std::string& where = "LMConfig") const;
};

/// The decoder-only language model (see the file's description). Parameters: "embedding.weight"
/// (V, d), "pos.weight" (learned positions), "blocks.layers.<i>.*", "blocks.norm.*".
class DecoderOnlyLM : public nn::Module {
 public:
  /// Builds the model of config c, initialised from c.seed (embedding N(0, 0.02^2)).
  /// @throws graft::Error "DecoderOnlyLM: field ..." when c.validate() refuses c.
  explicit DecoderOnlyLM(const LMConfig& c);
  /// ids (B, T) int64 -> logits (B, T, V); ids equal to pad_id are masked as keys (with
  /// cfg.mask_pad).
  /// @throws graft::Error when ids is not int64 (B, T), an id is outside [0, V), or (learned
  ///         positions) T > max_len.
  Tensor forward(const Tensor& ids) const;
  /// ids (B, T) at positions start.. -> (B, T, d): embedding + positions + dropout.
  /// @throws graft::Error as forward().
  Tensor embed(const Tensor& ids, int64_t start = 0) const;
  /// h (B, T, d) -> logits (B, T, V) through the tied embedding (or the output linear).
  Tensor logits(const Tensor& h) const;
  LMConfig cfg;           ///< the config it was built from
  Generator dropout_gen;  ///< all dropout masks come from here (saved for exact resume)
  std::shared_ptr<nn::Embedding> embedding;     ///< "embedding": tokens in, logits out (tied)
  std::shared_ptr<nn::EmbeddingPositions> pos;  ///< "pos.weight" when learned
  std::shared_ptr<nn::Dropout> dropout;         ///< on the embeddings
  std::shared_ptr<nn::CausalStack> blocks;  ///< with the final LayerNorm (and rope/alibi/relative)
  std::shared_ptr<nn::Linear> output;       ///< "output" (V, d) without bias; null when tied_output
};

/// Continues each prompt (rows of equal length, no padding) by up to o.max_len tokens: greedy,
/// beam or sampling as the options say, through models/decoding with a KV cache (or, with
/// o.use_cache false, re-running the whole prefix). Stops a row at eos (eos < 0: never). Each
/// result is the generated tokens only. Runs under NoGrad with the model in eval mode (its
/// mode is restored afterwards).
/// @throws graft::Error for bad options, no prompt or an empty one, prompts of different
///         lengths, an id outside the vocabulary, or (learned positions) prompt + max_len
///         beyond the config's max_len.
Sequences generate(DecoderOnlyLM& lm, const std::vector<std::vector<int64_t>>& prompts, int64_t eos,
                   const DecodeOptions& o);

}  // namespace graft::models
