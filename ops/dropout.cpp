// Dropout. Shape legend: x (...) -> out (...) contiguous, same dtype as x. No mask is stored.
//
// The mask is one uniform draw per element in row-major element order, keep iff u >= p, where u
// is exactly what gen.uniform() would return for that draw. splitmix64 is a counter stream (the
// state advances by a constant per draw), so element i's number is computed directly from the
// starting state: the loop runs in parallel yet gives the mask a sequential walk would, for any
// thread count and either float dtype. Cost: one splitmix64 (~8 integer ops) per element, no
// float conversion (u >= p is compared on the integer), so it runs at about memory speed.
#include "graft/ops/dropout.h"

#include <cmath>
#include <limits>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/shape.h"
#include "ops/internal/kernels.h"

namespace graft {

namespace {
// Ones of t's shape and dtype: the upstream gradient that turns a backward's mask into a tensor.
Tensor ones_like(const Tensor& t) { return full(t.shape(), 1.0, t.dtype()); }
}  // namespace

using autograd::Ctx;

namespace {

GRAFT_DECLARE_OP("dropout", "dropout");
GRAFT_DECLARE_OP("relu_dropout", "dropout");

using kern::DropoutMask;

// out[i] = x[i] * (keep(i) ? keep_value : 0); with relu, max(x[i], 0) in place of x[i].
template <class T>
void dropout_fwd(const Tensor& x, const Tensor& out, DropoutMask m, T keep_value, bool relu) {
  T* __restrict po = out.data<T>();
  const T* __restrict px = x.data<const T>();
  if (x.is_contiguous()) {
    const int64_t n = x.numel();
    const T lo = relu ? T(0) : -std::numeric_limits<T>::infinity();
    // Branch-free so it vectorises: the keep pattern is random, a branch mispredicts.
#pragma omp parallel for simd if (n > kern::kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; ++i) po[i] = std::max(px[i], lo) * (m.keep(i) ? keep_value : T(0));
    return;
  }
  kern::for_each_strided(x.shape(), x.strides(), [&](int64_t i, int64_t o) {
    const T v = relu ? std::max(px[o], T(0)) : px[o];
    po[i] = m.keep(i) ? v * keep_value : T(0);
  });
}

// dx[i] = dout[i] * (keep(i) ? keep_value : 0).
template <class T>
void dropout_bwd(const Tensor& dout, DropoutMask m, T keep_value, const Tensor& dx) {
  const T* __restrict pd = dout.data<const T>();
  T* __restrict px = dx.data<T>();
  const int64_t n = dx.numel();
#pragma omp parallel for simd if (n > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) px[i] = pd[i] * (m.keep(i) ? keep_value : T(0));
}

// relu + dropout backward from the output alone: out[i] > 0 exactly when x[i] > 0 and the
// element was kept, so dx[i] = dout[i] * (out[i] > 0 ? keep_value : 0).
template <class T>
void relu_dropout_bwd(const Tensor& dout, const Tensor& out, T keep_value, const Tensor& dx) {
  const T* __restrict pd = dout.data<const T>();
  const T* __restrict po = out.data<const T>();
  T* __restrict px = dx.data<T>();
  const int64_t n = dx.numel();
#pragma omp parallel for simd if (n > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) px[i] = pd[i] * (po[i] > T(0) ? keep_value : T(0));
}

// One bit per element of out (float32, or 16-bit: a positive float32 product rounds to a positive
// 16-bit value), set where out[i] > 0: what relu_dropout's backward needs, in 1/32 (1/16) of
// out's bytes.
template <class T>
std::shared_ptr<Storage> positive_bits(const Tensor& out) {
  const T* __restrict po = out.data<const T>();
  const int64_t n = out.numel(), nbytes = (n + 7) / 8;
  auto bits = std::make_shared<Storage>((size_t)std::max<int64_t>(nbytes, 1));
  uint8_t* __restrict pb = static_cast<uint8_t*>(bits->data);
  const int64_t full = n / 8;
#pragma omp parallel for if (n > kern::kParallelGrain) schedule(static)
  for (int64_t j = 0; j < full; ++j) {
    unsigned b = 0;
#pragma omp simd reduction(| : b)
    for (int k = 0; k < 8; ++k) b |= (unsigned)((float)po[j * 8 + k] > 0.0f) << k;
    pb[j] = (uint8_t)b;
  }
  if (full < nbytes) {
    unsigned b = 0;
    for (int64_t i = full * 8; i < n; ++i) b |= (unsigned)((float)po[i] > 0.0f) << (i - full * 8);
    pb[full] = (uint8_t)b;
  }
  return bits;
}

// relu_dropout's backward from positive_bits(out): dx[i] = dout[i] * (bit i ? keep_value : 0),
// in dout's dtype T (contiguous), the product float32's rounded once to T. Each mask byte selects
// a row of 8 factors from a 256-row table, so the loop is plain loads and multiplies (a shift per
// element does not vectorise: measured 4x slower).
template <class T>
Tensor relu_dropout_backward_bits(const Tensor& dout, const Storage& bits, float keep_value) {
  Tensor dx = Tensor::empty(dout.shape(), dout.dtype());
  alignas(64) float factors[256][8];
  for (int b = 0; b < 256; ++b)
    for (int k = 0; k < 8; ++k) factors[b][k] = (b >> k) & 1 ? keep_value : 0.0f;
  const T* __restrict pd = dout.data<const T>();
  const uint8_t* __restrict pb = static_cast<const uint8_t*>(bits.data);
  T* __restrict px = dx.data<T>();
  const int64_t n = dx.numel(), full = n / 8;
#pragma omp parallel for if (n > kern::kParallelGrain) schedule(static)
  for (int64_t j = 0; j < full; ++j) {
    const float* f = factors[pb[j]];
#pragma omp simd
    for (int k = 0; k < 8; ++k) px[j * 8 + k] = T((float)pd[j * 8 + k] * f[k]);
  }
  for (int64_t i = full * 8; i < n; ++i) px[i] = T((float)pd[i] * factors[pb[full]][i - full * 8]);
  return dx;
}

// relu + dropout of a contiguous 16-bit x into out (S): float32's arithmetic (dropout_fwd's on the
// widened x, keep_value float32) on each element, rounded once.
template <class S>
void relu_dropout_fwd_half(const Tensor& x, const Tensor& out, DropoutMask m, float keep_value) {
  const S* __restrict px = x.data<const S>();
  S* __restrict po = out.data<S>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i)
    po[i] = S(std::max((float)px[i], 0.0f) * (m.keep(i) ? keep_value : 0.0f));
}

// Checks p, draws the mask's starting state from gen (advancing it by numel draws) and runs the
// forward; keep_value is 1 / (1 - p).
Tensor dropout_forward(const Tensor& x, double p, Generator& gen, bool relu, DropoutMask& mask,
                       double& keep_value) {
  mask = DropoutMask::draw(gen, p, x.numel());
  keep_value = mask.keep_value;
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  GRAFT_DISPATCH_FLOAT(x.dtype(), relu ? "relu_dropout" : "dropout",
                       [&] { dropout_fwd<T>(x, out, mask, (T)keep_value, relu); });
  return out;
}

// dropout: dx = dout * (keep(i) ? keep_value : 0), the mask recomputed from its starting state.
Tensor dropout_backward(const Tensor& dout, DropoutMask mask, double keep_value) {
  Tensor dx = Tensor::empty(dout.shape(), dout.dtype());
  GRAFT_DISPATCH_FLOAT(dx.dtype(), "dropout",
                       [&] { dropout_bwd<T>(dout, mask, (T)keep_value, dx); });
  return dx;
}

// relu_dropout: dx = dout * (out > 0 ? keep_value : 0), from the output alone.
Tensor relu_dropout_backward(const Tensor& dout, const Tensor& out, double keep_value) {
  Tensor dx = Tensor::empty(out.shape(), out.dtype());
  GRAFT_DISPATCH_FLOAT(dx.dtype(), "relu_dropout",
                       [&] { relu_dropout_bwd<T>(dout, out, (T)keep_value, dx); });
  return dx;
}

void check_p(const char* op, double p, const Tensor& x) {
  if (!is_dropout_p(p))
    fail(std::string(op) + ": p must be in [0, 1], got p = " + std::to_string(p) + " for x " +
         describe(x));
}

// A 16-bit x on the tape: relu + dropout element by element in float32 registers, the output
// rounded once, one bit per element kept for backward, whose dx is computed the same way: no
// float32 tensor either way (float32 copies of x, out and the gradients, 4 bytes an element each,
// were the largest temporaries of a bf16 base training step: 32 MiB each for its 4096 x 2048
// feed-forward activations). Through kern::via_f32 the float32 entry saved its float32 output
// (32x the bits) beside two cast entries.
Tensor relu_dropout_half_recorded(const Tensor& x, double p, Generator& gen) {
  const DType dt = x.dtype();
  const DropoutMask mask = DropoutMask::draw(gen, p, x.numel());
  const float kv = (float)mask.keep_value;
  const Tensor xc = kern::contig(x), out = Tensor::empty(x.shape(), dt);
  std::shared_ptr<Storage> bits;
  GRAFT_DISPATCH_HALF(dt, [&] {
    relu_dropout_fwd_half<S>(xc, out, mask, kv);
    bits = positive_bits<S>(out);
  });
  autograd::record(
      "relu_dropout", {x}, {out}, {}, {{bits, out}}, [kv, dt](const Ctx& c, const Tensors& dout) {
        if (c.create_graph)  // the mask times 1 / (1 - p) stays float32: bf16 would round it
          return Tensors{to_dtype(
              mul(to_dtype(dout[0], DType::f32),
                  relu_dropout_backward_bits<float>(ones(dout[0].shape()), *c.kept[0], kv)),
              dt)};
        const Tensor g = kern::contig(dout[0]);
        return Tensors{GRAFT_DISPATCH_HALF(
            dt, [&] { return relu_dropout_backward_bits<S>(g, *c.kept[0], kv); })};
      });
  return out;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  kern::check_float("dropout", x);
  check_p("dropout", p, x);
  if (!training || p == 0.0) return x;
  auto on_f32 = [&](const Tensor& xf) { return dropout(xf, p, training, gen); };
  if (auto r = kern::via_f32("dropout", on_f32, x)) return *r;
  DropoutMask mask;
  double keep_value;
  Tensor out = dropout_forward(x, p, gen, false, mask, keep_value);
  if (autograd::needs_record({x}))
    autograd::record(
        "dropout", {x}, {out}, {}, [mask, keep_value](const Ctx& c, const Tensors& dout) {
          if (!c.create_graph) return Tensors{dropout_backward(dout[0], mask, keep_value)};
          return Tensors{mul(
              dout[0], dropout_backward(ones_like(dout[0]), mask, keep_value))};  // a constant mask
        });
  return out;
}

Tensor relu_dropout(const Tensor& x, double p, bool training, Generator& gen) {
  kern::check_float("relu_dropout", x);
  check_p("relu_dropout", p, x);
  if (!training || p == 0.0) return relu(x);
  if (kern::half_dtype_of("relu_dropout", x) && autograd::needs_record({x}))
    return relu_dropout_half_recorded(x, p, gen);
  auto on_f32 = [&](const Tensor& xf) { return relu_dropout(xf, p, training, gen); };
  if (auto r = kern::via_f32("relu_dropout", on_f32, x)) return *r;
  DropoutMask mask;
  double keep_value;
  Tensor out = dropout_forward(x, p, gen, true, mask, keep_value);
  if (!autograd::needs_record({x})) return out;
  // Under the oneDNN bf16 path the next linear keeps out only as bf16 (kern::keep_bf16_of):
  // keeping out here too would hold its float32 bytes, so one bit per element stands in.
  if (x.dtype() == DType::f32 && kern::bf16_kernel_in_force()) {
    std::shared_ptr<Storage> bits = positive_bits<float>(out);
    autograd::record(
        "relu_dropout", {x}, {out}, {}, {{bits, out}},
        [keep_value](const Ctx& c, const Tensors& dout) {
          if (!c.create_graph)
            return Tensors{
                relu_dropout_backward_bits<float>(dout[0], *c.kept[0], (float)keep_value)};
          return Tensors{mul(dout[0], relu_dropout_backward_bits<float>(
                                          ones_like(dout[0]), *c.kept[0], (float)keep_value))};
        });
    return out;
  }
  autograd::record(
      "relu_dropout", {x}, {out}, {out}, [keep_value](const Ctx& c, const Tensors& dout) {
        if (!c.create_graph) return Tensors{relu_dropout_backward(dout[0], c.saved[0], keep_value)};
        return Tensors{mul(
            dout[0], relu_dropout_backward(ones_like(dout[0]), c.saved[0].detach(), keep_value))};
      });
  return out;
}

}  // namespace graft
