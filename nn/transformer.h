// Encoder and decoder layers and stacks, in both placements of LayerNorm:
//   post-LN (seeds 000-003, nn.Transformer's default): x = LN(x + Dropout(Sublayer(x)))
//   pre-LN  (seed 004):                                 x = x + Dropout(Sublayer(LN(x)))
// Parameter names follow nn.TransformerEncoderLayer / nn.TransformerDecoderLayer
// (self_attn, multihead_attn, linear1, linear2, norm1..3) and the stacks' "layers.<i>" / "norm".
#pragma once

#include "graft/nn/attention.h"
#include "graft/nn/layers.h"

namespace graft::nn {

struct LayerConfig {
  int64_t d_model = 128, heads = 4, d_ff = 512;
  double dropout = 0.1;
  // Dropout on the attention probabilities. nn.Transformer passes its one dropout rate to its
  // attention too; graft keeps it separate (default 0, as before this option existed).
  double attention_dropout = 0.0;
  Activation activation = Activation::relu;
  bool norm_first = false;  // false: post-LN, true: pre-LN
  double eps = 1e-5;
  DType dtype = DType::f32;
};
LayerConfig layer_config(int64_t d_model, int64_t heads, int64_t d_ff, double dropout,
                         bool norm_first, DType dtype,
                         Activation activation = Activation::relu);

// Parameter counts from the sizes alone, before anything is allocated, so a config can be
// checked against memory and against its weights file first (equal to num_parameters() of the
// built stack; tested). Errors on int64 overflow.
int64_t encoder_parameters(const LayerConfig& c, int64_t layers, bool final_norm, const PositionOptions& pos);
int64_t decoder_parameters(const LayerConfig& c, int64_t layers, bool final_norm, const PositionOptions& pos);

class EncoderLayer : public Module {
 public:
  EncoderLayer(const LayerConfig& c, Generator& gen, Generator* dropout_gen);
  // x (B, S, d); src_pad (B, S) non-zero = pad; causal for decoder-only stacks
  // pos: the stack's rope/alibi/relative terms for self-attention, or null
  Tensor forward(const Tensor& x, const Tensor& src_pad, bool causal = false,
                 const AttentionPositions* pos = nullptr) const;
  // New positions of a causal (decoder-only) stack with cached keys/values (inference only).
  Tensor forward_step(const Tensor& x, KVCache& cache, int64_t capacity,
                      const AttentionPositions* pos = nullptr) const;
  std::shared_ptr<MultiHeadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  LayerConfig cfg;

 private:
  Tensor ffn(const Tensor& x) const;
  template <class SelfAttn>
  Tensor block(const Tensor& x, SelfAttn&& sa) const;
};

// Caches of one decoder layer during incremental decoding.
struct DecoderLayerCache {
  KVCache self, cross;
};

class DecoderLayer : public Module {
 public:
  DecoderLayer(const LayerConfig& c, Generator& gen, Generator* dropout_gen);
  // y (B, T, d) target side, memory (B, S, d); causal self-attention; cross_weights (optional)
  // receives the cross-attention weights (B, H, T, S).
  Tensor forward(const Tensor& y, const Tensor& memory, const Tensor& tgt_pad,
                 const Tensor& src_pad, Tensor* cross_weights = nullptr,
                 const AttentionPositions* pos = nullptr) const;
  // One or more new target positions with cached keys/values (inference only).
  Tensor forward_step(const Tensor& y, const Tensor& memory, const Tensor& src_pad,
                      DecoderLayerCache& cache, int64_t capacity, Tensor* cross_weights = nullptr,
                      const AttentionPositions* pos = nullptr) const;
  std::shared_ptr<MultiHeadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;
  LayerConfig cfg;

 private:
  Tensor ffn(const Tensor& x) const;
  template <class SelfAttn, class CrossAttn>
  Tensor block(const Tensor& y, SelfAttn&& sa, CrossAttn&& ca) const;
};

// A stack owns its rope/alibi/relative module (shared by its layers); a relative bias table is
// registered as "relative_attention_bias" (T5's name), so it is saved as
// "<stack>.relative_attention_bias.weight" (buckets, heads).
class Encoder : public Module {
 public:
  // causal: a decoder-only stack (its relative/alibi terms are then unidirectional)
  Encoder(const LayerConfig& c, int64_t num_layers, bool final_norm, Generator& gen,
          Generator* dropout_gen, const PositionOptions& pos = {}, bool causal = false);
  Tensor forward(const Tensor& x, const Tensor& src_pad, bool causal = false) const;
  // A causal stack, new positions only, one cache per layer (inference only).
  Tensor forward_step(const Tensor& x, std::vector<KVCache>& caches, int64_t capacity) const;
  std::vector<std::shared_ptr<EncoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;  // null when there is no final LayerNorm
  std::shared_ptr<AttentionPositions> positions;  // null for sinusoidal/learned

 private:
  bool causal_;  // what the positional terms were built for
};

// A decoder-only (language model) stack: the encoder's blocks with causal self-attention, and
// its positional terms unidirectional.
class CausalStack : public Encoder {
 public:
  CausalStack(const LayerConfig& c, int64_t num_layers, Generator& gen, Generator* dropout_gen,
              const PositionOptions& pos = {})
      : Encoder(c, num_layers, /*final_norm=*/true, gen, dropout_gen, pos, /*causal=*/true) {}
  Tensor forward(const Tensor& x, const Tensor& pad) const { return Encoder::forward(x, pad, true); }
};

class Decoder : public Module {
 public:
  Decoder(const LayerConfig& c, int64_t num_layers, bool final_norm, Generator& gen,
          Generator* dropout_gen, const PositionOptions& pos = {});
  Tensor forward(const Tensor& y, const Tensor& memory, const Tensor& tgt_pad,
                 const Tensor& src_pad, Tensors* cross_weights = nullptr) const;
  Tensor forward_step(const Tensor& y, const Tensor& memory, const Tensor& src_pad,
                      std::vector<DecoderLayerCache>& caches, int64_t capacity,
                      Tensors* cross_weights = nullptr) const;
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<AttentionPositions> positions;  // null for sinusoidal/learned
};

}  // namespace graft::nn
