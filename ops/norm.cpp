// layer_norm and rms_norm over the last dim. rms_norm runs one OpenMP row loop in both dtypes.
// layer_norm: float32 runs oneDNN layer_normalization forward (training:
// it also returns the per-row mean and variance the backward needs); float64 runs the reference
// loop. The backward is one OpenMP row loop for both (llm.c's layernorm_backward formulas), which
// rebuilds the normalised rows from the output where that is exact enough (see
// kMaxShiftOverScale): oneDNN 2.6's backward needs the input, and runs its non-jit "simple" kernel.
#include "graft/ops/norm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include "autograd/internal/parallel.h"
#include "graft/autograd/gradcheck.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/reduce.h"
#include "graft/ops/shape.h"
#include "ops/internal/dnnl_utils.h"
#include "ops/internal/kernels.h"

namespace graft {

namespace {

// One row: yr = (xr - m) * rstd * w + b (w, b null: 1, 0) with m and v (biased) the row's mean
// and variance, handed out too.
template <class T>
void normalize_row(const T* xr, int64_t C, const T* pw, const T* pb, double eps, T* yr, T& m,
                   T& v) {
  m = 0;
#pragma omp simd reduction(+ : m)
  for (int64_t i = 0; i < C; ++i) m += xr[i];
  m /= T(C);
  v = 0;
#pragma omp simd reduction(+ : v)
  for (int64_t i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
  v /= T(C);
  const T rstd = T(1) / std::sqrt(v + T(eps));
#pragma omp simd
  for (int64_t i = 0; i < C; ++i)
    yr[i] = (xr[i] - m) * rstd * (pw ? pw[i] : T(1)) + (pb ? pb[i] : T(0));
}

// x (N rows of C, contiguous, any shape), w/b (C) or undefined -> y (like x), mean (N) and var
// (N, biased) where defined (inference needs neither). With r (like x), the rows normalised are
// x + r (add_layer_norm), written to s when s is defined. One pass per row: the row (or its sum)
// is read once from memory.
template <class T>
void layer_norm_loop(int64_t N, int64_t C, const Tensor& x, const Tensor& r, const Tensor& w,
                     const Tensor& b, double eps, const Tensor& y, const Tensor& mean,
                     const Tensor& var, const Tensor& s) {
  const T* px = x.data<T>();
  const T* pr = r.defined() ? r.data<T>() : nullptr;
  const T* pw = w.defined() ? w.data<T>() : nullptr;
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  T* py = y.data<T>();
  T* pm = mean.defined() ? mean.data<T>() : nullptr;
  T* pv = var.defined() ? var.data<T>() : nullptr;
  T* ps = s.defined() ? s.data<T>() : nullptr;
  detail::parallel_for_scratch(
      N, N * C > kern::kParallelGrain, [&] { return std::vector<T>(pr && !ps ? C : 0); },
      [&](int64_t n, std::vector<T>& buf) {
        const T* xr = px + n * C;
        if (pr) {
          T* sr = ps ? ps + n * C : buf.data();
#pragma omp simd
          for (int64_t i = 0; i < C; ++i) sr[i] = xr[i] + pr[n * C + i];
          xr = sr;
        }
        T m, v;
        normalize_row(xr, C, pw, pb, eps, py + n * C, m, v);
        if (pm) pm[n] = m;
        if (pv) pv[n] = v;
      });
}

// t (C, 16-bit) or undefined -> its values as floats (empty when undefined).
template <class S>
std::vector<float> widened(const Tensor& t) {
  std::vector<float> out(t.defined() ? t.numel() : 0);
  if (t.defined()) to_float(t.data<const S>(), out.data(), t.numel());
  return out;
}

// layer_norm_loop for 16-bit x, r, w, b, y without a tape: each row widened into the thread's
// float32 buffer (x + r added there), normalised in float32, rounded once into y. w and b are
// widened once per call.
template <class S>
void layer_norm_half_loop(int64_t N, int64_t C, const Tensor& x, const Tensor& r, const Tensor& w,
                          const Tensor& b, double eps, const Tensor& y) {
  const S* px = x.data<const S>();
  const S* pr = r.defined() ? r.data<const S>() : nullptr;
  S* py = y.data<S>();
  const std::vector<float> wf = widened<S>(w), bf = widened<S>(b);
  detail::parallel_for_scratch(
      N, N * C > kern::kParallelGrain, [&] { return std::vector<float>(2 * C); },
      [&](int64_t n, std::vector<float>& buf) {
        float *xr = buf.data(), *yr = xr + C;
        to_float(px + n * C, xr, C);
        if (pr) {
          to_float(pr + n * C, yr, C);
#pragma omp simd
          for (int64_t i = 0; i < C; ++i) xr[i] += yr[i];
        }
        float m, v;
        normalize_row(xr, C, wf.empty() ? nullptr : wf.data(), bf.empty() ? nullptr : bf.data(),
                      eps, yr, m, v);
        from_float(yr, py + n * C, C);
      });
}

// layer_norm (r undefined) or add_layer_norm (x + r) of 16-bit tensors without a tape:
// layer_norm_half_loop on the 16-bit rows, nothing kept.
Tensor layer_norm_half(const Tensor& x_in, const Tensor& r_in, const Tensor& w_in,
                       const Tensor& b_in, double eps) {
  const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
  const Tensor x = kern::contig(x_in), r = r_in.defined() ? kern::contig(r_in) : Tensor();
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  const Tensor b = b_in.defined() ? kern::contig(b_in) : Tensor();
  Tensor y = Tensor::empty(x_in.shape(), x_in.dtype());
  if (y.numel() > 0)
    GRAFT_DISPATCH_HALF(x.dtype(), [&] { layer_norm_half_loop<S>(N, C, x, r, w, b, eps, y); });
  return y;
}

// The backward needs the normalised rows xhat. It is rebuilt from the output when that is
// exact enough, xhat = (y - b) / w, so the op keeps y (which the next op keeps anyway) instead of
// x (otherwise dead after the forward; for a post-LN Transformer that is one (tokens, d) buffer
// per LayerNorm). The float32 error of that rebuild is about eps32 * (|xhat| + |b / w|), so it
// is used only when every channel has w != 0 and |b| <= kMaxShiftOverScale * |w|; otherwise the
// op keeps x and xhat = (x - mean) * rstd, as PyTorch does. A 16-bit y (unit roundoff u16 of
// 2^-9 in bf16) makes that error u16 * (|xhat| + |b / w|): 0.25 in xhat at |b| = 64 |w|, so the
// 16-bit entry rebuilds from y only when |b| <= |w| (kMaxShiftOverScaleHalf: error <= ~2 u16).
constexpr double kMaxShiftOverScale = 64;
constexpr double kMaxShiftOverScaleHalf = 1;

template <class T>
bool xhat_from_output(const Tensor& w, const Tensor& b, double max_shift = kMaxShiftOverScale) {
  const int64_t C = w.defined() ? w.numel() : b.defined() ? b.numel() : 0;
  const T* pw = w.defined() ? w.data<const T>() : nullptr;
  const T* pb = b.defined() ? b.data<const T>() : nullptr;
  for (int64_t i = 0; i < C; ++i) {
    const double wi = pw ? (double)pw[i] : 1.0, bi = pb ? (double)pb[i] : 0.0;
    if (!(wi != 0 && std::fabs(bi) <= max_shift * std::fabs(wi))) return false;  // NaN too
  }
  return true;
}

// dw[i] = sum over blocks of part[blk][0][i], db[i] = sum of part[blk][1][i] (where non-null),
// in block order; part holds (blocks, 2, C).
template <class T>
void add_block_sums(const T* part, int64_t blocks, int64_t C, T* dw, T* db) {
#pragma omp parallel for if (blocks * C > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < C; ++i) {
    T sw = 0, sb = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      sw += part[2 * blk * C + i];
      sb += part[2 * blk * C + C + i];
    }
    if (dw) dw[i] = sw;
    if (db) db[i] = sb;
  }
}

// dx (N, C) and dw/db (C) where non-null, from dy and src = y (FromY) or x, all (N, C)
// contiguous. With dnorm = dy * w: dx = (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)) * rstd,
// dw = sum_rows dy * xhat, db = sum_rows dy. The column sums go through per-block partial sums
// (blocks of rows fixed by N alone) added in block order: the result does not depend on the
// thread count.
template <class T, bool FromY>
void layer_norm_backward_rows(const T* src, const T* dy, const T* w, const T* b, const T* mean,
                              const T* var, double eps, int64_t N, int64_t C, T* dx, T* dw, T* db) {
  std::vector<T> inv_w(C, T(1));
  if (FromY && w)
    for (int64_t i = 0; i < C; ++i) inv_w[i] = T(1) / w[i];
  const int64_t rows_per_block = std::max<int64_t>(8, (N + 255) / 256);
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  const bool sums = dw || db;
  std::vector<T> part(sums ? 2 * blocks * C : 0);
#pragma omp parallel if (N * C > kern::kParallelGrain)
  {
    std::vector<T> xhat_buf(C);
    T* __restrict xhat = xhat_buf.data();
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      T* __restrict pw_sum = sums ? part.data() + 2 * blk * C : nullptr;
      T* __restrict pb_sum = sums ? pw_sum + C : nullptr;
      if (sums)
        for (int64_t i = 0; i < 2 * C; ++i) pw_sum[i] = 0;
      for (int64_t n = blk * rows_per_block; n < std::min(N, (blk + 1) * rows_per_block); ++n) {
        const T* __restrict sr = src + n * C;
        const T* __restrict gr = dy + n * C;
        const T rstd = T(1) / std::sqrt(var[n] + T(eps));
        const T m = FromY ? T(0) : mean[n];
        T s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t i = 0; i < C; ++i) {
          const T xh = FromY ? (sr[i] - (b ? b[i] : T(0))) * inv_w[i] : (sr[i] - m) * rstd;
          const T dn = gr[i] * (w ? w[i] : T(1));
          xhat[i] = xh;
          s1 += dn;
          s2 += dn * xh;
        }
        s1 /= T(C);
        s2 /= T(C);
        if (dx) {
          T* __restrict dr = dx + n * C;
#pragma omp simd
          for (int64_t i = 0; i < C; ++i)
            dr[i] = (gr[i] * (w ? w[i] : T(1)) - s1 - xhat[i] * s2) * rstd;
        }
        if (sums) {
#pragma omp simd
          for (int64_t i = 0; i < C; ++i) {
            pw_sum[i] += gr[i] * xhat[i];
            pb_sum[i] += gr[i];
          }
        }
      }
    }
  }
  if (sums) add_block_sums(part.data(), blocks, C, dw, db);
}

dnnl::normalization_flags ln_flags(bool scale, bool shift) {
  auto f = dnnl::normalization_flags::none;
  if (scale) f = f | dnnl::normalization_flags::use_scale;
  if (shift) f = f | dnnl::normalization_flags::use_shift;
  return f;
}

dnnl::layer_normalization_forward::primitive_desc ln_fwd_pd(const dnnl::memory::desc& d,
                                                            const dnnl::memory::desc& stat,
                                                            double eps, dnnl::normalization_flags f,
                                                            dnnl::prop_kind kind) {
  using lnf = dnnl::layer_normalization_forward;
  return lnf::primitive_desc(lnf::desc(kind, d, stat, (float)eps, f), onednn::user_scratchpad(),
                             onednn::engine());
}

}  // namespace

// layer_norm: x (..., C), w (C), b (C) -> y (..., C); saves y (or x), w, b, mean, var (N)
GRAFT_DECLARE_OP("layer_norm", "norm");

namespace {

// layer_norm's (or add_layer_norm's) argument checks; the message names every shape.
void check_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                      const char* op = "layer_norm") {
  kern::check_float(op, x);
  auto what = [&] {
    return std::string(op) + ": x " + describe(x) +
           (w.defined() ? ", w " + describe(w) : std::string()) +
           (b.defined() ? ", b " + describe(b) : std::string());
  };
  if (x.dim() < 1) fail(what() + ": x needs at least 1 dim");
  const int64_t C = x.shape().back();
  for (const Tensor* p : {&w, &b}) {
    if (!p->defined()) continue;
    if (p->dtype() != x.dtype()) fail(what() + ": dtype mismatch");
    if (p->dim() != 1 || p->shape()[0] != C)
      fail(what() + ": " + (p == &w ? "w" : "b") + " must be (" + std::to_string(C) + ")");
  }
  if (!(eps >= 0)) fail(what() + ": eps " + std::to_string(eps) + " must be >= 0");
}

// float32 forward through oneDNN layer_normalization; in training it also hands out the per-row
// mean and variance the backward needs.
void layer_norm_forward_f32(const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                            const Tensor& y, const Tensor& mean, const Tensor& var, bool training) {
  using lnf = dnnl::layer_normalization_forward;
  const int64_t C = x.shape().back();
  onednn::Key key{(int64_t)std::bit_cast<uint64_t>(eps), w.defined(), b.defined(), training};
  onednn::append_geometry(key, x);
  onednn::append_geometry(key, mean);
  const auto& c = onednn::cached<lnf>(key, [&] {
    auto d = onednn::md(x), stat = onednn::md(mean), cm = onednn::md_contiguous({C});
    const auto kind =
        training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    return onednn::Cached<lnf>{
        lnf(ln_fwd_pd(d, stat, eps, ln_flags(w.defined(), b.defined()), kind)), {d, stat, cm}};
  });
  onednn::run(c, {{DNNL_ARG_SRC, c.mds[0], x.raw()},
                  {DNNL_ARG_DST, c.mds[0], y.raw()},
                  {DNNL_ARG_MEAN, c.mds[1], training ? mean.raw() : nullptr},
                  {DNNL_ARG_VARIANCE, c.mds[1], training ? var.raw() : nullptr},
                  {DNNL_ARG_SCALE, c.mds[2], w.defined() ? w.raw() : nullptr},
                  {DNNL_ARG_SHIFT, c.mds[2], b.defined() ? b.raw() : nullptr}});
}

// layer_norm's forward without recording: y, and the rows' mean and variance (N) when `record`
// (the backward reads them) or oneDNN writes them. oneDNN or the loop as kern::loop_beats_onednn
// picks for a recorded call or not, so a 16-bit entry runs the float32 op's own arithmetic.
struct LayerNormForward {
  Tensor y, mean, var;
};
LayerNormForward layer_norm_forward(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in,
                                    double eps, bool record) {
  const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
  const Tensor x = kern::reshaped(kern::contig(x_in), {N, C});
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  const Tensor b = b_in.defined() ? kern::contig(b_in) : Tensor();
  Tensor y = Tensor::empty(x_in.shape(), x_in.dtype());
  const bool loop =
      y.numel() > 0 && (!onednn::usable(x) || kern::loop_beats_onednn(y.numel(), record));
  Tensor mean, var;  // the loop without a tape writes neither
  if (record || !loop) mean = Tensor::empty({N}, x.dtype()), var = Tensor::empty({N}, x.dtype());
  if (loop)
    GRAFT_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
      layer_norm_loop<T>(N, C, x, Tensor(), w, b, eps, y, mean, var, Tensor());
    });
  else if (y.numel() > 0) layer_norm_forward_f32(x, w, b, eps, y, mean, var, record);
  return {y, mean, var};
}

// What layer_norm's (and add_layer_norm's) forward keeps for its backward, in the order of its
// saved tensors: src = y when from_y (then b is the shift used to rebuild xhat and mean is
// unused) or x (..., C); w, b (C) or undefined; mean, var (N rows); and the forward's options.
struct LayerNormSaved {
  Tensor src, w, b, mean, var;
  double eps = 0;
  bool from_y = false, has_w = false, has_b = false;
};

LayerNormSaved layer_norm_saved(const Tensors& s, double eps, bool from_y, bool has_w, bool has_b) {
  return {s[0], s[1], s[2], s[3], s[4], eps, from_y, has_w, has_b};
}

// dy (..., C) -> dx (..., C), dw (C), db (C) where needed.
Tensors layer_norm_backward(const Tensor& dout, const LayerNormSaved& s,
                            const std::vector<bool>& needs) {
  const Tensor &src_in = s.src, &w_in = s.w, &b_in = s.b, &mean = s.mean, &var = s.var;
  const double eps = s.eps;
  const bool from_y = s.from_y, has_w = s.has_w, has_b = s.has_b;
  const int64_t C = src_in.shape().back(), N = C ? src_in.numel() / C : 0;
  const Tensor src = kern::contig(src_in), dy = kern::contig(dout);
  const Tensor w = has_w ? kern::contig(w_in) : Tensor();
  const Tensor b = from_y && has_b ? kern::contig(b_in) : Tensor();
  Tensor dx = needs[0] ? Tensor::empty(src_in.shape(), src_in.dtype()) : Tensor();
  Tensor dw = has_w && needs[1] ? Tensor::empty({C}, src.dtype()) : Tensor();
  Tensor db = has_b && needs[2] ? Tensor::empty({C}, src.dtype()) : Tensor();
  if (src.numel() == 0) {
    for (auto* g : {&dx, &dw, &db})
      if (g->defined()) fill_(*g, 0);
    return {dx, dw, db};
  }
  GRAFT_DISPATCH_FLOAT(src.dtype(), "layer_norm", [&] {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    auto run = [&](auto from_y_tag) {
      layer_norm_backward_rows<T, decltype(from_y_tag)::value>(
          src.data<const T>(), dy.data<const T>(), ptr(w), ptr(b), ptr(mean), var.data<const T>(),
          eps, N, C, ptr(dx), ptr(dw), ptr(db));
    };
    if (from_y) run(std::true_type());
    else run(std::false_type());
  });
  return {dx, dw, db};
}

// The per-row statistic (N) as (..., 1) of x's leading shape, for broadcasting over a row.
Tensor per_row(const Tensor& stat, const Shape& x_shape) {
  Shape keep = x_shape;
  keep.back() = 1;
  return reshape(stat, keep);
}

// layer_norm written with recorded ops, returning its two tape outputs: y and the rows' biased
// variance (N). The backward under create_graph differentiates it when x was saved.
Tensors layer_norm_composed(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const Tensor xc = sub(x, mean(x, {-1}, true));
  const Tensor var = mean(mul(xc, xc), {-1}, true);
  Tensor y = mul(xc, pow(affine(var, 1, eps), -0.5));
  if (w.defined()) y = mul(y, w);
  if (b.defined()) y = add(y, b);
  return {y, reshape(var, {var.numel()})};
}

// x's normalised rows rebuilt from y = xhat w + b (recorded ops: y and the variance are this op's
// own outputs, so what is built from them differentiates through it again).
Tensor xhat_from_y(const Tensor& y, const Tensor& w, const Tensor& b) {
  Tensor xhat = b.defined() ? sub(y, b) : y;
  return w.defined() ? div(xhat, w) : xhat;
}

// layer_norm's backward as recorded ops from y and the variance (both routed to the op itself):
// dx = (g - mean(g) - xhat mean(g xhat)) / sigma + dvar 2 xhat sigma / C with g = dy w, sigma =
// sqrt(var + eps); dw = dy xhat and db = dy (the tape sums them to (C)).
Tensors layer_norm_backward_from_y_graph(const Tensor& dy, const Tensor& dvar, const Tensor& y,
                                         const Tensor& w, const Tensor& b, const Tensor& var,
                                         double eps) {
  const double C = (double)y.shape().back();
  const Tensor xhat = xhat_from_y(y, w, b);
  const Tensor sigma = sqrt(affine(per_row(var, y.shape()), 1, eps));
  const Tensor g = w.defined() ? mul(dy, w) : dy;
  const Tensor centred =
      sub(sub(g, mean(g, {-1}, true)), mul(xhat, mean(mul(g, xhat), {-1}, true)));
  const Tensor dx =
      add(div(centred, sigma), mul(per_row(dvar, y.shape()), affine(mul(xhat, sigma), 2.0 / C, 0)));
  return {dx, w.defined() ? mul(dy, xhat) : Tensor(), b.defined() ? dy : Tensor()};
}

// The gradient that reaches the variance output (only ever from a backward recorded under
// create_graph) added to dx: dvar * 2 (x - mean) / C, x - mean = xhat sigma rebuilt from y when
// from_y. Not recorded.
void add_variance_gradient(Tensor& dx, const Tensor& dvar, const LayerNormSaved& s) {
  bool any = false;
  for (double v : dvar.to_vector<double>()) any |= v != 0;
  if (!any || !dx.defined()) return;
  autograd::NoGrad raw;
  const Shape& shape = s.src.shape();
  const Tensor centred =
      s.from_y ? mul(xhat_from_y(s.src, s.w, s.b), sqrt(affine(per_row(s.var, shape), 1, s.eps)))
               : sub(s.src, per_row(s.mean, shape));
  dx = add(dx, mul(per_row(dvar, shape), affine(centred, 2.0 / (double)shape.back(), 0)));
}

// The saved tensors of layer_norm_half_recorded: the 16-bit source of xhat (y itself, or x; none
// for add_layer_norm with x and r kept: their sum is rebuilt), w, b, the float32 mean and variance,
// x and r (without from_y; r only for add_layer_norm), and the 16-bit variance output (for the
// backward under create_graph).
enum HalfSaved : size_t { kSrc, kW, kB, kMean, kVar, kX, kR, kVar16 };

// How a 16-bit layer norm entry was recorded: for its backward.
struct HalfNormEntry {
  double eps;
  bool from_y, has_r, has_w, has_b;
  DType dt;
};

// The backward of layer_norm_half_recorded under create_graph with x kept: the float32 composed
// forward between recorded casts, differentiated (as the float32 op's own backward does).
Tensors half_norm_composed_backward(const autograd::Ctx& c, const Tensors& dout,
                                    const HalfNormEntry& e) {
  const Tensors& s = c.saved;
  auto lift = [](const Tensor& t) { return t.defined() ? to_dtype(t, DType::f32) : t; };
  const Tensors in = e.has_r ? Tensors{s[kX], s[kR], s[kW]} : Tensors{s[kX], s[kW]};
  Tensors g = autograd::differentiate(
      [e, lift](const Tensors& in) {
        const Tensor x = e.has_r ? add(lift(in[0]), lift(in[1])) : lift(in[0]);
        const Tensors o = layer_norm_composed(x, lift(in.back()), Tensor(), e.eps);
        return Tensors{to_dtype(o[0], e.dt), to_dtype(o[1], e.dt)};
      },
      in, dout, c.needs);
  g.push_back(e.has_b ? dout[0] : Tensor());  // b is not kept with x; db = dy whatever it is
  return g;
}

// The float32 source of xhat for the first-order backward: the saved 16-bit y or x widened, or
// for add_layer_norm with x kept the sum widened(x) + widened(r), bit for bit the forward's
// float32 sum (mean and variance are of that sum; a rounded 16-bit sum would be off by
// u16 * |mean| / std in xhat).
Tensor half_norm_source(const Tensors& s, const HalfNormEntry& e) {
  if (e.from_y || !e.has_r) return kern::widened(s[kSrc]);
  autograd::NoGrad raw;
  return add(kern::widened(s[kX]), kern::widened(s[kR]));
}

// The backward of layer_norm_half_recorded. First order: layer_norm's float32 backward on
// float32 copies of the saved tensors, rounded back. Under create_graph: the float32 formulas as
// recorded ops between recorded casts, as the float32 op's own backward under create_graph.
Tensors half_norm_backward(const autograd::Ctx& c, const Tensors& dout, const HalfNormEntry& e) {
  if (c.create_graph && !e.from_y) return half_norm_composed_backward(c, dout, e);
  const Tensors& s = c.saved;
  const size_t r = e.has_r ? 1 : 0;  // w and b come after x (and r)
  const std::vector<bool> needs{c.needs[0] || (e.has_r && c.needs[1]), c.needs[1 + r],
                                c.needs[2 + r]};
  auto lift = [](const Tensor& t) { return t.defined() ? to_dtype(t, DType::f32) : t; };
  Tensors g;
  if (c.create_graph) {
    g = layer_norm_backward_from_y_graph(lift(dout[0]), lift(dout[1]), lift(s[kSrc]), lift(s[kW]),
                                         lift(s[kB]), lift(s[kVar16]), e.eps);
    // dw and db summed over the rows in float32 (recorded) before the cast: the tape's own sum
    // would add dy * xhat rounded per element.
    for (size_t i : {1, 2})
      if (g[i].defined()) g[i] = autograd::reduce_grad(g[i], s[i == 1 ? kW : kB].shape());
    for (Tensor& t : g) t = t.defined() ? to_dtype(t, e.dt) : t;
  } else {
    const LayerNormSaved saved{half_norm_source(s, e),
                               kern::widened(s[kW]),
                               kern::widened(s[kB]),
                               s[kMean],
                               s[kVar],
                               e.eps,
                               e.from_y,
                               e.has_w,
                               e.has_b};
    g = layer_norm_backward(kern::widened(dout[0]), saved, needs);
    add_variance_gradient(g[0], kern::widened(dout[1]), saved);
    for (Tensor& t : g) t = kern::narrowed(t, e.dt);
  }
  Tensors out{c.needs[0] ? g[0] : Tensor()};
  if (e.has_r) out.push_back(c.needs[1] ? g[0] : Tensor());
  out.push_back(needs[1] ? g[1] : Tensor());
  out.push_back(needs[2] ? g[2] : Tensor());
  return out;
}

// The float32 forward of layer_norm_half_recorded on float32 copies x, r (or undefined), w, b:
// y, mean, var (add_layer_norm's loop, as the float32 op, its sum x + r not written out;
// layer_norm's forward as the recorded float32 layer_norm picks it).
LayerNormForward half_norm_forward(const Tensor& x, const Tensor& r, const Tensor& w,
                                   const Tensor& b, double eps) {
  if (!r.defined()) return layer_norm_forward(x, w, b, eps, true);
  const int64_t C = x.shape().back(), N = C ? x.numel() / C : 0;
  LayerNormForward f{Tensor::empty(x.shape(), DType::f32), Tensor::empty({N}, DType::f32),
                     Tensor::empty({N}, DType::f32)};
  if (x.numel() > 0) layer_norm_loop<float>(N, C, x, r, w, b, eps, f.y, f.mean, f.var, Tensor());
  return f;
}

// layer_norm (r undefined) or add_layer_norm of 16-bit x (and r) on the tape: the float32 code
// on float32 copies made for the call (freed after it), y and the variance rounded once, and one
// entry that saves the 16-bit y (or x and r, when xhat is not rebuilt from y) in place of
// float32 copies. Through kern::via_f32 the float32 entry saved its float32 y
// beside the 16-bit y the next linear saves (or a float32 x), and a cast per tensor.
Tensor layer_norm_half_recorded(const char* op, const Tensor& x_in, const Tensor& r_in,
                                const Tensor& w_in, const Tensor& b_in, double eps) {
  kern::count_f32_detour();
  const DType dt = x_in.dtype();
  const Tensor x = kern::widened(kern::contig(x_in));
  const Tensor r = r_in.defined() ? kern::widened(kern::contig(r_in)) : Tensor();
  const Tensor w = kern::widened(w_in), b = kern::widened(b_in);
  const bool from_y = xhat_from_output<float>(w, b, kMaxShiftOverScaleHalf);
  const LayerNormForward f = half_norm_forward(x, r, w, b, eps);
  const Tensor y16 = kern::narrowed(f.y, dt), var16 = kern::narrowed(f.var, dt);
  const Tensor src = from_y ? y16 : r_in.defined() ? Tensor() : x_in;
  const HalfNormEntry e{eps, from_y, r_in.defined(), w_in.defined(), b_in.defined(), dt};
  const Tensors inputs =
      r_in.defined() ? Tensors{x_in, r_in, w_in, b_in} : Tensors{x_in, w_in, b_in};
  autograd::record(
      op, inputs, {y16, var16},
      {src, w_in, from_y ? b_in : Tensor(), f.mean, f.var, from_y ? Tensor() : x_in,
       from_y ? Tensor() : r_in, var16},
      [e](const autograd::Ctx& c, const Tensors& dout) { return half_norm_backward(c, dout, e); });
  return y16;
}

// A layer norm of 16-bit tensors on the tape: layer_norm_half_recorded.
bool half_recorded(const char* op, const Tensor& x, const Tensor& r, const Tensor& w,
                   const Tensor& b) {
  return kern::half_dtype_of(op, x, r, w, b) && autograd::needs_record({x, r, w, b});
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, double eps) {
  if (kern::native_half("layer_norm", x_in, w_in, b_in)) {
    check_layer_norm(x_in, w_in, b_in, eps);
    return layer_norm_half(x_in, Tensor(), w_in, b_in, eps);
  }
  if (half_recorded("layer_norm", x_in, Tensor(), w_in, b_in)) {
    check_layer_norm(x_in, w_in, b_in, eps);
    return layer_norm_half_recorded("layer_norm", x_in, Tensor(), w_in, b_in, eps);
  }
  GRAFT_VIA_F32("layer_norm", layer_norm, x_in, w_in, b_in, eps);
  check_layer_norm(x_in, w_in, b_in, eps);
  const bool record = autograd::needs_record({x_in, w_in, b_in});
  const LayerNormForward f = layer_norm_forward(x_in, w_in, b_in, eps, record);
  const Tensor &y = f.y, &mean = f.mean, &var = f.var;
  if (!record) return y;
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  const Tensor b = b_in.defined() ? kern::contig(b_in) : Tensor();
  bool from_y = false;
  GRAFT_DISPATCH_FLOAT(x_in.dtype(), "layer_norm", [&] { from_y = xhat_from_output<T>(w, b); });
  // Saved: y or x (see kMaxShiftOverScale), w, b (only to rebuild xhat from y), mean (only
  // with x), var. All as given, so in-place changes to them are caught. The variance is a second
  // output of the entry, so the backward under create_graph, built from y and it, can be
  // differentiated again (nothing else reads it; its gradient is zero otherwise).
  autograd::record(
      "layer_norm", {x_in, w_in, b_in}, {y, var},
      {from_y ? y : x_in, w_in, from_y ? b_in : Tensor(), from_y ? Tensor() : mean, var},
      [eps, from_y, has_w = w_in.defined(), has_b = b_in.defined()](const autograd::Ctx& c,
                                                                    const Tensors& dout) {
        const Tensors& s = c.saved;
        if (c.create_graph && from_y)
          return layer_norm_backward_from_y_graph(dout[0], dout[1], s[0], s[1], s[2], s[4], eps);
        if (c.create_graph) {  // b is not kept with x; db = dy whatever it is
          Tensors g = autograd::differentiate(
              [eps](const Tensors& in) { return layer_norm_composed(in[0], in[1], Tensor(), eps); },
              {s[0], s[1]}, dout, c.needs);
          g.push_back(has_b ? dout[0] : Tensor());
          return g;
        }
        const LayerNormSaved saved = layer_norm_saved(s, eps, from_y, has_w, has_b);
        Tensors g = layer_norm_backward(dout[0], saved, c.needs);
        add_variance_gradient(g[0], dout[1], saved);
        return g;
      });
  return y;
}

GRAFT_DECLARE_OP("add_layer_norm", "norm");

namespace {

// add_layer_norm's argument checks (layer_norm's, and r of x's dtype and shape).
void check_add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                          double eps) {
  check_layer_norm(x, w, b, eps, "add_layer_norm");
  if (!r.defined() || r.dtype() != x.dtype() || r.shape() != x.shape())
    fail("add_layer_norm: r " + describe(r) + " must have the dtype and shape of x " + describe(x));
}

}  // namespace

// add_layer_norm: layer_norm(x + r) in one pass per row (our loop for float32 too: oneDNN's
// would need x + r written out first). The sum is written out only when the backward needs it
// (xhat not rebuildable from y, see kMaxShiftOverScale). Backward: layer_norm's, with dx handed
// to both x and r.
Tensor add_layer_norm(const Tensor& x_in, const Tensor& r_in, const Tensor& w_in,
                      const Tensor& b_in, double eps) {
  const bool native = kern::native_half("add_layer_norm", x_in, r_in, w_in, b_in);
  if (!native && half_recorded("add_layer_norm", x_in, r_in, w_in, b_in)) {
    check_add_layer_norm(x_in, r_in, w_in, b_in, eps);
    return layer_norm_half_recorded("add_layer_norm", x_in, r_in, w_in, b_in, eps);
  }
  if (!native) GRAFT_VIA_F32("add_layer_norm", add_layer_norm, x_in, r_in, w_in, b_in, eps);
  check_add_layer_norm(x_in, r_in, w_in, b_in, eps);
  if (native) return layer_norm_half(x_in, r_in, w_in, b_in, eps);
  const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
  const Tensor x = kern::contig(x_in), r = kern::contig(r_in);
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  const Tensor b = b_in.defined() ? kern::contig(b_in) : Tensor();
  const bool record = autograd::needs_record({x_in, r_in, w_in, b_in});
  bool from_y = false;  // for the backward: inference skips the scan of w and b
  if (record)
    GRAFT_DISPATCH_FLOAT(x.dtype(), "add_layer_norm", [&] { from_y = xhat_from_output<T>(w, b); });
  Tensor y = Tensor::empty(x_in.shape(), x_in.dtype());
  Tensor mean, var;  // only the backward reads them
  if (record) mean = Tensor::empty({N}, x.dtype()), var = Tensor::empty({N}, x.dtype());
  Tensor sum = record && !from_y ? Tensor::empty(x_in.shape(), x_in.dtype()) : Tensor();
  if (y.numel() > 0)
    GRAFT_DISPATCH_FLOAT(x.dtype(), "add_layer_norm",
                         [&] { layer_norm_loop<T>(N, C, x, r, w, b, eps, y, mean, var, sum); });
  if (!record) return y;
  // As layer_norm's (the variance a second output); without y to rebuild xhat from, x and r are
  // kept too, for the backward under create_graph (the sum written out is not on the tape).
  autograd::record(
      "add_layer_norm", {x_in, r_in, w_in, b_in}, {y, var},
      {from_y ? y : sum, w_in, from_y ? b_in : Tensor(), from_y ? Tensor() : mean, var,
       from_y ? Tensor() : x_in, from_y ? Tensor() : r_in},
      [eps, from_y, has_w = w_in.defined(), has_b = b_in.defined()](const autograd::Ctx& c,
                                                                    const Tensors& dout) {
        const Tensors& s = c.saved;
        const std::vector<bool> needs{c.needs[0] || c.needs[1], c.needs[2], c.needs[3]};
        Tensors g;
        if (c.create_graph && from_y) {
          g = layer_norm_backward_from_y_graph(dout[0], dout[1], s[0], s[1], s[2], s[4], eps);
        } else if (c.create_graph) {
          Tensors g = autograd::differentiate(
              [eps](const Tensors& in) {
                return layer_norm_composed(add(in[0], in[1]), in[2], Tensor(), eps);
              },
              {s[5], s[6], s[1]}, dout, c.needs);
          g.push_back(has_b ? dout[0] : Tensor());  // b is not kept with x; db = dy whatever it is
          return g;
        } else {
          const LayerNormSaved saved = layer_norm_saved(s, eps, from_y, has_w, has_b);
          g = layer_norm_backward(dout[0], saved, needs);
          add_variance_gradient(g[0], dout[1], saved);
        }
        return Tensors{c.needs[0] ? g[0] : Tensor(), c.needs[1] ? g[0] : Tensor(),
                       needs[1] ? g[1] : Tensor(), needs[2] ? g[2] : Tensor()};
      });
  return y;
}

// rms_norm: x (..., C), w (C) -> y (..., C); saves x, w, rstd (N)
GRAFT_DECLARE_OP("rms_norm", "norm");

namespace {

// x (N, C) contiguous, w (C) or null -> y (N, C), rstd (N) = 1 / sqrt(mean(x^2) + eps). Both
// dtypes (float64 is the reference; float32 the vectorised path: oneDNN 2.6's
// layer_normalization always subtracts the mean, with or without use_scale/use_shift).
template <class S>
void rms_norm_rows(const S* x, const S* w, double eps, int64_t N, int64_t C, S* y, S* rstd) {
  using T = kern::acc_t<S>;  // a 16-bit row widened per element, each output rounded once
#pragma omp parallel for if (N * C > kern::kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const S* __restrict xr = x + n * C;
    S* __restrict yr = y + n * C;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < C; ++i) ss += T(xr[i]) * T(xr[i]);
    const T r = T(1) / std::sqrt(ss / T(C) + T(eps));
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) yr[i] = S(T(xr[i]) * r * (w ? T(w[i]) : T(1)));
    if (rstd) rstd[n] = S(r);
  }
}

// With xhat = x * rstd and dn = dy * w: dx = (dn - xhat * mean(dn * xhat)) * rstd,
// dw = sum_rows dy * xhat. The column sums go through per-block partial sums added in block
// order (blocks fixed by N alone), as layer_norm's: independent of the thread count.
template <class T>
void rms_norm_backward_rows(const T* x, const T* w, const T* rstd, const T* dy, int64_t N,
                            int64_t C, T* dx, T* dw) {
  const int64_t rows_per_block = std::max<int64_t>(8, (N + 255) / 256);
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block;
  std::vector<T> part(dw ? 2 * blocks * C : 0);
#pragma omp parallel for if (N * C > kern::kParallelGrain) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    T* __restrict pw_sum = dw ? part.data() + 2 * blk * C : nullptr;
    for (int64_t n = blk * rows_per_block; n < std::min(N, (blk + 1) * rows_per_block); ++n) {
      const T* __restrict xr = x + n * C;
      const T* __restrict gr = dy + n * C;
      const T r = rstd[n];
      if (dx) {
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < C; ++i) s += gr[i] * (w ? w[i] : T(1)) * xr[i];
        s *= r * r / T(C);
        T* __restrict dr = dx + n * C;
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) dr[i] = (gr[i] * (w ? w[i] : T(1)) - xr[i] * s) * r;
      }
      if (pw_sum) {
#pragma omp simd
        for (int64_t i = 0; i < C; ++i) pw_sum[i] += gr[i] * xr[i] * r;
      }
    }
  }
  if (dw) add_block_sums<T>(part.data(), blocks, C, dw, nullptr);
}

// dy, x (..., C), w (C) or undefined, rstd (N rows) -> dx (..., C), dw (C) where needed.
Tensors rms_norm_backward(const Tensor& dout, const Tensor& x_in, const Tensor& w_in,
                          const Tensor& rstd, const std::vector<bool>& needs) {
  const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
  const Tensor x = kern::contig(x_in), dy = kern::contig(dout);
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  Tensor dx = needs[0] ? Tensor::empty(x_in.shape(), x_in.dtype()) : Tensor();
  Tensor dw = w.defined() && needs[1] ? Tensor::empty({C}, x.dtype()) : Tensor();
  if (x.numel() == 0) {
    for (auto* g : {&dx, &dw})
      if (g->defined()) fill_(*g, 0);
    return {dx, dw};
  }
  GRAFT_DISPATCH_FLOAT(x.dtype(), "rms_norm", [&] {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    rms_norm_backward_rows<T>(x.data<const T>(), ptr(w), rstd.data<const T>(), dy.data<const T>(),
                              N, C, ptr(dx), ptr(dw));
  });
  return {dx, dw};
}

// rms_norm of 16-bit tensors without a tape: rms_norm_rows on the 16-bit rows, no rstd kept.
Tensor rms_norm_half(const Tensor& x_in, const Tensor& w_in, double eps) {
  check_layer_norm(x_in, w_in, Tensor(), eps, "rms_norm");
  const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
  const Tensor x = kern::contig(x_in);
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  Tensor y = Tensor::empty(x_in.shape(), x_in.dtype());
  if (y.numel() > 0)
    GRAFT_DISPATCH_HALF(x.dtype(), [&] {
      rms_norm_rows<S>(x.data<const S>(), w.defined() ? w.data<const S>() : nullptr, eps, N, C,
                       y.data<S>(), nullptr);
    });
  return y;
}

}  // namespace

Tensor rms_norm(const Tensor& x_in, const Tensor& w_in, double eps) {
  if (kern::native_half("rms_norm", x_in, w_in)) return rms_norm_half(x_in, w_in, eps);
  GRAFT_VIA_F32("rms_norm", rms_norm, x_in, w_in, eps);
  check_layer_norm(x_in, w_in, Tensor(), eps, "rms_norm");
  const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
  const Tensor x = kern::contig(x_in);
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  Tensor y = Tensor::empty(x_in.shape(), x_in.dtype()), rstd = Tensor::empty({N}, x_in.dtype());
  if (y.numel() > 0)
    GRAFT_DISPATCH_FLOAT(x.dtype(), "rms_norm", [&] {
      rms_norm_rows<T>(x.data<const T>(), w.defined() ? w.data<const T>() : nullptr, eps, N, C,
                       y.data<T>(), rstd.data<T>());
    });
  if (!autograd::needs_record({x_in, w_in})) return y;
  autograd::record(
      "rms_norm", {x_in, w_in}, {y}, {x_in, w_in, rstd},
      [eps](const autograd::Ctx& c, const Tensors& dout) {
        if (c.create_graph)
          return autograd::differentiate(
              [eps](const Tensors& in) {
                Tensor y =
                    mul(in[0], pow(affine(mean(mul(in[0], in[0]), {-1}, true), 1, eps), -0.5));
                return Tensors{in[1].defined() ? mul(y, in[1]) : y};
              },
              {c.saved[0], c.saved[1]}, dout, c.needs);
        return rms_norm_backward(dout[0], c.saved[0], c.saved[1], c.saved[2], c.needs);
      });
  return y;
}

}  // namespace graft
