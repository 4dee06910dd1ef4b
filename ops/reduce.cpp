// Reductions: OpenMP loops in both precisions (see sum_axes for why not oneDNN's reduction);
// max keeps the argmax for its backward.
#include "ops/reduce.h"

#include <algorithm>
#include <cmath>

#include "autograd/gradcheck.h"
#include "ops/elementwise.h"
#include "ops/kernels.h"
#include "ops/shape.h"

namespace graft {

using autograd::Ctx;

GRAFT_DECLARE_OP("sum", "reduce");
GRAFT_DECLARE_OP("mean", "reduce");
GRAFT_DECLARE_OP("max", "reduce");
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

// x viewed as (outer, mid, inner), contiguous: out[o, j] = scale * sum_m x[o, m, j].
// Parallel over output elements (blocks of j), each summed in m order, so the result does not
// depend on the thread count; the j-inner loop vectorises.
template <class T>
void sum_block(const T* px, T* po, int64_t outer, int64_t mid, int64_t inner, double scale) {
  if (inner == 1) {
#pragma omp parallel for if (outer * mid > kern::kParallelGrain) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      T acc = 0;
      const T* row = px + o * mid;
#pragma omp simd reduction(+ : acc)
      for (int64_t m = 0; m < mid; ++m) acc += row[m];
      po[o] = (T)(acc * scale);
    }
    return;
  }
  constexpr int64_t kBlock = 256;
  const int64_t jblocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for if (outer * mid * inner > kern::kParallelGrain) schedule(static)
  for (int64_t t = 0; t < outer * jblocks; ++t) {
    const int64_t o = t / jblocks, j0 = (t % jblocks) * kBlock, j1 = std::min(inner, j0 + kBlock);
    T* out = po + o * inner;
    for (int64_t j = j0; j < j1; ++j) out[j] = 0;
    for (int64_t m = 0; m < mid; ++m) {
      const T* row = px + (o * mid + m) * inner;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) out[j] += row[j];
    }
    if (scale != 1.0)
      for (int64_t j = j0; j < j1; ++j) out[j] = (T)(out[j] * scale);
  }
}

// Sums over sorted axes one run of adjacent axes at a time (last run first), giving the
// kept-dims shape. oneDNN 2.6's reduction primitive runs its reference kernel (ref:any, about
// 0.1 GB/s measured) for reductions over leading axes, so both precisions use this loop.
template <class T>
Tensor sum_axes(const Tensor& x, const std::vector<int64_t>& axes, double scale) {
  Tensor cur = kern::contig(x);
  Shape shape = x.shape();
  size_t end = axes.size();
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && axes[begin - 1] == axes[begin] - 1) --begin;
    const int64_t a = axes[begin], b = axes[end - 1];
    int64_t outer = 1, mid = 1, inner = 1;
    for (int64_t d = 0; d < a; ++d) outer *= shape[d];
    for (int64_t d = a; d <= b; ++d) mid *= shape[d];
    for (int64_t d = b + 1; d < (int64_t)shape.size(); ++d) inner *= shape[d];
    for (int64_t d = a; d <= b; ++d) shape[d] = 1;
    Tensor next = Tensor::empty(shape, x.dtype());
    sum_block<T>(cur.data<T>(), next.data<T>(), outer, mid, inner, begin == 0 ? scale : 1.0);
    cur = next;
    end = begin;
  }
  return cur;
}

Tensor reduce_sum(const char* op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim,
                  bool mean) {
  kern::check_float(op, x);
  const auto ax = norm_axes(op, axes, x.dim());
  const Shape keep = kept_shape(x.shape(), ax);
  int64_t count = 1;
  for (auto a : ax) count *= x.shape()[a];
  if (mean && count == 0) fail(std::string(op) + ": mean over an empty axis of " + describe(x));
  Tensor out;
  if (x.numel() == 0) {
    out = zeros(keep, x.dtype());
  } else {
    const double scale = mean ? 1.0 / (double)count : 1.0;
    out = GRAFT_DISPATCH_FLOAT(x.dtype(), op, [&] { return sum_axes<T>(x, ax, scale); });
  }
  if (!keepdim) out = Tensor::view_of(out, dropped_shape(x.shape(), ax),
                                      contiguous_strides(dropped_shape(x.shape(), ax)), 0);
  if (autograd::needs_record({x})) {
    const double scale = mean ? 1.0 / (double)count : 1.0;
    autograd::record(op, {x}, {out}, {},
                     [xs = x.shape(), keep, scale](const Ctx&, const Tensors& dout) -> Tensors {
                       Tensor g = Tensor::view_of(dout[0], keep, contiguous_strides(keep), 0);
                       Tensor dx = contiguous(broadcast_to(g, xs));
                       return {scale == 1.0 ? dx : affine(dx, scale, 0.0)};
                     });
  }
  return out;
}

template <class T>
void max_ref(const Tensor& xc, int64_t outer, int64_t n, int64_t inner, const Tensor& out,
             const Tensor& idx) {
  const T* p = xc.data<T>();
  T* po = out.data<T>();
  int64_t* pi = idx.data<int64_t>();
#pragma omp parallel for if (outer * n * inner > kern::kParallelGrain)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      T bv = p[o * n * inner + i];
      for (int64_t k = 1; k < n; ++k) {
        const T v = p[(o * n + k) * inner + i];
        if (v > bv || (std::isnan(v) && !std::isnan(bv))) bv = v, best = k;
      }
      po[o * inner + i] = bv;
      pi[o * inner + i] = best;
    }
}

template <class T>
void max_bwd_ref(const Tensor& dout, const Tensor& idx, int64_t outer, int64_t n, int64_t inner,
                 const Tensor& dx) {
  const T* pd = dout.data<T>();
  const int64_t* pi = idx.data<int64_t>();
  T* px = dx.data<T>();
  std::fill(px, px + dx.numel(), T(0));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) px[(o * n + pi[o * inner + i]) * inner + i] += pd[o * inner + i];
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_sum("sum", x, axes, keepdim, false);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return reduce_sum("mean", x, axes, keepdim, true);
}

Tensor max(const Tensor& x, int64_t axis, bool keepdim) {
  kern::check_float("max", x);
  const int64_t ax = norm_axis("max", axis, x.dim());
  const int64_t n = x.shape()[ax];
  if (n == 0) fail("max: axis " + std::to_string(axis) + " of " + describe(x) + " is empty");
  int64_t inner = 1, outer = 1;
  for (int64_t d = ax + 1; d < x.dim(); ++d) inner *= x.shape()[d];
  for (int64_t d = 0; d < ax; ++d) outer *= x.shape()[d];
  Shape keep = x.shape();
  keep[ax] = 1;
  Tensor out = Tensor::empty(keep, x.dtype());
  Tensor idx = Tensor::empty(keep, DType::i64);
  Tensor xc = kern::contig(x);
  GRAFT_DISPATCH_FLOAT(x.dtype(), "max", [&] { max_ref<T>(xc, outer, n, inner, out, idx); });
  if (!keepdim) {
    Shape d = x.shape();
    d.erase(d.begin() + ax);
    out = Tensor::view_of(out, d, contiguous_strides(d), 0);
  }
  if (autograd::needs_record({x})) {
    autograd::record("max", {x}, {out}, {idx},
                     [xs = x.shape(), outer, n, inner](const Ctx& c, const Tensors& dout) -> Tensors {
                       Tensor dx = Tensor::empty(xs, dout[0].dtype());
                       GRAFT_DISPATCH_FLOAT(dx.dtype(), "max", [&] {
                         max_bwd_ref<T>(dout[0], c.saved[0], outer, n, inner, dx);
                       });
                       return {dx};
                     });
  }
  return out;
}

Tensor var(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, int64_t correction) {
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
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - (int64_t)shape.size();
  if (lead < 0 || kern::broadcast_shapes("sum_to", x.shape(), shape) != x.shape())
    fail("sum_to: cannot reduce " + describe(x) + " to shape " + shape_str(shape));
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) axes.push_back(i);
  Tensor s = axes.empty() ? x : sum(x, axes, true);
  return reshape(s, shape);
}

GRAFT_OP_CASE({.name = "sum/axes_keepdim", .op = "sum",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({2, 3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return sum(x[0], {0, -1}, true); }});
GRAFT_OP_CASE({.name = "sum/all", .op = "sum",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input({3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return sum(x[0]); }});
GRAFT_OP_CASE({.name = "sum/size1_axis", .op = "sum",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({1, 3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return sum(x[0], {0}); }});
GRAFT_OP_CASE({.name = "mean/axis", .op = "mean",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({2, 3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return mean(x[0], {1}); }});
GRAFT_OP_CASE({.name = "max/axis", .op = "max",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({2, 3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return max(x[0], 1, true); }});
GRAFT_OP_CASE({.name = "var/unbiased", .op = "var",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({2, 3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return var(x[0], {-1}); }});
GRAFT_OP_CASE({.name = "var/biased_all", .op = "var",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input({3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return var(x[0], {}, false, 0); }});
GRAFT_OP_CASE({.name = "sum_to/broadcast", .op = "sum_to",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({2, 3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return sum_to(x[0], {3, 1}); }});

}  // namespace graft
