// rope: one OpenMP loop for both precisions (no oneDNN primitive does it). The angles are
// computed in float64 once per (position, pair) and the backward is the inverse rotation
// (angle -> -angle), so nothing is saved but the positions.
#include "graft/ops/rope.h"

#include <cmath>
#include <vector>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/shape.h"
#include "ops/internal/kernels.h"

namespace graft {

using autograd::Ctx;

namespace {

GRAFT_DECLARE_OP("rope", "rope");
GRAFT_DECLARE_OP("rope_backward", "rope");  // rope's backward under create_graph

// cos and sin of t * inv_freq[i] for every position t and pair i: (T, D/2) each.
struct Angles {
  std::vector<double> cos, sin;
};
Angles rope_angles(const std::vector<int64_t>& pos, const std::vector<double>& inv_freq) {
  const int64_t T = (int64_t)pos.size(), h = (int64_t)inv_freq.size();
  Angles a{std::vector<double>(T * h), std::vector<double>(T * h)};
  for (int64_t i = 0; i < h; ++i)
    for (int64_t t = 0; t < T; ++t) {
      a.cos[t * h + i] = std::cos((double)pos[t] * inv_freq[i]);
      a.sin[t * h + i] = std::sin((double)pos[t] * inv_freq[i]);
    }
  return a;
}

// y = x rotated by +angle (sign 1) or -angle (sign -1); x, y contiguous (rows, D), row r at
// position index r % T.
template <class T>
void rope_loop(const T* x, T* y, int64_t rows, int64_t Tn, int64_t D, const Angles& a, T sign) {
  const int64_t h = D / 2;
#pragma omp parallel for if (rows * D > kern::kParallelGrain) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    const double* c = a.cos.data() + (r % Tn) * h;
    const double* s = a.sin.data() + (r % Tn) * h;
    for (int64_t i = 0; i < h; ++i) {
      const T ci = (T)c[i], si = sign * (T)s[i];
      yr[i] = xr[i] * ci - xr[i + h] * si;
      yr[i + h] = xr[i + h] * ci + xr[i] * si;
    }
  }
}

Tensor rotate(const Tensor& x_in, const Angles& a, int64_t Tn, double sign) {
  const Tensor x = kern::contig(x_in);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  const int64_t D = x.shape().back(), rows = D ? x.numel() / D : 0;
  GRAFT_DISPATCH_FLOAT(x.dtype(), "rope", [&] {
    rope_loop<T>(x.data<const T>(), y.data<T>(), rows, Tn, D, a, (T)sign);
  });
  return y;
}

void check_rope(const Tensor& x, const Tensor& positions, const std::vector<double>& inv_freq) {
  kern::check_float("rope", x);
  check_defined(positions, "rope", "positions");
  const auto what = [&] {  // built only for an error message
    return "rope: x " + describe(x) + ", positions " + describe(positions);
  };
  if (x.dim() < 2 || x.shape().back() % 2 != 0)
    fail(what() + ": x must be (..., T, D) with D even");
  if (positions.dtype() != DType::i64 || positions.dim() != 1 || positions.size(0) != x.size(-2))
    fail(what() + ": positions must be int64 (T) = (" + std::to_string(x.size(-2)) + ")");
  if ((int64_t)inv_freq.size() * 2 != x.shape().back())
    fail(what() + ": inv_freq has " + std::to_string(inv_freq.size()) +
         " entries, D / 2 = " + std::to_string(x.shape().back() / 2));
  for (double f : inv_freq)
    if (!std::isfinite(f)) fail(what() + ": inv_freq holds " + std::to_string(f));
}

// rope: dx = dout rotated back (by -angle).
Tensor rope_backward(const Tensor& dout, const std::shared_ptr<const Angles>& a, int64_t Tn) {
  return rotate(dout, *a, Tn, -1.0);
}

}  // namespace

std::vector<double> rope_frequencies(int64_t D, double base) {
  if (D < 0 || D % 2 != 0) fail("rope: D must be even, got " + std::to_string(D));
  if (!(base > 1) || !std::isfinite(base))
    fail("rope: base must be finite and > 1, got " + std::to_string(base));
  std::vector<double> f(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) f[i] = std::pow(base, -2.0 * (double)i / (double)D);
  return f;
}

Tensor rope(const Tensor& x, const Tensor& positions, double base) {
  kern::check_float("rope", x);
  if (!(base > 1) || !std::isfinite(base))
    fail("rope: x " + describe(x) + ", positions " + describe(positions) +
         ": base must be finite and > 1, got " + std::to_string(base));
  // An odd D gets a table of the wrong length: check_rope() refuses x with its own message.
  const int64_t D = x.dim() >= 1 ? x.shape().back() : 0;
  return rope(x, positions, rope_frequencies(D % 2 == 0 ? D : D - 1, base));
}

Tensor rope(const Tensor& x, const Tensor& positions, const std::vector<double>& inv_freq) {
  GRAFT_VIA_F32("rope", rope, x, positions, inv_freq);
  check_rope(x, positions, inv_freq);
  const int64_t Tn = x.size(-2);
  auto a = std::make_shared<const Angles>(rope_angles(positions.to_vector<int64_t>(), inv_freq));
  Tensor y = rotate(x, *a, Tn, 1.0);
  if (autograd::needs_record({x}))
    autograd::record("rope", {x}, {y}, {}, [a, Tn](const Ctx& c, const Tensors& dout) {
      if (!c.create_graph) return Tensors{rope_backward(dout[0], a, Tn)};
      auto back = [a, Tn](const Tensor& g) { return rope_backward(g, a, Tn); };
      auto forth = [a, Tn](const Tensor& g) { return rotate(g, *a, Tn, 1.0); };
      return Tensors{kern::apply_linear("rope_backward", "rope", dout[0], back, forth)};
    });
  return y;
}

}  // namespace graft
