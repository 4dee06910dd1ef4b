/// @file
/// The encoder-decoder Transformer (seeds 000-004) with one shared source/target embedding tied
/// to the output projection. In formulas:
/// @code
///   X = Dropout(E[src] * sqrt(d) + PE),  H = Encoder(X)
///   Y = Dropout(E[tgt_in] * sqrt(d) + PE),  logits = Decoder(Y, H) E^T (+ b)
/// @endcode
/// The config's options scale_embedding, sinusoid_layout, logits_bias (b) and mask_target_pad
/// make it Hugging Face's MarianMTModel too (models/hf_marian.h).
/// src (B, S), tgt_in (B, T) int64 ids with pad_id for padding -> logits (B, T, V).
///
/// state_dict() names, shapes and layouts of the stacks follow nn.Transformer's state_dict
/// ("encoder.layers.0.self_attn.in_proj_weight" ...); the shared embedding is "embedding.weight"
/// and the output projection is tied to it (no separate tensor).
#pragma once

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/models/decoding.h"
#include "graft/nn/transformer.h"

namespace graft::models {

/// The columns of the sinusoid table: interleaved (PE(t, 2j) = sin, PE(t, 2j+1) = cos, graft's)
/// or halves (sin(t / 10000^(2k/d)) in the first ceil(d/2) columns, the cosines after them:
/// Hugging Face Marian's, which has no rows past max_len).
enum class SinusoidLayout { interleaved, halves };

/// The Transformer's sizes and options (its config.json "model" section): a ModelConfig (the
/// sizes every model config shares) plus two stacks and the special tokens.
struct TransformerConfig : ModelConfig {
  /// The number of encoder and decoder layers.
  ///@{
  int64_t enc_layers = 2, dec_layers = 2;
  ///@}
  bool final_norm = true;  ///< LayerNorm after each stack (nn.Transformer has it; pre-LN needs it)
  double attention_dropout = 0.0;  ///< on the attention probabilities (nn::LayerConfig)
  nn::Activation activation = nn::Activation::relu;  ///< the FFN's activation
  /// The begin-of-sequence and end-of-sequence token ids, each in [0, vocab).
  ///@{
  int64_t bos_id = 2, eos_id = 3;
  ///@}
  /// "sinusoid_layout": interleaved|halves (positions sinusoidal only).
  SinusoidLayout sinusoid_layout = SinusoidLayout::interleaved;
  bool scale_embedding = true;  ///< "scale_embedding": the embeddings times sqrt(d_model)
  /// "logits_bias": a (V) parameter "final_logits_bias" added to the logits (Marian's buffer;
  /// a parameter here so that checkpoints, which hold parameters, keep it).
  bool logits_bias = false;
  /// "mask_target_pad": target tokens equal to pad_id are masked as keys of the decoder's
  /// self-attention (false for Marian, whose decoder starts with pad).
  bool mask_target_pad = true;

  /// The field table (model_fields() plus the above; "learned_pos" of older configs is read as
  /// "positions"), which to_json(), from_json() and validate() follow.
  static const ConfigFields<TransformerConfig>& fields();
  nlohmann::json to_json() const;  ///< the fields as JSON (from_json() reads them back)
  /// num_parameters() of the model it builds, without building it.
  /// @throws graft::Error when the count overflows int64.
  int64_t parameter_count() const;
  /// Reads a config written by to_json() (older configs with "learned_pos" too), then
  /// validate()s it. Errors name the field and `where` (e.g. the file) for a missing, mistyped
  /// or out-of-range value.
  /// @throws graft::Error naming the field, as validate() for a value out of range.
  static TransformerConfig from_json(const nlohmann::json& j,
                                     const std::string& where = "TransformerConfig");
  /// Checks every range, the one check both from_json() and the Transformer's constructor make:
  /// sizes in [1, kMaxSize], enc_layers and dec_layers in [1, kMaxLayers], max_len in
  /// [1, kMaxLen], dropout and attention_dropout in [0, 1], heads dividing d_model, pad_id,
  /// bos_id and eos_id in [0, vocab), the position settings, an activation other than swiglu,
  /// sinusoid_layout halves only with sinusoidal positions.
  /// @throws graft::Error `<where>: field "<name>" ...` for the first field out of range.
  void validate(const std::string& where = "TransformerConfig") const;
  /// The LayerConfig of each encoder and decoder layer.
  nn::LayerConfig layer() const;
};

/// A config of a named size, other fields at their defaults: tiny (128, 4 heads, FFN 512, 2+2),
/// small (256, 4, 1024, 3+3), base (512, 8, 2048, 6+6), big (1024, 16, 4096, 6+6).
/// @throws graft::Error naming the known presets for an unknown name.
TransformerConfig preset(const std::string& name, int64_t vocab);

/// The encoder-decoder Transformer (see the file's description). Initialised as nn.Transformer
/// (Xavier-uniform matrices in the stacks), the shared embedding from N(0, 1/d).
class Transformer : public nn::Module {
 public:
  /// Builds the model of config c, initialised from c.seed.
  /// @throws graft::Error "Transformer: field ..." when c.validate() refuses c.
  explicit Transformer(const TransformerConfig& c);
  /// ids (B, T) at positions start.. -> (B, T, d): embedding (times sqrt(d) when
  /// scale_embedding) (+ sinusoidal/learned positions start..) + dropout.
  /// @throws graft::Error when ids is not int64 (B, T), an id is outside [0, V), or (learned
  ///         positions or the halves sinusoid layout) start + T > max_len.
  Tensor embed(const Tensor& ids, int64_t start = 0) const;
  /// src (B, S) -> memory (B, S, d), the encoder output.
  /// @throws graft::Error as embed().
  Tensor encode(const Tensor& src) const;
  /// memory (B, S, d), src (B, S), tgt_in (B, T) -> logits (B, T, V); cross_weights, when
  /// given, receives each decoder layer's cross-attention weights (B, H, T, S).
  /// @throws graft::Error when src and tgt_in differ in batch size, or as embed().
  Tensor decode(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                Tensors* cross_weights = nullptr) const;
  /// src (B, S), tgt_in (B, T) -> logits (B, T, V): decode(encode(src), src, tgt_in).
  /// @throws graft::Error as decode().
  Tensor forward(const Tensor& src, const Tensor& tgt_in) const {
    return decode(encode(src), src, tgt_in);
  }
  /// Teacher-forced training loss: cross_entropy(forward(src, tgt_in), tgt_out) with label
  /// smoothing, pad targets ignored, computed by linear_cross_entropy (the (B*T, V) logits are
  /// never held). tgt_out (B, T) int64.
  /// @throws graft::Error when tgt_out's shape differs from tgt_in's, a target is outside
  ///         [0, V), or as decode().
  Tensor loss(const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out,
              double label_smoothing = 0.0) const;
  /// The decoder output before the logits: memory (B, S, d), src (B, S), tgt_in (B, T) ->
  /// (B, T, d).
  /// @throws graft::Error as decode().
  Tensor decoder_states(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                        Tensors* cross_weights = nullptr) const;
  /// h (B, T, d) -> (B, T, V) through the tied embedding (+ final_logits_bias when logits_bias).
  Tensor logits(const Tensor& h) const;
  Tensor pad_mask(const Tensor& ids) const;  ///< (B, T) int64, 1 at pad

  TransformerConfig cfg;  ///< the config it was built from
  Generator dropout_gen;  ///< all dropout masks come from here (saved for exact resume)
  std::shared_ptr<nn::Embedding> embedding;  ///< "embedding": source, target and output projection
  /// sinusoidal/learned positions ("sin_pos" buffer / "learned_pos.weight"); identity otherwise
  std::shared_ptr<nn::EmbeddingPositions> pos;
  std::shared_ptr<nn::Dropout> dropout;  ///< on the embeddings
  std::shared_ptr<nn::Encoder> encoder;  ///< "encoder"
  std::shared_ptr<nn::Decoder> decoder;  ///< "decoder"
  /// (V) parameter "final_logits_bias" (zeros at first) when logits_bias, else undefined
  Tensor final_logits_bias;
};

/// Translates a batch of sources: src (B, S) int64 -> B id sequences.
///
/// Decoding (inference; runs under NoGrad) through models/decoding: greedy, beam search or
/// sampling as the options say. It runs in the model's current mode: call eval() first (the
/// translation program does), or dropout applies. Sources are padded with pad_id. Each output is
/// the generated ids without BOS, cut at (and excluding) EOS.
/// @throws graft::Error when src is not int64 (B, S), for bad options (check_decode_options()),
///         or (learned positions) max_len + 1 > the config's max_len.
Sequences translate(const Transformer& m, const Tensor& src, const DecodeOptions& o);

}  // namespace graft::models
