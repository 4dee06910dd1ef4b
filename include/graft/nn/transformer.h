/// @file
/// Encoder and decoder layers and stacks, in both placements of LayerNorm. Each sublayer is
/// wrapped as:
/// @code
///   post-LN (seeds 000-003, nn.Transformer's default): x = LN(x + Dropout(Sublayer(x)))
///   pre-LN  (seed 004):                                 x = x + Dropout(Sublayer(LN(x)))
/// @endcode
/// Parameter names follow nn.TransformerEncoderLayer / nn.TransformerDecoderLayer
/// (self_attn, multihead_attn, linear1, linear2, norm1..3) and the stacks' "layers.<i>" / "norm".
///
/// Shapes: B batch, S source length, T target length, d = d_model; padding masks are (B, S) or
/// (B, T), non-zero = pad. Errors come from the layers and ops inside (a wrong width or mask
/// shape is a graft::Error naming the op).
#pragma once

#include "graft/nn/attention.h"
#include "graft/nn/layers.h"

namespace graft::nn {

/// The sizes and options of one encoder or decoder layer.
struct LayerConfig {
  /// Model width, attention heads (which must divide d_model) and FFN width.
  ///@{
  int64_t d_model = 128, heads = 4, d_ff = 512;
  ///@}
  double dropout = 0.1;  ///< after each sublayer and inside the FFN
  /// Dropout on the attention probabilities. nn.Transformer passes its one dropout rate to its
  /// attention too; graft keeps it separate (default 0, as before this option existed).
  double attention_dropout = 0.0;
  Activation activation = Activation::relu;  ///< the FFN's activation
  bool norm_first = false;                   ///< false: post-LN, true: pre-LN
  double eps = 1e-5;                         ///< of every LayerNorm
  DType dtype = DType::f32;                  ///< of every parameter
  /// The Llama-style options of the encoder layers and stacks (the decoder layers ignore them):
  /// RMSNorm instead of LayerNorm (norm1, norm2 and the final norm), grouped-query attention
  /// with kv_heads key/value heads (0: heads), and no biases in the linears when bias is false.
  /// The swiglu activation adds "linear3" (d -> d_ff).
  ///@{
  bool rms_norm = false;
  int64_t kv_heads = 0;
  bool bias = true;
  ///@}
};
/// A LayerConfig from its common fields (attention_dropout 0, eps 1e-5).
LayerConfig layer_config(int64_t d_model, int64_t heads, int64_t d_ff, double dropout,
                         bool norm_first, DType dtype, Activation activation = Activation::relu);

/// Parameter count of an Encoder from the sizes alone.
///
/// Parameter counts from the sizes alone, before anything is allocated, so a config can be
/// checked against memory and against its weights file first (equal to num_parameters() of the
/// built stack; tested). Errors on int64 overflow.
/// @throws graft::Error "parameter count: the count overflows int64".
int64_t encoder_parameters(const LayerConfig& c, int64_t layers, bool final_norm,
                           const PositionOptions& pos);
/// Parameter count of a Decoder from the sizes alone (see encoder_parameters()).
/// @throws graft::Error "parameter count: the count overflows int64".
int64_t decoder_parameters(const LayerConfig& c, int64_t layers, bool final_norm,
                           const PositionOptions& pos);

/// One encoder layer: self-attention and the FFN, each with dropout and a residual, in the
/// LayerNorm placement of cfg.norm_first.
class EncoderLayer : public Module {
 public:
  /// A layer of config c, parameters drawn from gen, dropout masks from *dropout_gen (null:
  /// the global generator).
  /// @throws graft::Error when heads does not divide d_model or attention_dropout is outside
  ///         [0, 1].
  EncoderLayer(const LayerConfig& c, Generator& gen, Generator* dropout_gen);
  /// x (B, S, d) -> (B, S, d); src_pad (B, S) non-zero = pad (or undefined); causal for
  /// decoder-only stacks.
  /// pos: the stack's rope/alibi/relative terms for self-attention, or null
  Tensor forward(const Tensor& x, const Tensor& src_pad, bool causal = false,
                 const AttentionPositions* pos = nullptr) const;
  /// New positions of a causal (decoder-only) stack with cached keys/values (inference only):
  /// x (B, T, d) -> (B, T, d).
  /// @throws graft::Error when the cache would overflow `capacity`.
  Tensor forward_step(const Tensor& x, KVCache& cache, int64_t capacity,
                      const AttentionPositions* pos = nullptr) const;
  std::shared_ptr<MultiHeadAttention> self_attn;  ///< "self_attn"
  /// The FFN's layers "linear1" (d -> d_ff) and "linear2" (d_ff -> d), and with swiglu the gate
  /// "linear3" (d -> d_ff; null otherwise).
  ///@{
  std::shared_ptr<Linear> linear1, linear2, linear3;
  ///@}
  /// "norm1" (around self-attention) and "norm2" (around the FFN); RMSNorms with cfg.rms_norm.
  ///@{
  std::shared_ptr<LayerNorm> norm1, norm2;
  ///@}
  /// "dropout" (inside the FFN), "dropout1" and "dropout2" (after each sublayer).
  ///@{
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  ///@}
  LayerConfig cfg;  ///< the config it was built from

 private:
  Tensor ffn(const Tensor& x) const;
  template <class SelfAttn>
  Tensor block(const Tensor& x, SelfAttn&& sa) const;
};

/// Caches of one decoder layer during incremental decoding.
struct DecoderLayerCache {
  /// The self-attention cache (grows a step at a time) and the cross-attention cache (filled
  /// once from the encoder output).
  ///@{
  KVCache self, cross;
  ///@}
};

/// One decoder layer: causal self-attention, cross-attention to the encoder output, and the
/// FFN, each with dropout and a residual, in the LayerNorm placement of cfg.norm_first.
class DecoderLayer : public Module {
 public:
  /// A layer of config c, parameters drawn from gen, dropout masks from *dropout_gen (null:
  /// the global generator).
  /// @throws graft::Error when heads does not divide d_model or attention_dropout is outside
  ///         [0, 1].
  DecoderLayer(const LayerConfig& c, Generator& gen, Generator* dropout_gen);
  /// y (B, T, d) target side, memory (B, S, d) -> (B, T, d); causal self-attention; tgt_pad
  /// (B, T) and src_pad (B, S) or undefined; cross_weights (optional)
  /// receives the cross-attention weights (B, H, T, S).
  Tensor forward(const Tensor& y, const Tensor& memory, const Tensor& tgt_pad,
                 const Tensor& src_pad, Tensor* cross_weights = nullptr,
                 const AttentionPositions* pos = nullptr) const;
  /// One or more new target positions with cached keys/values (inference only):
  /// y (B, T, d) -> (B, T, d); the cross cache is filled from memory on the first call. With
  /// group G > 1, memory and src_pad have B / G rows, y's rows g G .. g G + G - 1 belong to
  /// memory row g (MultiHeadAttention::forward_cross_cached) and T is 1.
  /// @throws graft::Error when the self-attention cache would overflow `capacity`.
  Tensor forward_step(const Tensor& y, const Tensor& memory, const Tensor& src_pad,
                      DecoderLayerCache& cache, int64_t capacity, Tensor* cross_weights = nullptr,
                      const AttentionPositions* pos = nullptr, int64_t group = 1) const;
  /// "self_attn" (causal, over the target) and "multihead_attn" (cross, over the memory).
  ///@{
  std::shared_ptr<MultiHeadAttention> self_attn, multihead_attn;
  ///@}
  /// The FFN's layers "linear1" (d -> d_ff) and "linear2" (d_ff -> d).
  ///@{
  std::shared_ptr<Linear> linear1, linear2;
  ///@}
  /// "norm1", "norm2" and "norm3", one around each sublayer.
  ///@{
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
  ///@}
  /// "dropout" (inside the FFN), "dropout1" to "dropout3" (after each sublayer).
  ///@{
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;
  ///@}
  LayerConfig cfg;  ///< the config it was built from

 private:
  Tensor ffn(const Tensor& x) const;
  template <class SelfAttn, class CrossAttn>
  Tensor block(const Tensor& y, SelfAttn&& sa, CrossAttn&& ca) const;
};

/// A stack of EncoderLayers with an optional final LayerNorm.
///
/// A stack owns its rope/alibi/relative module (shared by its layers); a relative bias table is
/// registered as "relative_attention_bias" (T5's name), so it is saved as
/// "<stack>.relative_attention_bias.weight" (buckets, heads).
class Encoder : public Module {
 public:
  /// num_layers layers of config c, a final LayerNorm when final_norm, positional terms `pos`.
  /// causal: a decoder-only stack (its relative/alibi terms are then unidirectional)
  /// @throws graft::Error for a bad layer config or bad relative settings.
  Encoder(const LayerConfig& c, int64_t num_layers, bool final_norm, Generator& gen,
          Generator* dropout_gen, const PositionOptions& pos = {}, bool causal = false);
  /// x (B, S, d) -> (B, S, d); src_pad (B, S) or undefined; self-attention is causal when the
  /// stack was built causal (the constructor's `causal`, the one place it is said).
  Tensor forward(const Tensor& x, const Tensor& src_pad) const;
  /// Whether self-attention is causal (a decoder-only stack).
  bool causal() const { return causal_; }
  /// A causal stack, new positions only, one cache per layer (inference only):
  /// x (B, T, d) -> (B, T, d); `caches` is resized to the number of layers.
  /// @throws graft::Error when the stack has positional terms built bidirectional, or a cache
  ///         would overflow `capacity`.
  Tensor forward_step(const Tensor& x, std::vector<KVCache>& caches, int64_t capacity) const;
  std::vector<std::shared_ptr<EncoderLayer>> layers;  ///< "layers.<i>"
  std::shared_ptr<LayerNorm> norm;                    ///< null when there is no final LayerNorm
  std::shared_ptr<AttentionPositions> positions;      ///< null for sinusoidal/learned

 private:
  bool causal_;  // causal self-attention (and positional terms built for it)
};

/// A decoder-only (language model) stack: the encoder's blocks with causal self-attention, and
/// its positional terms unidirectional. Always has a final LayerNorm.
class CausalStack : public Encoder {
 public:
  /// num_layers layers of config c with a final LayerNorm, causal positional terms `pos`.
  CausalStack(const LayerConfig& c, int64_t num_layers, Generator& gen, Generator* dropout_gen,
              const PositionOptions& pos = {})
      : Encoder(c, num_layers, /*final_norm=*/true, gen, dropout_gen, pos, /*causal=*/true) {}
};

/// A stack of DecoderLayers with an optional final LayerNorm; owns its rope/alibi/relative
/// module like Encoder.
class Decoder : public Module {
 public:
  /// num_layers layers of config c, a final LayerNorm when final_norm, positional terms `pos`
  /// (causal).
  /// @throws graft::Error for a bad layer config or bad relative settings.
  Decoder(const LayerConfig& c, int64_t num_layers, bool final_norm, Generator& gen,
          Generator* dropout_gen, const PositionOptions& pos = {});
  /// y (B, T, d), memory (B, S, d) -> (B, T, d); tgt_pad (B, T), src_pad (B, S) or undefined.
  /// cross_weights, when given, receives one (B, H, T, S) tensor per layer.
  Tensor forward(const Tensor& y, const Tensor& memory, const Tensor& tgt_pad,
                 const Tensor& src_pad, Tensors* cross_weights = nullptr) const;
  /// New target positions with one cache per layer (inference only): y (B, T, d) -> (B, T, d);
  /// `caches` is resized to the number of layers; cross_weights as in forward(); group as in
  /// DecoderLayer::forward_step().
  /// @throws graft::Error when a cache would overflow `capacity`.
  Tensor forward_step(const Tensor& y, const Tensor& memory, const Tensor& src_pad,
                      std::vector<DecoderLayerCache>& caches, int64_t capacity,
                      Tensors* cross_weights = nullptr, int64_t group = 1) const;
  std::vector<std::shared_ptr<DecoderLayer>> layers;  ///< "layers.<i>"
  std::shared_ptr<LayerNorm> norm;                    ///< null when there is no final LayerNorm
  std::shared_ptr<AttentionPositions> positions;      ///< null for sinusoidal/learned
};

}  // namespace graft::nn
