// Dropout. Shape legend: x (...) -> out (...), mask (...) contiguous, same dtype as x.
//
// The mask is one uniform draw per element in row-major element order, keep iff u >= p, where u
// is exactly what gen.uniform() would return for that draw. splitmix64 is a counter stream (the
// state advances by a constant per draw), so element i's number is computed directly from the
// starting state: the loop runs in parallel yet gives the mask a sequential walk would, for any
// thread count and either float dtype. Cost: one splitmix64 (~8 integer ops) per element, no
// float conversion (u >= p is compared on the integer), so it runs at about memory speed.
#include "ops/dropout.h"

#include <cmath>

#include "autograd/gradcheck.h"
#include "ops/kernels.h"

namespace graft {

using autograd::Ctx;

namespace {

GRAFT_DECLARE_OP("dropout", "dropout");

// Must match Generator::next_u64 in autograd/tensor.cpp (tests/test_loss_dropout.cpp checks
// the mask against sequential gen.uniform() draws).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
inline uint64_t splitmix64_at(uint64_t state0, uint64_t i) {
  uint64_t z = state0 + (i + 1) * kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// mask[i] = keep_value if draw i keeps the element else 0; out[i] = x[i] * mask[i].
template <class T>
void dropout_fwd(const Tensor& x, const Tensor& out, const Tensor& mask, uint64_t state0,
                 uint64_t threshold, T keep_value) {
  T* pm = mask.data<T>();
  T* po = out.data<T>();
  const T* px = x.data<const T>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    pm[i] = (splitmix64_at(state0, (uint64_t)i) >> 11) >= threshold ? keep_value : T(0);
  kern::for_each_strided(x.shape(), x.strides(),
                         [&](int64_t i, int64_t o) { po[i] = px[o] * pm[i]; });
}

template <class T>
void dropout_bwd(const Tensor& dout, const Tensor& mask, const Tensor& dx) {
  const T* pd = dout.data<const T>();
  const T* pm = mask.data<const T>();
  T* px = dx.data<T>();
  const int64_t n = dx.numel();
#pragma omp parallel for if (n > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) px[i] = pd[i] * pm[i];
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  kern::check_float("dropout", x);
  if (!(p >= 0.0 && p <= 1.0))
    fail("dropout: p must be in [0, 1], got p = " + std::to_string(p) + " for x " + describe(x));
  if (!training || p == 0.0) return x;

  const int64_t n = x.numel();
  const uint64_t state0 = gen.state();
  gen.set_state(state0 + (uint64_t)n * kGolden);  // as if n uniforms were drawn
  // u = (z >> 11) * 2^-53 >= p  <=>  (z >> 11) >= ceil(p * 2^53), exact in integers.
  const uint64_t threshold = (uint64_t)std::ceil(std::ldexp(p, 53));
  const double keep_value = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;

  Tensor out = Tensor::empty(x.shape(), x.dtype());
  Tensor mask = Tensor::empty(x.shape(), x.dtype());  // 0 or 1/(1-p): backward is one multiply
  if (x.dtype() == DType::f32)
    dropout_fwd<float>(x, out, mask, state0, threshold, (float)keep_value);
  else
    dropout_fwd<double>(x, out, mask, state0, threshold, keep_value);

  if (autograd::needs_record({x}))
    autograd::record("dropout", {x}, {out}, {mask}, [](const Ctx& c, const Tensors& dout) -> Tensors {
      const Tensor& mask = c.saved[0];
      Tensor dx = Tensor::empty(mask.shape(), mask.dtype());
      if (mask.dtype() == DType::f32)
        dropout_bwd<float>(dout[0], mask, dx);
      else
        dropout_bwd<double>(dout[0], mask, dx);
      return {dx};
    });
  return out;
}

// A fresh Generator per call so every forward of the gradcheck draws the same mask.
GRAFT_OP_CASE({.name = "dropout/p0.4",
               .op = "dropout",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input({4, 6}, dt, g)}; },
               .fn =
                   [](const Tensors& x) {
                     Generator g(5);
                     return dropout(x[0], 0.4, true, g);
                   }});

GRAFT_OP_CASE({.name = "dropout/noncontig",
               .op = "dropout",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({5, 4}, dt, g)}; },
               .fn =
                   [](const Tensors& x) {
                     Generator g(5);
                     return dropout(x[0], 0.25, true, g);
                   }});

}  // namespace graft
