// softmax and log_softmax over one axis. float32 runs the oneDNN softmax / logsoftmax forward
// and an OpenMP backward loop (see below); float64 runs reference loops. Both save only the output
// y:
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
#include "graft/ops/softmax.h"

#include <cmath>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/reduce.h"
#include "ops/internal/dnnl_utils.h"
#include "ops/internal/kernels.h"

namespace graft {

namespace {

// Each (outer, inner) slice is handled by one thread, in a fixed order along the axis. S is the
// storage type: 16-bit elements are widened as they are read, the arithmetic is float32's, and
// each output is rounded once.
template <class S>
void softmax_loop(const Tensor& x, const Tensor& y, int64_t axis, bool log) {
  using T = kern::acc_t<S>;
  const Split3 sl = split3(x.shape(), axis);
  const S* px = x.data<S>();
  S* py = y.data<S>();
  const int64_t n = sl.outer * sl.inner;
#pragma omp parallel for if (x.numel() > kern::kParallelGrain) schedule(static)
  for (int64_t s = 0; s < n; ++s) {
    const int64_t base = (s / sl.inner) * sl.n * sl.inner + s % sl.inner, st = sl.inner;
    T mx = T(px[base]);
    for (int64_t i = 1; i < sl.n; ++i) mx = std::max(mx, T(px[base + i * st]));
    T sum = 0;
    for (int64_t i = 0; i < sl.n; ++i) sum += std::exp(T(px[base + i * st]) - mx);
    if (log) {
      // (x - mx) - log(sum): x - (mx + log(sum)) would round mx + log(sum) at |mx|'s scale first
      // and lose the small results (log_softmax([10, 0])[0] = -4.54e-5).
      const T ls = std::log(sum);
      for (int64_t i = 0; i < sl.n; ++i) py[base + i * st] = S((T(px[base + i * st]) - mx) - ls);
    } else {
      for (int64_t i = 0; i < sl.n; ++i)
        py[base + i * st] = S(std::exp(T(px[base + i * st]) - mx) / sum);
    }
  }
}

template <class T>
void softmax_backward_loop(const Tensor& y, const Tensor& dy, const Tensor& dx, int64_t axis,
                           bool log) {
  const Split3 sl = split3(y.shape(), axis);
  const T* py = y.data<T>();
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  const int64_t n = sl.outer * sl.inner;
#pragma omp parallel for if (y.numel() > kern::kParallelGrain) schedule(static)
  for (int64_t s = 0; s < n; ++s) {
    const int64_t base = (s / sl.inner) * sl.n * sl.inner + s % sl.inner, st = sl.inner;
    T dot = 0;
    for (int64_t i = 0; i < sl.n; ++i)
      dot += log ? pdy[base + i * st] : pdy[base + i * st] * py[base + i * st];
    for (int64_t i = 0; i < sl.n; ++i) {
      const int64_t o = base + i * st;
      pdx[o] = log ? pdy[o] - std::exp(py[o]) * dot : py[o] * (pdy[o] - dot);
    }
  }
}

// oneDNN has separate primitives for softmax and logsoftmax with the same shape of API.
template <class Fwd>
typename Fwd::primitive_desc fwd_pd(const dnnl::memory::desc& d, int axis, dnnl::prop_kind kind) {
  return typename Fwd::primitive_desc(typename Fwd::desc(kind, d, axis), onednn::user_scratchpad(),
                                      onednn::engine());
}

template <class Fwd>
void forward_f32(const Tensor& x, const Tensor& y, int axis, bool training) {
  onednn::Key key{axis, training};
  onednn::append_geometry(key, x);
  const auto& c = onednn::cached<Fwd>(key, [&] {
    auto d = onednn::md(x);
    const auto kind =
        training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    return onednn::Cached<Fwd>{Fwd(fwd_pd<Fwd>(d, axis, kind)), {d}};
  });
  onednn::run(c, {{DNNL_ARG_SRC, c.mds[0], x.raw()}, {DNNL_ARG_DST, c.mds[0], y.raw()}});
}

// oneDNN 2.6 runs its softmax backward on the reference kernel (ref:any: 21 ms for 32768x128,
// measured); the OpenMP loop is the same formula and ~10x faster, so both precisions use it.
Tensor softmax_like_backward(const Tensor& dy, const Tensor& y, const char* op, int64_t axis,
                             bool log) {
  Tensor dx = Tensor::empty(y.shape(), y.dtype());
  if (dx.numel() > 0)
    GRAFT_DISPATCH_FLOAT(y.dtype(), op, [&] { softmax_backward_loop<T>(y, dy, dx, axis, log); });
  return dx;
}

// softmax: dx = y * (dy - sum(dy * y)) along axis; recorded ops under create_graph (y is the
// op's own output, so its second derivative runs through this op again).
Tensor softmax_backward(const Tensor& dy, const Tensor& y, int64_t axis, bool create_graph) {
  if (create_graph) return mul(y, sub(dy, sum(mul(dy, y), {axis}, true)));
  return softmax_like_backward(dy, y, "softmax", axis, false);
}

// log_softmax: dx = dy - exp(y) * sum(dy) along axis; recorded ops under create_graph.
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y, int64_t axis, bool create_graph) {
  if (create_graph) return sub(dy, mul(exp(y), sum(dy, {axis}, true)));
  return softmax_like_backward(dy, y, "log_softmax", axis, true);
}

// x (...) -> y (...) normalised along axis; shared by softmax (log = false) and log_softmax.
// 16-bit x without a tape runs softmax_loop on its elements (kern::native_half).
Tensor softmax_impl(const char* op, const Tensor& x_in, int64_t axis_in, bool log) {
  const bool native = kern::native_half(op, x_in);
  if (!native) GRAFT_VIA_F32(op, softmax_impl, op, x_in, axis_in, log);
  kern::check_float(op, x_in);
  // A scalar is a one-element vector here (as torch treats dim 0/-1 of a 0-d tensor).
  const int64_t axis = norm_axis(op, axis_in, std::max<int64_t>(x_in.dim(), 1));
  const Tensor x = kern::contig(x_in);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  if (native) {
    if (y.numel() > 0) GRAFT_DISPATCH_HALF(x.dtype(), [&] { softmax_loop<S>(x, y, axis, log); });
    return y;
  }
  const bool record = autograd::needs_record({x_in});
  if (y.numel() > 0) {
    // oneDNN's softmax drops a NaN (and turns a +inf row finite): such a row must be all NaN.
    if (onednn::usable(x) && !kern::has_nan(x.data<float>(), x.numel(), /*pos_inf=*/true)) {
      if (log) forward_f32<dnnl::logsoftmax_forward>(x, y, (int)axis, record);
      else forward_f32<dnnl::softmax_forward>(x, y, (int)axis, record);
    } else {
      GRAFT_DISPATCH_FLOAT(x.dtype(), op, [&] { softmax_loop<T>(x, y, axis, log); });
    }
  }
  if (record)
    autograd::record(
        op, {x_in}, {y}, {y}, [axis, log](const autograd::Ctx& c, const Tensors& dout) {
          return Tensors{log ? log_softmax_backward(dout[0], c.saved[0], axis, c.create_graph)
                             : softmax_backward(dout[0], c.saved[0], axis, c.create_graph)};
        });
  return y;
}

}  // namespace

// softmax: x (...) -> y (...), y = exp(x - max) / sum(exp(x - max)) along axis
GRAFT_DECLARE_OP("softmax", "softmax");

Tensor softmax(const Tensor& x, int64_t axis) { return softmax_impl("softmax", x, axis, false); }

// log_softmax: x (...) -> y (...), y = x - max - log(sum(exp(x - max))) along axis
GRAFT_DECLARE_OP("log_softmax", "softmax");

Tensor log_softmax(const Tensor& x, int64_t axis) {
  return softmax_impl("log_softmax", x, axis, true);
}

}  // namespace graft
