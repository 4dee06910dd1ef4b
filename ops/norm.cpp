// layer_norm over the last dim. float32 runs oneDNN layer_normalization forward (training:
// it also returns the per-row mean and variance the backward needs) and backward; float64 runs
// the reference loops (llm.c's layernorm_forward / layernorm_backward formulas).
#include "ops/norm.h"

#include <cmath>

#include "autograd/gradcheck.h"
#include "ops/kernels.h"
#include "ops/onednn/dnnl_utils.h"

namespace graft {

namespace {

// x (N, C) contiguous, w/b (C) or undefined -> y (N, C), mean (N), var (N) (biased)
template <class T>
void layer_norm_loop(const Tensor& x, const Tensor& w, const Tensor& b, double eps,
                     const Tensor& y, const Tensor& mean, const Tensor& var) {
  const int64_t N = x.shape()[0], C = x.shape()[1];
  const T* px = x.data<T>();
  const T* pw = w.defined() ? w.data<T>() : nullptr;
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  T *py = y.data<T>(), *pm = mean.data<T>(), *pv = var.data<T>();
#pragma omp parallel for if (N * C > kern::kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = px + n * C;
    T m = 0;
    for (int64_t i = 0; i < C; ++i) m += xr[i];
    m /= T(C);
    T v = 0;
    for (int64_t i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
    v /= T(C);
    const T rstd = T(1) / std::sqrt(v + T(eps));
    T* yr = py + n * C;
    for (int64_t i = 0; i < C; ++i)
      yr[i] = (xr[i] - m) * rstd * (pw ? pw[i] : T(1)) + (pb ? pb[i] : T(0));
    pm[n] = m;
    pv[n] = v;
  }
}

// dx (N, C), dw/db (C) where defined, from dy (N, C), x, w, and the saved mean/var.
template <class T>
void layer_norm_backward_loop(const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& var, double eps, const Tensor& dx,
                              const Tensor& dw, const Tensor& db) {
  const int64_t N = x.shape()[0], C = x.shape()[1];
  const T *pdy = dy.data<T>(), *px = x.data<T>(), *pm = mean.data<T>(), *pv = var.data<T>();
  const T* pw = w.defined() ? w.data<T>() : nullptr;
  const bool big = N * C > kern::kParallelGrain;
  if (dx.defined()) {
    T* pdx = dx.data<T>();
#pragma omp parallel for if (big) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T *xr = px + n * C, *gr = pdy + n * C;
      const T rstd = T(1) / std::sqrt(pv[n] + T(eps));
      // dnorm = dy * w; dx = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
      T dnorm_mean = 0, dnorm_norm_mean = 0;
      for (int64_t i = 0; i < C; ++i) {
        const T norm = (xr[i] - pm[n]) * rstd, dnorm = gr[i] * (pw ? pw[i] : T(1));
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= T(C);
      dnorm_norm_mean /= T(C);
      T* dxr = pdx + n * C;
      for (int64_t i = 0; i < C; ++i) {
        const T norm = (xr[i] - pm[n]) * rstd, dnorm = gr[i] * (pw ? pw[i] : T(1));
        dxr[i] = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd;
      }
    }
  }
  // dw = sum over rows of dy * norm, db = sum over rows of dy: split over columns so each is
  // summed by one thread in row order.
  if (dw.defined() || db.defined()) {
    T* pdw = dw.defined() ? dw.data<T>() : nullptr;
    T* pdb = db.defined() ? db.data<T>() : nullptr;
#pragma omp parallel for if (big) schedule(static)
    for (int64_t i = 0; i < C; ++i) {
      T sw = 0, sb = 0;
      for (int64_t n = 0; n < N; ++n) {
        const T g = pdy[n * C + i];
        sw += g * (px[n * C + i] - pm[n]) / std::sqrt(pv[n] + T(eps));
        sb += g;
      }
      if (pdw) pdw[i] = sw;
      if (pdb) pdb[i] = sb;
    }
  }
}

dnnl::normalization_flags ln_flags(bool scale, bool shift) {
  auto f = dnnl::normalization_flags::none;
  if (scale) f = f | dnnl::normalization_flags::use_scale;
  if (shift) f = f | dnnl::normalization_flags::use_shift;
  return f;
}

dnnl::layer_normalization_forward::primitive_desc ln_fwd_pd(const dnnl::memory::desc& d,
                                                            const dnnl::memory::desc& stat,
                                                            double eps,
                                                            dnnl::normalization_flags f,
                                                            dnnl::prop_kind kind) {
  using lnf = dnnl::layer_normalization_forward;
  return lnf::primitive_desc(lnf::desc(kind, d, stat, (float)eps, f), onednn::engine());
}

// Reshape of a contiguous tensor.
Tensor reshaped(const Tensor& t, const Shape& shape) {
  return Tensor::view_of(t, shape, contiguous_strides(shape), t.offset());
}

Tensor as_rows(const Tensor& t, int64_t rows, int64_t C) { return reshaped(t, {rows, C}); }

}  // namespace

// layer_norm: x (..., C), w (C), b (C) -> y (..., C); saves x, w, mean (N), var (N)
GRAFT_DECLARE_OP("layer_norm", "norm");

Tensor layer_norm(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, double eps) {
  kern::check_float("layer_norm", x_in);
  auto what = [&] {
    return "layer_norm: x " + describe(x_in) +
           (w_in.defined() ? ", w " + describe(w_in) : std::string()) +
           (b_in.defined() ? ", b " + describe(b_in) : std::string());
  };
  if (x_in.dim() < 1) fail(what() + ": x needs at least 1 dim");
  const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
  for (const Tensor* p : {&w_in, &b_in}) {
    if (!p->defined()) continue;
    if (p->dtype() != x_in.dtype()) fail(what() + ": dtype mismatch");
    if (p->dim() != 1 || p->shape()[0] != C)
      fail(what() + ": " + (p == &w_in ? "w" : "b") + " must be (" + std::to_string(C) + ")");
  }
  if (!(eps >= 0)) fail(what() + ": eps " + std::to_string(eps) + " must be >= 0");

  const Tensor x = as_rows(kern::contig(x_in), N, C);
  const Tensor w = w_in.defined() ? kern::contig(w_in) : Tensor();
  const Tensor b = b_in.defined() ? kern::contig(b_in) : Tensor();
  Tensor y = Tensor::empty(x_in.shape(), x_in.dtype());
  Tensor mean = Tensor::empty({N}, x.dtype()), var = Tensor::empty({N}, x.dtype());
  const bool record = autograd::needs_record({x_in, w_in, b_in});
  if (y.numel() > 0) {
    if (onednn::usable(x)) {
      auto d = onednn::md(x), stat = onednn::md(mean), cm = onednn::md_contiguous({C});
      auto pd = ln_fwd_pd(d, stat, eps, ln_flags(w.defined(), b.defined()),
                          record ? dnnl::prop_kind::forward_training
                                 : dnnl::prop_kind::forward_inference);
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn::mem(d, x)},
                                                 {DNNL_ARG_DST, onednn::mem(d, y)}};
      // In inference oneDNN computes the statistics internally; training hands them out.
      if (record) {
        args[DNNL_ARG_MEAN] = onednn::mem(stat, mean);
        args[DNNL_ARG_VARIANCE] = onednn::mem(stat, var);
      }
      if (w.defined()) args[DNNL_ARG_SCALE] = onednn::mem(cm, w);
      if (b.defined()) args[DNNL_ARG_SHIFT] = onednn::mem(cm, b);
      dnnl::layer_normalization_forward(pd).execute(onednn::stream(), args);
      onednn::stream().wait();
    } else {
      GRAFT_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
        layer_norm_loop<T>(x, w, b, eps, as_rows(y, N, C), mean, var);
      });
    }
  }
  if (record) {
    const bool has_w = w_in.defined(), has_b = b_in.defined();
    // x and w as given (so in-place changes to them are caught); b is not needed.
    autograd::record(
        "layer_norm", {x_in, w_in, b_in}, {y}, {x_in, has_w ? w_in : Tensor(), mean, var},
        [eps, has_w, has_b](const autograd::Ctx& c, const Tensors& dout) -> Tensors {
          const Tensor& x_in = c.saved[0];
          const int64_t C = x_in.shape().back(), N = C ? x_in.numel() / C : 0;
          const Tensor x = as_rows(kern::contig(x_in), N, C);
          const Tensor w = has_w ? kern::contig(c.saved[1]) : Tensor();
          const Tensor &mean = c.saved[2], &var = c.saved[3];
          const Tensor dy = as_rows(dout[0], N, C);
          Tensor dx = c.needs[0] ? Tensor::empty(x_in.shape(), x_in.dtype()) : Tensor();
          Tensor dw = has_w && c.needs[1] ? Tensor::empty({C}, x.dtype()) : Tensor();
          Tensor db = has_b && c.needs[2] ? Tensor::empty({C}, x.dtype()) : Tensor();
          if (x.numel() == 0) {
            for (auto* g : {&dx, &dw, &db})
              if (g->defined()) fill_(*g, 0);
            return {dx, dw, db};
          }
          if (onednn::usable(x)) {
            // oneDNN's backward needs every diff of the flags it was given and always
            // computes diff_src; outputs nobody asked for go to scratch buffers.
            const Tensor dx_buf = dx.defined() ? dx : Tensor::empty(x_in.shape(), x.dtype());
            const Tensor dw_buf = has_w && !dw.defined() ? Tensor::empty({C}, x.dtype()) : dw;
            const Tensor db_buf = has_b && !db.defined() ? Tensor::empty({C}, x.dtype()) : db;
            using lnb = dnnl::layer_normalization_backward;
            const auto f = ln_flags(has_w, has_b);
            auto d = onednn::md(x), stat = onednn::md(mean), cm = onednn::md_contiguous({C});
            auto hint = ln_fwd_pd(d, stat, eps, f, dnnl::prop_kind::forward_training);
            const auto kind = has_w || has_b ? dnnl::prop_kind::backward
                                             : dnnl::prop_kind::backward_data;
            lnb::primitive_desc pd(lnb::desc(kind, d, d, stat, (float)eps, f),
                                   onednn::engine(), hint);
            std::unordered_map<int, dnnl::memory> args{
                {DNNL_ARG_SRC, onednn::mem(d, x)},
                {DNNL_ARG_DIFF_DST, onednn::mem(d, dy)},
                {DNNL_ARG_MEAN, onednn::mem(stat, mean)},
                {DNNL_ARG_VARIANCE, onednn::mem(stat, var)},
                {DNNL_ARG_DIFF_SRC, onednn::mem(d, as_rows(dx_buf, N, C))}};
            if (has_w) {
              args[DNNL_ARG_SCALE] = onednn::mem(cm, w);
              args[DNNL_ARG_DIFF_SCALE] = onednn::mem(cm, dw_buf);
            }
            if (has_b) {
              // oneDNN 2.6 lists the shift as an input of the backward although the result
              // does not depend on it; any (C) buffer satisfies it, so b need not be saved.
              args[DNNL_ARG_SHIFT] = onednn::mem(cm, db_buf);
              args[DNNL_ARG_DIFF_SHIFT] = onednn::mem(cm, db_buf);
            }
            lnb(pd).execute(onednn::stream(), args);
            onednn::stream().wait();
          } else {
            GRAFT_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
              layer_norm_backward_loop<T>(dy, x, w, mean, var, eps,
                                          dx.defined() ? as_rows(dx, N, C) : Tensor(), dw, db);
            });
          }
          return {dx, dw, db};
        });
  }
  return y;
}

// Inputs on [-2, 2] with C >= 4 keep the rows' variance well away from 0 (and from eps).
GRAFT_OP_CASE({.name = "layer_norm/affine",
               .op = "layer_norm",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input({2, 3, 5}, dt, g, -2, 2), case_input({5}, dt, g, 0.5, 1.5),
                                    case_input({5}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
GRAFT_OP_CASE({.name = "layer_norm/plain_transposed",
               .op = "layer_norm",
               .make_inputs =
                   [](DType dt, Generator& g) { return Tensors{case_input_t({4, 6}, dt, g, -2, 2)}; },
               .fn = [](const Tensors& x) { return layer_norm(x[0], Tensor(), Tensor(), 1e-5); }});
GRAFT_OP_CASE({.name = "layer_norm/weight_only_transposed",
               .op = "layer_norm",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input_t({3, 2, 5}, dt, g, -2, 2), case_input({5}, dt, g, 0.5, 1.5)};
                   },
               .fn = [](const Tensors& x) { return layer_norm(x[0], x[1], Tensor(), 1e-5); }});

}  // namespace graft
