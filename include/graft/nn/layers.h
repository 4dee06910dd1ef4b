/// @file
/// Basic layers. Shapes: B batch, T time, C/d model width.
#pragma once

#include "graft/nn/module.h"

namespace graft::nn {

/// y = x W^T + b; weight (out, in), bias (out). PyTorch's default init: U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  /// A layer of `in` inputs and `out` outputs, with a bias unless `bias` is false.
  Linear(int64_t in, int64_t out, bool bias = true, DType dt = DType::f32,
         Generator& gen = default_generator());
  /// x (..., in) -> y (..., out).
  /// @throws graft::Error when x's last dim is not `in` or its dtype differs (see linear()).
  Tensor forward(const Tensor& x) const;
  /// The parameters "weight" (out, in) and "bias" (out; undefined without a bias).
  ///@{
  Tensor weight, bias;
  ///@}
};

/// Lookup table (V, C); rows of padding_idx start at zero and receive no gradient.
class Embedding : public Module {
 public:
  /// A table of `vocab` rows of width `dim`, drawn from N(0, init_std^2) (padding row zero);
  /// padding_idx < 0: none.
  /// @throws graft::Error when padding_idx >= vocab.
  Embedding(int64_t vocab, int64_t dim, int64_t padding_idx = -1, DType dt = DType::f32,
            Generator& gen = default_generator(), double init_std = 1.0);
  /// ids int64 (...) -> (..., C).
  /// @throws graft::Error when ids is not int64 or an id is outside [0, V) (see embedding()).
  Tensor forward(const Tensor& ids) const;
  Tensor weight;        ///< the parameter "weight" (V, C)
  int64_t padding_idx;  ///< the row that gets no gradient, or < 0 for none
};

/// Layer normalisation over the last dim with a learned scale and shift (see layer_norm());
/// weight starts at ones, bias at zeros. RMSNorm derives from it (same slot in the blocks).
class LayerNorm : public Module {
 public:
  /// Normalises the last dim of size `dim`.
  explicit LayerNorm(int64_t dim, double eps = 1e-5, DType dt = DType::f32);
  /// x (..., dim) -> y (..., dim).
  /// @throws graft::Error when x's last dim is not `dim` or its dtype differs, or eps < 0.
  Tensor forward(const Tensor& x) const;
  /// forward(x + r) as one op (add_layer_norm(): the residual add of a post-LN block fused in;
  /// RMSNorm adds, then normalises).
  /// @throws graft::Error as forward(), and when r differs from x in shape or dtype.
  Tensor forward_add(const Tensor& x, const Tensor& r) const;
  /// The parameters "weight" and "bias", both (dim); RMSNorm has no bias (undefined).
  ///@{
  Tensor weight, bias;
  ///@}
  double eps;        ///< added to the variance (RMSNorm: to the mean square)
  bool rms = false;  ///< true for an RMSNorm: rms_norm() instead of layer_norm()

 protected:
  /// RMSNorm's: a weight of ones, no bias.
  LayerNorm(int64_t dim, double eps, DType dt, bool rms_norm);
};

/// RMS normalisation over the last dim with a learned scale (see rms_norm(); Llama's RMSNorm):
/// "weight" (dim) starts at ones; no bias, no mean subtracted.
class RMSNorm : public LayerNorm {
 public:
  /// Normalises the last dim of size `dim`; eps is added to the mean square.
  explicit RMSNorm(int64_t dim, double eps = 1e-6, DType dt = DType::f32)
      : LayerNorm(dim, eps, dt, true) {}
};

/// Dropout (see dropout()) while training, the identity in eval mode.
/// Draws its masks from the given generator (default: the global one), so a seeded run repeats.
class Dropout : public Module {
 public:
  /// Drops with probability `p`, masks from *gen (null: default_generator()).
  /// @throws graft::Error when p is outside [0, 1] (is_dropout_p).
  explicit Dropout(double p, Generator* gen = nullptr);
  /// x (...) -> (...); x itself in eval mode or when p is 0.
  /// @throws graft::Error when training and p is outside [0, 1] or x is not float.
  Tensor forward(const Tensor& x) const;
  Generator& generator() const;  ///< the one given, else default_generator()
  double p;                      ///< the drop probability (checked again when forward() drops)

 private:
  Generator* gen_;
};

/// The FFN's activation: gelu is the erf form, gelu_tanh the tanh approximation (GPT-2's and some
/// BERT checkpoints' "gelu_new"); swiglu is the gated FFN of Llama (a third projection, see
/// feed_forward()); silu is x * sigmoid(x), not gated (Marian's "swish").
enum class Activation { relu, gelu, swiglu, gelu_tanh, silu };
/// The activation's name in configs: "relu", "gelu", "swiglu", "gelu_tanh", "silu".
const char* activation_name(Activation a);
/// The activation named `name` (activation_name()'s inverse), or false when there is none.
bool activation_from_name(const std::string& name, Activation& out);

/// Position-wise FFN: linear2(dropout(act(linear1(x)))). The encoder/decoder layers hold their
/// linear1/linear2 directly (nn.Transformer's names) and call this function.
/// x (..., d) -> (..., d). With relu, the activation and dropout run as one relu_dropout op;
/// gelu is the erf form, gelu_tanh the tanh form, silu x * sigmoid(x). swiglu:
/// linear2(dropout(silu(linear1(x)) * linear3(x))) (Llama's w2(silu(w1 x) * w3 x)), linear3 (d ->
/// d_ff) given as `gate`.
/// @throws graft::Error when act is swiglu and gate is null, or as the linears do.
Tensor feed_forward(const Linear& linear1, const Dropout& dropout, const Linear& linear2,
                    Activation act, const Tensor& x, const Linear* gate = nullptr);

/// Rows start .. start + n - 1 of the sinusoidal table below, (n, d).
Tensor sinusoid_table(int64_t start, int64_t n, int64_t d, DType dt);
/// x (B, T, d) + rows start .. start + T - 1 of table (max_len, d); rows past max_len are computed
/// when sinusoidal, an error naming max_len otherwise.
/// @throws graft::Error when x is not 3-D, start < 0, or (learned) start + T > max_len.
Tensor add_positions(const Tensor& x, const Tensor& table, int64_t start, bool sinusoidal);

/// PE(i, 2j) = sin(i / 10000^(2j/d)), PE(i, 2j+1) = cos(i / 10000^(2j/d)) (seeds 000/001).
/// forward(x, start) adds rows start .. start+T-1 to x (B, T, d); rows past max_len are computed.
class SinusoidalPositionalEncoding : public Module {
 public:
  /// Precomputes the first max_len rows of width d.
  SinusoidalPositionalEncoding(int64_t max_len, int64_t d, DType dt = DType::f32);
  /// x (B, T, d) -> x + rows start .. start + T - 1.
  /// @throws graft::Error when x is not 3-D or start < 0.
  Tensor forward(const Tensor& x, int64_t start = 0) const;
  Tensor table;  ///< (max_len, d) buffer
};

/// A learned (max_len, d) table of positions added to the embeddings, drawn from N(0, 0.02^2).
class LearnedPositionalEncoding : public Module {
 public:
  /// A table for positions 0 .. max_len - 1 of width d.
  LearnedPositionalEncoding(int64_t max_len, int64_t d, DType dt = DType::f32,
                            Generator& gen = default_generator());
  /// x (B, T, d) -> x + rows start .. start + T - 1.
  /// @throws graft::Error when x is not 3-D, start < 0 or start + T > max_len.
  Tensor forward(const Tensor& x, int64_t start = 0) const;
  Tensor weight;  ///< (max_len, d)
};

}  // namespace graft::nn
