// Basic layers. Shapes: B batch, T time, C/d model width.
#pragma once

#include "graft/nn/module.h"

namespace graft::nn {

// y = x W^T + b; weight (out, in), bias (out). PyTorch's default init: U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, DType dt = DType::f32,
         Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
};

// Lookup table (V, C); rows of padding_idx start at zero and receive no gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, int64_t padding_idx = -1, DType dt = DType::f32,
            Generator& gen = default_generator(), double init_std = 1.0);
  Tensor forward(const Tensor& ids) const;
  Tensor weight;
  int64_t padding_idx;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, DType dt = DType::f32);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;
};

// Draws its masks from the given generator (default: the global one), so a seeded run repeats.
class Dropout : public Module {
 public:
  explicit Dropout(double p, Generator* gen = nullptr) : p(p), gen_(gen) {}
  Tensor forward(const Tensor& x) const;
  Generator& generator() const;  // the one given, else default_generator()
  double p;

 private:
  Generator* gen_;
};

enum class Activation { relu, gelu };

// Position-wise FFN: linear2(dropout(act(linear1(x)))). The encoder/decoder layers hold their
// linear1/linear2 directly (nn.Transformer's names) and call this function.
Tensor feed_forward(const Linear& linear1, const Dropout& dropout, const Linear& linear2,
                    Activation act, const Tensor& x);

// Rows start .. start + n - 1 of the sinusoidal table below, (n, d).
Tensor sinusoid_table(int64_t start, int64_t n, int64_t d, DType dt);
// x (B, T, d) + rows start .. start + T - 1 of table (max_len, d); rows past max_len are computed
// when sinusoidal, an error naming max_len otherwise.
Tensor add_positions(const Tensor& x, const Tensor& table, int64_t start, bool sinusoidal);

// PE(i, 2j) = sin(i / 10000^(2j/d)), PE(i, 2j+1) = cos(i / 10000^(2j/d)) (seeds 000/001).
// forward(x, start) adds rows start .. start+T-1 to x (B, T, d); rows past max_len are computed.
class SinusoidalPositionalEncoding : public Module {
 public:
  SinusoidalPositionalEncoding(int64_t max_len, int64_t d, DType dt = DType::f32);
  Tensor forward(const Tensor& x, int64_t start = 0) const;
  Tensor table;  // (max_len, d) buffer
};

class LearnedPositionalEncoding : public Module {
 public:
  LearnedPositionalEncoding(int64_t max_len, int64_t d, DType dt = DType::f32,
                            Generator& gen = default_generator());
  Tensor forward(const Tensor& x, int64_t start = 0) const;
  Tensor weight;  // (max_len, d)
};

}  // namespace graft::nn
