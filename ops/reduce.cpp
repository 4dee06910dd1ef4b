// Reductions: OpenMP loops in both precisions (see sum_axes for why not oneDNN's reduction);
// max keeps the argmax for its backward.
#include "graft/ops/reduce.h"

#include <algorithm>
#include <cmath>

#include "autograd/internal/parallel.h"
#include "graft/autograd/gradcheck.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/shape.h"
#include "ops/internal/kernels.h"

namespace graft {

using autograd::Ctx;

GRAFT_DECLARE_OP("sum", "reduce");
GRAFT_DECLARE_OP("mean", "reduce");
GRAFT_DECLARE_OP("max", "reduce");
GRAFT_DECLARE_OP("amax", "reduce");
// var and sum_to are composites (no backward of their own); declared so they get cases.
GRAFT_DECLARE_OP("var", "reduce");
GRAFT_DECLARE_OP("sum_to", "reduce");

namespace {

// Reduced axes as a sorted unique list; empty input means all axes.
std::vector<int64_t> norm_axes(const char* op, const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> r;
  if (axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) r.push_back(i);
    return r;
  }
  for (auto a : axes) r.push_back(norm_axis(op, a, rank));
  std::sort(r.begin(), r.end());
  if (std::adjacent_find(r.begin(), r.end()) != r.end())
    fail(std::string(op) + ": repeated axis in reduction over rank " + std::to_string(rank));
  return r;
}

Shape kept_shape(const Shape& s, const std::vector<int64_t>& axes) {
  Shape k = s;
  for (auto a : axes) k[a] = 1;
  return k;
}

Shape dropped_shape(const Shape& s, const std::vector<int64_t>& axes) {
  Shape d;
  for (int64_t i = 0; i < (int64_t)s.size(); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) d.push_back(s[i]);
  return d;
}

// sum: dx = dout read with the reduced axes kept (keep), broadcast back to x's shape; recorded
// ops under create_graph.
Tensor sum_backward(const Tensor& dout, const Shape& x_shape, const Shape& keep,
                    bool create_graph) {
  return contiguous(
      broadcast_to(create_graph ? reshape(dout, keep) : kern::reshaped(dout, keep), x_shape));
}

// mean: dx = sum_backward / count.
Tensor mean_backward(const Tensor& dout, const Shape& x_shape, const Shape& keep, int64_t count,
                     bool create_graph) {
  return affine(sum_backward(dout, x_shape, keep, create_graph), 1.0 / (double)count, 0.0);
}

Tensor reduce_sum(const char* op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim,
                  bool mean) {
  kern::check_float(op, x);
  const auto ax = norm_axes(op, axes, x.dim());
  const Shape keep = kept_shape(x.shape(), ax);
  int64_t count = 1;
  for (auto a : ax) count *= x.shape()[a];
  if (mean && count == 0) fail(std::string(op) + ": mean over an empty axis of " + describe(x));
  const double scale = mean ? 1.0 / (double)count : 1.0;
  Tensor out = sum_axes(x, ax, scale);
  if (!keepdim) out = kern::reshaped(out, dropped_shape(x.shape(), ax));
  if (autograd::needs_record({x}))
    autograd::record(op, {x}, {out}, {},
                     [xs = x.shape(), keep, count, mean](const Ctx& c, const Tensors& dout) {
                       return Tensors{mean ? mean_backward(dout[0], xs, keep, count, c.create_graph)
                                           : sum_backward(dout[0], xs, keep, c.create_graph)};
                     });
  return out;
}

// S the storage type: 16-bit elements are compared as floats (exact), the maximum stored back.
template <class S>
void max_loop(const Tensor& xc, const Split3& s, const Tensor& out, const Tensor& idx) {
  using T = kern::acc_t<S>;
  const int64_t outer = s.outer, n = s.n, inner = s.inner;
  const S* p = xc.data<S>();
  S* po = out.data<S>();
  int64_t* pi = idx.data<int64_t>();
  detail::parallel_for(outer, outer * n * inner > kern::kParallelGrain, [&](int64_t o) {
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      T bv = T(p[o * n * inner + i]);
      for (int64_t k = 1; k < n; ++k) {
        const T v = T(p[(o * n + k) * inner + i]);
        if (v > bv || (std::isnan(v) && !std::isnan(bv))) bv = v, best = k;
      }
      po[o * inner + i] = S(bv);
      pi[o * inner + i] = best;
    }
  });
}

// max: dx = dout at each slice's argmax, 0 elsewhere.
template <class T>
void max_backward_loop(const Tensor& dout, const Tensor& idx, const Split3& s, const Tensor& dx) {
  const int64_t outer = s.outer, n = s.n, inner = s.inner;
  const T* pd = dout.data<T>();
  const int64_t* pi = idx.data<int64_t>();
  T* px = dx.data<T>();
  std::fill(px, px + dx.numel(), T(0));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      px[(o * n + pi[o * inner + i]) * inner + i] += pd[o * inner + i];
}

// dout, idx (the argmax per slice) -> dx of x's shape.
Tensor max_backward(const Tensor& dout, const Tensor& idx, const Shape& x_shape, const Split3& s) {
  Tensor dx = Tensor::empty(x_shape, dout.dtype());
  GRAFT_DISPATCH_FLOAT(dx.dtype(), "max", [&] { max_backward_loop<T>(dout, idx, s, dx); });
  return dx;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_sum("sum", x, axes, keepdim, false);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_sum("mean", x, axes, keepdim, true);
}

namespace {

// out = the maxima along axis (kept as size 1) and idx = their positions.
struct MaxResult {
  Tensor out, idx;
  Split3 split;
};
MaxResult max_along(const char* op, const Tensor& x, int64_t axis) {
  kern::check_float(op, x);
  const int64_t ax = norm_axis(op, axis, x.dim());
  if (x.shape()[ax] == 0)
    fail(std::string(op) + ": axis " + std::to_string(axis) + " of " + describe(x) + " is empty");
  Shape keep = x.shape();
  keep[ax] = 1;
  MaxResult r{Tensor::empty(keep, x.dtype()), Tensor::empty(keep, DType::i64),
              split3(x.shape(), ax)};
  const Tensor xc = kern::contig(x);
  if (is_half(x.dtype()))
    GRAFT_DISPATCH_HALF(x.dtype(), [&] { max_loop<S>(xc, r.split, r.out, r.idx); });
  else GRAFT_DISPATCH_FLOAT(x.dtype(), op, [&] { max_loop<T>(xc, r.split, r.out, r.idx); });
  return r;
}

Shape without_axis(const Tensor& x, int64_t axis) {
  Shape d = x.shape();
  d.erase(d.begin() + norm_axis("max", axis, x.dim()));
  return d;
}

}  // namespace

Tensor max(const Tensor& x, int64_t axis, bool keepdim) {
  // 16-bit x without a tape: max_loop on its elements (kern::native_half).
  if (!kern::native_half("max", x)) GRAFT_VIA_F32("max", max, x, axis, keepdim);
  MaxResult r = max_along("max", x, axis);
  Tensor out = keepdim ? r.out : kern::reshaped(r.out, without_axis(x, axis));
  if (autograd::needs_record({x}))
    autograd::record("max", {x}, {out}, {r.idx},
                     [xs = x.shape(), s = r.split](const Ctx& c, const Tensors& dout) {
                       if (!c.create_graph)
                         return Tensors{max_backward(dout[0], c.saved[0], xs, s)};
                       // dout spread over the axis, times the argmax's one-hot mask as a constant.
                       const Tensor onehot = max_backward(
                           full(dout[0].shape(), 1.0, dout[0].dtype()), c.saved[0], xs, s);
                       const Tensor spread = broadcast_to(reshape(dout[0], {s.outer, 1, s.inner}),
                                                          {s.outer, s.n, s.inner});
                       return Tensors{mul(reshape(spread, xs), onehot)};
                     });
  return out;
}

namespace {

// 1 where x equals m (x's shape, m broadcast to it) else 0, x's dtype: the maxima of amax.
Tensor maxima_mask(const Tensor& x, const Tensor& m) {
  Tensor mask = Tensor::empty(x.shape(), x.dtype());
  GRAFT_DISPATCH_FLOAT(x.dtype(), "amax", [&] {
    const T *px = x.data<T>(), *pm = m.data<T>();
    T* pk = mask.data<T>();
    kern::for_each_bcast2(
        x.shape(), x.strides(), kern::broadcast_strides(m, x.shape()),
        [&](int64_t i, int64_t ox, int64_t om) { pk[i] = px[ox] == pm[om] ? T(1) : T(0); });
  });
  return mask;
}

// amax: dout (kept shape) shared evenly among each slice's maxima; x and m (the maxima, reduced
// axes kept) saved.
Tensor amax_backward(const Tensor& dout, const Tensor& x, const Tensor& m,
                     const std::vector<int64_t>& axes, bool create_graph) {
  const Tensor mask = maxima_mask(x, m);
  const Tensor d =
      create_graph ? reshape(dout, m.shape()) : kern::reshaped(kern::contig(dout), m.shape());
  return mul(mask, div(d, sum(mask, axes, true)));
}

}  // namespace

Tensor amax(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  GRAFT_VIA_F32("amax", amax, x, axes, keepdim);
  kern::check_float("amax", x);
  const auto ax = norm_axes("amax", axes, x.dim());
  Tensor m = x;
  for (auto a : ax) m = max_along("amax", m, a).out;
  if (ax.empty()) m = contiguous_copy(x);  // a 0-d x: its own maximum, in a buffer of its own
  const Tensor out = keepdim ? m : kern::reshaped(m, dropped_shape(x.shape(), ax));
  if (autograd::needs_record({x}))
    autograd::record("amax", {x}, {out}, {x, m}, [ax](const Ctx& c, const Tensors& dout) {
      return Tensors{amax_backward(dout[0], c.saved[0], c.saved[1], ax, c.create_graph)};
    });
  return out;
}

Tensor argmax(const Tensor& x, int64_t axis) {
  // Any float dtype, 16-bit too: max_loop on its elements (int64 indices record nothing).
  MaxResult r = max_along("argmax", x, axis);
  return kern::reshaped(r.idx, without_axis(x, axis));
}

Tensor var(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, int64_t correction) {
  GRAFT_VIA_F32("var", var, x, axes, keepdim, correction);
  kern::check_float("var", x);
  const auto ax = norm_axes("var", axes, x.dim());
  int64_t count = 1;
  for (auto a : ax) count *= x.shape()[a];
  if (count - correction <= 0)
    fail("var: " + std::to_string(count) + " elements with correction " +
         std::to_string(correction) + " in " + describe(x));
  Tensor d = sub(x, mean(x, ax, true));
  return affine(sum(mul(d, d), ax, keepdim), 1.0 / (double)(count - correction), 0.0);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check_defined(x, "sum_to", "x");
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - (int64_t)shape.size();
  if (!broadcasts_to(shape, x.shape()))
    fail("sum_to: cannot reduce " + describe(x) + " to shape " + shape_str(shape));
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) axes.push_back(i);
  Tensor s = axes.empty() ? x : sum(x, axes, true);
  return reshape(s, shape);
}

// ---------------------------------------------------------------------------------------------
// Gradcheck cases; each op's first case carries its bad inputs.

}  // namespace graft
