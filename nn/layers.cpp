#include "graft/nn/layers.h"

#include <cmath>

#include "graft/ops/ops.h"

namespace graft::nn {

Linear::Linear(int64_t in, int64_t out, bool has_bias, DType dt, Generator& gen) {
  const double bound = 1.0 / std::sqrt((double)in);
  const auto draw = [&](const Shape& s) {
    return new_parameter(s, dt, [&] { return rand(s, dt, gen, -bound, bound); });
  };
  weight = register_parameter("weight", draw({out, in}));
  if (has_bias) bias = register_parameter("bias", draw({out}));
}

Tensor Linear::forward(const Tensor& x) const {
  const auto named = scope();
  return hooked(linear(x, weight, bias));
}

Embedding::Embedding(int64_t vocab, int64_t dim, int64_t pad, DType dt, Generator& gen,
                     double init_std)
    : padding_idx(pad) {
  if (pad >= vocab)
    fail("Embedding: padding_idx " + std::to_string(pad) + " >= vocab " + std::to_string(vocab));
  weight = register_parameter("weight", new_parameter({vocab, dim}, dt, [&] {
                                Tensor w = randn({vocab, dim}, dt, gen, 0.0, init_std);
                                if (pad >= 0) fill_(slice(w, 0, pad, pad + 1), 0.0);
                                return w;
                              }));
}

Tensor Embedding::forward(const Tensor& ids) const {
  const auto named = scope();
  return hooked(embedding(weight, ids, padding_idx));
}

LayerNorm::LayerNorm(int64_t dim, double eps_, DType dt) : eps(eps_) {
  weight = register_parameter("weight", new_parameter({dim}, dt, [&] { return ones({dim}, dt); }));
  bias = register_parameter("bias", new_parameter({dim}, dt, [&] { return zeros({dim}, dt); }));
}

LayerNorm::LayerNorm(int64_t dim, double eps_, DType dt, bool rms_norm) : eps(eps_), rms(rms_norm) {
  weight = register_parameter("weight", new_parameter({dim}, dt, [&] { return ones({dim}, dt); }));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  const auto named = scope();
  return hooked(rms ? rms_norm(x, weight, eps) : layer_norm(x, weight, bias, eps));
}

Tensor LayerNorm::forward_add(const Tensor& x, const Tensor& r) const {
  const auto named = scope();
  return hooked(rms ? rms_norm(add(x, r), weight, eps) : add_layer_norm(x, r, weight, bias, eps));
}

Dropout::Dropout(double p, Generator* gen) : p(p), gen_(gen) {
  if (!is_dropout_p(p)) fail("Dropout: p must be in [0, 1], got " + std::to_string(p));
}

Tensor Dropout::forward(const Tensor& x) const {
  const auto named = scope();
  if (!training() || p == 0) return hooked(x);
  return hooked(dropout(x, p, true, generator()));
}

Generator& Dropout::generator() const { return gen_ ? *gen_ : default_generator(); }

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::swiglu:
      return "swiglu";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::silu:
      return "silu";
  }
  return "?";
}

bool activation_from_name(const std::string& name, Activation& out) {
  for (Activation a : {Activation::relu, Activation::gelu, Activation::swiglu,
                       Activation::gelu_tanh, Activation::silu})
    if (name == activation_name(a)) return out = a, true;
  return false;
}

Tensor feed_forward(const Linear& linear1, const Dropout& dropout, const Linear& linear2,
                    Activation act, const Tensor& x, const Linear* gate) {
  Tensor h = linear1.forward(x);
  if (act == Activation::swiglu) {
    if (!gate) fail("feed_forward: swiglu needs the gate projection (linear3)");
    return linear2.forward(dropout.forward(mul(silu(h), gate->forward(x))));
  }
  // relu + dropout as one op keeps only the hidden activation linear2 keeps anyway.
  if (act == Activation::relu)
    return linear2.forward(relu_dropout(h, dropout.p, dropout.training(), dropout.generator()));
  if (act == Activation::silu) return linear2.forward(dropout.forward(silu(h)));
  return linear2.forward(dropout.forward(gelu(h, /*tanh_approx=*/act == Activation::gelu_tanh)));
}

Tensor sinusoid_table(int64_t start, int64_t n, int64_t d, DType dt) {
  std::vector<double> v(n * d);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; j += 2) {
      const double angle = (double)(start + i) / std::pow(10000.0, (double)j / (double)d);
      v[i * d + j] = std::sin(angle);
      if (j + 1 < d) v[i * d + j + 1] = std::cos(angle);
    }
  return from_vector(v, {n, d}, dt);
}

Tensor add_positions(const Tensor& x, const Tensor& table, int64_t start, bool sinusoidal) {
  const char* who = sinusoidal ? "SinusoidalPositionalEncoding" : "LearnedPositionalEncoding";
  if (x.dim() != 3) fail(std::string(who) + ": expected (B, T, d), got " + describe(x));
  const int64_t T = x.shape()[1], max_len = table.shape()[0];
  if (start < 0 || (!sinusoidal && start + T > max_len))
    fail(std::string(who) + ": positions " + std::to_string(start) + ".." +
         std::to_string(start + T - 1) + " exceed max_len " + std::to_string(max_len) +
         " (learned positions exist only below max_len; sinusoidal, rope, alibi and relative "
         "extrapolate)");
  if (start + T <= max_len) return add(x, slice(table, 0, start, start + T));
  return add(x, sinusoid_table(start, T, table.shape()[1], table.dtype()));
}

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(int64_t max_len, int64_t d, DType dt) {
  table = register_buffer("table", sinusoid_table(0, max_len, d, dt));
}

Tensor SinusoidalPositionalEncoding::forward(const Tensor& x, int64_t start) const {
  const auto named = scope();
  return hooked(add_positions(x, table, start, true));
}

LearnedPositionalEncoding::LearnedPositionalEncoding(int64_t max_len, int64_t d, DType dt,
                                                     Generator& gen) {
  weight = register_parameter("weight", new_parameter({max_len, d}, dt, [&] {
                                return randn({max_len, d}, dt, gen, 0.0, 0.02);
                              }));
}

Tensor LearnedPositionalEncoding::forward(const Tensor& x, int64_t start) const {
  const auto named = scope();
  return hooked(add_positions(x, weight, start, false));
}

}  // namespace graft::nn
