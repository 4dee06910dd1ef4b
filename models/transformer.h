// The encoder-decoder Transformer (seeds 000-004) with one shared source/target embedding tied
// to the output projection:
//   X = Dropout(E[src] * sqrt(d) + PE),  H = Encoder(X)
//   Y = Dropout(E[tgt_in] * sqrt(d) + PE),  logits = Decoder(Y, H) E^T
// src (B, S), tgt_in (B, T) int64 ids with pad_id for padding -> logits (B, T, V).
#pragma once

#include <nlohmann/json.hpp>

#include "graft/models/decoding.h"
#include "graft/nn/transformer.h"

namespace graft::models {

struct TransformerConfig {
  int64_t vocab = 1000, d_model = 128, heads = 4, d_ff = 512, enc_layers = 2, dec_layers = 2;
  int64_t max_len = 256;
  double dropout = 0.1;
  bool norm_first = false;  // post-LN (false) or pre-LN (true)
  bool final_norm = true;   // LayerNorm after each stack (nn.Transformer has it; pre-LN needs it)
  nn::PositionOptions positions;  // kind (sinusoidal, learned, rope, alibi, relative) + settings
  double attention_dropout = 0.0;  // on the attention probabilities (nn::LayerConfig)
  nn::Activation activation = nn::Activation::relu;
  int64_t pad_id = 0, bos_id = 2, eos_id = 3;
  DType dtype = DType::f32;
  uint64_t seed = 1;

  nlohmann::json to_json() const;
  int64_t parameter_count() const;  // num_parameters() of the model it builds, without building it
  // Errors name the field and `where` (e.g. the file) for a missing, mistyped or out-of-range value.
  static TransformerConfig from_json(const nlohmann::json& j, const std::string& where = "TransformerConfig");
  nn::LayerConfig layer() const;
};

// tiny (128, 4 heads, FFN 512, 2+2), small (256, 4, 1024, 3+3), base (512, 8, 2048, 6+6),
// big (1024, 16, 4096, 6+6). Throws naming the known presets for an unknown name.
TransformerConfig preset(const std::string& name, int64_t vocab);

class Transformer : public nn::Module {
 public:
  explicit Transformer(const TransformerConfig& c);
  // scaled embedding (+ sinusoidal/learned positions start..) + dropout
  Tensor embed(const Tensor& ids, int64_t start = 0) const;
  Tensor encode(const Tensor& src) const;                    // (B, S, d)
  Tensor decode(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                Tensors* cross_weights = nullptr) const;      // logits (B, T, V)
  Tensor forward(const Tensor& src, const Tensor& tgt_in) const { return decode(encode(src), src, tgt_in); }
  // Teacher-forced training loss: cross_entropy(forward(src, tgt_in), tgt_out) with label
  // smoothing, pad targets ignored, computed by linear_cross_entropy (the (B*T, V) logits are
  // never held). tgt_out (B, T) int64.
  Tensor loss(const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out,
              double label_smoothing = 0.0) const;
  Tensor decoder_states(const Tensor& memory, const Tensor& src, const Tensor& tgt_in,
                        Tensors* cross_weights = nullptr) const;  // (B, T, d), before logits
  Tensor logits(const Tensor& h) const;  // h (B, T, d) -> (B, T, V) through the tied embedding
  Tensor pad_mask(const Tensor& ids) const;  // (B, T) int64, 1 at pad

  TransformerConfig cfg;
  Generator dropout_gen;  // all dropout masks come from here (saved for exact resume)
  std::shared_ptr<nn::Embedding> embedding;
  // sinusoidal/learned positions ("sin_pos" buffer / "learned_pos.weight"); identity otherwise
  std::shared_ptr<nn::EmbeddingPositions> pos;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Encoder> encoder;
  std::shared_ptr<nn::Decoder> decoder;
};

// state_dict() names, shapes and layouts of the stacks follow nn.Transformer's state_dict
// ("encoder.layers.0.self_attn.in_proj_weight" ...); the shared embedding is "embedding.weight"
// and the output projection is tied to it (no separate tensor).

// Decoding (inference; runs under NoGrad) through models/decoding: greedy, beam search or
// sampling as the options say. It runs in the model's current mode: call eval() first (the
// translation program does), or dropout applies. Sources are padded with pad_id. Each output is the generated ids
// without BOS, cut at (and excluding) EOS.
Sequences translate(const Transformer& m, const Tensor& src, const DecodeOptions& o);
Sequences greedy_decode(const Transformer& m, const Tensor& src, const DecodeOptions& o);  // beam 1
Sequences beam_search(const Transformer& m, const Tensor& src, const DecodeOptions& o);

}  // namespace graft::models
