// Cross entropy from logits, fused: one pass per row computes the log-sum-exp and the smoothed
// loss, so no (N, C) log-softmax temporary is made (oneDNN's logsoftmax would write one).
// Shape legend: logits (N, C), target (N) int64, lse (N) float64, out () scalar.
//
// With q = (1 - eps) onehot(t) + eps / C and log_softmax(x)_c = x_c - lse:
//   loss_n = -sum_c q_c (x_c - lse) = lse - (1 - eps) x_t - (eps / C) sum_c x_c
//   dloss_n / dx_c = softmax(x)_c - q_c
// Both directions are OpenMP loops over rows (for float32 too: the cost is one exp per logit
// each way); per-row losses are summed afterwards in row order, so the result does not depend
// on the thread count.
#include "graft/ops/loss.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/matmul.h"
#include "graft/ops/precision.h"
#include "graft/ops/shape.h"
#include "graft/ops/softmax.h"
#include "ops/internal/kernels.h"

namespace graft {

using autograd::Ctx;

namespace {

GRAFT_DECLARE_OP("cross_entropy", "loss");

// Per valid row of contiguous logits: lse[n] and loss[n]; ignored rows get loss 0. The simd
// reductions fix the summation order at compile time, so it does not depend on the threads.
template <class T>
void ce_forward_rows(const T* x, int64_t N, int64_t C, const int64_t* target, double eps,
                     int64_t ignore_index, double* lse, double* loss) {
#pragma omp parallel for if (N * C > kern::kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* row = x + n * C;
    if (target[n] == ignore_index) {
      lse[n] = 0;
      loss[n] = 0;
      continue;
    }
    T mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int64_t c = 1; c < C; ++c) mx = std::max(mx, row[c]);
    double se = 0, sx = 0;
#pragma omp simd reduction(+ : se, sx)
    for (int64_t c = 0; c < C; ++c) {
      se += (double)kern::exp_nonpos(row[c] - mx, T());
      sx += (double)row[c];
    }
    lse[n] = (double)mx + std::log(se);
    loss[n] = lse[n] - (1 - eps) * (double)row[target[n]] - eps / (double)C * sx;
  }
}

// dx (contiguous (N, C)) = (softmax - q) * g for valid rows, 0 for ignored ones.
template <class T>
void ce_backward_rows(const T* x, int64_t N, int64_t C, const int64_t* target, const double* lse,
                      double eps, int64_t ignore_index, double g, T* dx) {
  const T off = (T)(eps / (double)C), gt = (T)g;
#pragma omp parallel for if (N * C > kern::kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* drow = dx + n * C;
    if (target[n] == ignore_index) {
      for (int64_t c = 0; c < C; ++c) drow[c] = 0;
      continue;
    }
    const T* row = x + n * C;
    const T l = (T)lse[n];
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) drow[c] = gt * (kern::exp_nonpos(row[c] - l, T()) - off);
    drow[target[n]] -= (T)(g * (1 - eps));
  }
}

// Forward and backward of one chunk at once, in place on contiguous logits x (N, C): loss[n]
// as ce_forward_rows, and x becomes dx = (softmax - q) * g as ce_backward_rows. Each row is
// read three times while it is in cache (max; exp, kept in place, and sums; scale) and exp runs
// once per logit instead of once each way.
template <class T>
void ce_fused_rows(T* x, int64_t N, int64_t C, const int64_t* target, double eps,
                   int64_t ignore_index, double g, double* loss) {
  const T off = (T)(g * eps / (double)C);
#pragma omp parallel for if (N * C > kern::kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* row = x + n * C;
    if (target[n] == ignore_index) {
      for (int64_t c = 0; c < C; ++c) row[c] = 0;
      loss[n] = 0;
      continue;
    }
    T mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int64_t c = 1; c < C; ++c) mx = std::max(mx, row[c]);
    const double xt = (double)row[target[n]];
    double se = 0, sx = 0;
#pragma omp simd reduction(+ : se, sx)
    for (int64_t c = 0; c < C; ++c) {
      sx += (double)row[c];
      row[c] = kern::exp_nonpos(row[c] - mx, T());
      se += (double)row[c];
    }
    loss[n] = (double)mx + std::log(se) - (1 - eps) * xt - eps / (double)C * sx;
    const T scale = (T)(g / se);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) row[c] = row[c] * scale - off;
    row[target[n]] -= (T)(g * (1 - eps));
  }
}

// Copies target (N) int64 into t and counts the non-ignored entries; throws "<op>: target v at
// position n is out of range [0, C) for <what>" otherwise. Checked before the parallel loops:
// exceptions cannot leave an OpenMP region.
int64_t check_targets(const char* op, const Tensor& target, int64_t C, int64_t ignore_index,
                      const std::string& what, std::vector<int64_t>& t) {
  t = target.to_vector<int64_t>();
  int64_t n_valid = 0;
  for (size_t n = 0; n < t.size(); ++n) {
    if (t[n] == ignore_index) continue;
    if (t[n] < 0 || t[n] >= C)
      fail(std::string(op) + ": target " + std::to_string(t[n]) + " at position " +
           std::to_string(n) + " is out of range [0, " + std::to_string(C) + ") for " + what +
           " (ignore_index " + std::to_string(ignore_index) + ")");
    ++n_valid;
  }
  return n_valid;
}

template <class T>
void scale_in_place(T* p, int64_t n, T s) {
#pragma omp parallel for simd if (n > kern::kParallelGrain) schedule(static)
  for (int64_t k = 0; k < n; ++k) p[k] *= s;
}

// out[rows[i]] = in[i] for rows of length d.
template <class T>
void scatter_rows(const T* in, const std::vector<int64_t>& rows, int64_t d, T* out) {
  const int64_t n = (int64_t)rows.size();
#pragma omp parallel for if (n * d > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) std::copy(in + i * d, in + (i + 1) * d, out + rows[i] * d);
}

void check_smoothing(const char* op, double label_smoothing) {
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
    fail(std::string(op) + ": label_smoothing must be in [0, 1], got " +
         std::to_string(label_smoothing));
}

// cross_entropy's argument checks; the message names every shape.
void check_cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing) {
  kern::check_float("cross_entropy", logits);
  if (!target.defined()) fail("cross_entropy: target is undefined");
  if (logits.dim() != 2) fail("cross_entropy: logits must be (N, C), got " + describe(logits));
  if (target.dtype() != DType::i64)
    fail("cross_entropy: target must be int64 class indices, got " + describe(target));
  const int64_t N = logits.size(0), C = logits.size(1);
  if (target.dim() != 1 || target.size(0) != N)
    fail("cross_entropy: logits " + describe(logits) + " need target (N) = " + shape_str({N}) +
         ", got " + describe(target));
  if (C == 0) fail("cross_entropy: logits " + describe(logits) + " have no classes");
  check_smoothing("cross_entropy", label_smoothing);
}

// What cross_entropy's backward needs of its forward's options: the label smoothing eps, the
// ignored target and the number of targets not ignored.
struct CrossEntropySpec {
  double eps = 0;
  int64_t ignore_index = -100, n_valid = 0;
};

}  // namespace

// dloss the upstream scalar, x (N, C) contiguous logits, tgt (N), lse (N) float64 -> dx (N, C),
// written into x's own buffer when `overwrite` (nothing else holds the logits): no second (N, C)
// buffer at the top of backward, where memory peaks.
Tensor cross_entropy_backward(double dloss, const Tensor& x, const Tensor& tgt, const Tensor& lse,
                              const CrossEntropySpec& spec, bool overwrite) {
  const double eps = spec.eps;
  const int64_t ignore_index = spec.ignore_index, n_valid = spec.n_valid;
  Tensor dx = overwrite ? x : Tensor::empty(x.shape(), x.dtype());
  const double g = n_valid > 0 ? dloss / (double)n_valid : 0.0;
  const int64_t* pt = tgt.data<const int64_t>();
  GRAFT_DISPATCH_FLOAT(x.dtype(), "cross_entropy", [&] {
    ce_backward_rows(x.data<const T>(), x.size(0), x.size(1), pt, lse.data<const double>(), eps,
                     ignore_index, g, dx.data<T>());
  });
  return dx;
}

// q (N, C): the smoothed target distribution of each row, (1 - eps) onehot(t) + eps / C; rows
// whose target is ignore_index are zero.
template <class T>
void smoothed_targets(const int64_t* t, int64_t N, int64_t C, double eps, int64_t ignore_index,
                      T* q) {
#pragma omp parallel for if (N * C > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const bool valid = t[i] != ignore_index;
    std::fill(q + i * C, q + (i + 1) * C, valid ? (T)(eps / (double)C) : T(0));
    if (valid) q[i * C + t[i]] = (T)(eps / (double)C + 1.0 - eps);
  }
}

// cross_entropy's backward as recorded ops (under create_graph): dloss * (softmax(x) - q) / n_valid
// on the valid rows, q the smoothed target distribution (a constant), so it differentiates again
// through softmax. x is the logits as recorded (routed to their producer).
Tensor cross_entropy_backward_graph(const Tensor& dloss, const Tensor& x, const Tensor& tgt,
                                    const CrossEntropySpec& spec) {
  const double eps = spec.eps;
  const int64_t ignore_index = spec.ignore_index, n_valid = spec.n_valid;
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t* pt = tgt.data<const int64_t>();
  // q made in x's dtype straight away: an (N, C) float64 vector took fresh pages each call (a
  // base model's 65 MB, the page faults of a Hessian-vector product's first backward).
  Tensor q = Tensor::empty({N, C}, x.dtype());
  std::vector<double> rows((size_t)N);
  GRAFT_DISPATCH_FLOAT(x.dtype(), "cross_entropy",
                       [&] { smoothed_targets(pt, N, C, eps, ignore_index, q.data<T>()); });
  for (int64_t i = 0; i < N; ++i)
    rows[(size_t)i] = pt[i] == ignore_index || n_valid == 0 ? 0.0 : 1.0 / (double)n_valid;
  const Tensor diff = sub(softmax(x, -1), q);
  return mul(mul(diff, from_vector(rows, {N, 1}, x.dtype())), dloss);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing,
                     int64_t ignore_index) {
  GRAFT_VIA_F32("cross_entropy", cross_entropy, logits, target, label_smoothing, ignore_index);
  check_cross_entropy(logits, target, label_smoothing);
  const int64_t N = logits.size(0), C = logits.size(1);
  std::vector<int64_t> t;
  const int64_t n_valid =
      check_targets("cross_entropy", target, C, ignore_index, "logits " + describe(logits), t);
  // The row loops read contiguous rows (what lets them vectorise); a transposed view is copied.
  const Tensor xc = kern::contig(logits);
  Tensor lse = Tensor::empty({N}, DType::f64);
  std::vector<double> row_loss(N);
  GRAFT_DISPATCH_FLOAT(xc.dtype(), "cross_entropy", [&] {
    ce_forward_rows(xc.data<const T>(), N, C, t.data(), label_smoothing, ignore_index,
                    lse.data<double>(), row_loss.data());
  });
  double total = 0;
  for (double l : row_loss) total += l;
  // All targets ignored: 0 with zero gradient (PyTorch gives NaN here).
  Tensor out = scalar(n_valid > 0 ? total / (double)n_valid : 0.0, logits.dtype());
  if (autograd::needs_record({logits}))
    // A copied (non-contiguous) x keeps the logits too: the backward under create_graph needs them
    // as recorded.
    autograd::record("cross_entropy", {logits}, {out},
                     {xc, kern::contig(target), lse, xc.same_storage(logits) ? Tensor() : logits},
                     [spec = CrossEntropySpec{label_smoothing, ignore_index, n_valid}](
                         const Ctx& c, const Tensors& dout) {
                       const Tensors& s = c.saved;
                       if (c.create_graph)
                         return Tensors{cross_entropy_backward_graph(
                             dout[0], s[3].defined() ? s[3] : s[0], s[1], spec)};
                       return Tensors{cross_entropy_backward(dout[0].item(), s[0], s[1], s[2], spec,
                                                             autograd::can_overwrite(c, 0))};
                     });
  return out;
}

GRAFT_DECLARE_OP("linear_cross_entropy", "loss");

namespace {

void check_linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target,
                                double label_smoothing, int64_t chunk_rows) {
  kern::check_float("linear_cross_entropy", x);
  kern::check_float("linear_cross_entropy", w);
  const std::string what = "x " + describe(x) + ", w " + describe(w);
  if (!target.defined()) fail("linear_cross_entropy: target is undefined");
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1) || x.dtype() != w.dtype())
    fail("linear_cross_entropy: needs x (N, d) and w (V, d) of one dtype, got " + what);
  const int64_t N = x.size(0);
  if (target.dtype() != DType::i64 || target.dim() != 1 || target.size(0) != N)
    fail("linear_cross_entropy: " + what + " need target (N) = " + shape_str({N}) + " int64, got " +
         describe(target));
  if (w.size(0) == 0) fail("linear_cross_entropy: " + what + ": no classes");
  check_smoothing("linear_cross_entropy", label_smoothing);
  if (chunk_rows < 0) fail("linear_cross_entropy: chunk_rows must be >= 0");
}

// Rows with an ignored target add nothing to the loss or to either gradient: only the valid rows
// are multiplied. Returns x's valid rows (x itself when all are valid) and compacts t to them;
// valid lists their positions in x.
Tensor valid_rows(const Tensor& x, std::vector<int64_t>& t, int64_t ignore_index,
                  std::vector<int64_t>& valid) {
  for (int64_t n = 0; n < (int64_t)t.size(); ++n)
    if (t[n] != ignore_index) valid.push_back(n);
  if (valid.size() == t.size()) return x;
  const int64_t n_valid = (int64_t)valid.size();
  for (int64_t i = 0; i < n_valid; ++i) t[i] = t[valid[i]];
  t.resize(n_valid);
  autograd::NoGrad no_grad;
  return index_select(x, 0, from_vector(valid, {n_valid}));
}

struct LceOptions {
  double label_smoothing;
  int64_t ignore_index, chunk_rows;
  double g;  // 1 / number of valid targets: d loss / d row loss
};

// Chunk by chunk over the rows of xs (Ns, d) with targets t: one chunk's logits in buf, turned
// into its row losses and, when dx or dw is defined, into d loss / d logits in place, which goes
// into dx (Ns, d) = G w and dw (V, d) += G^T x.
void lce_chunks(const Tensor& xs, const Tensor& w, const std::vector<int64_t>& t,
                const LceOptions& o, const Tensor& dx, const Tensor& dw, double* row_loss) {
  const int64_t Ns = (int64_t)t.size(), V = w.size(0);
  const int64_t rows =
      o.chunk_rows > 0 ? o.chunk_rows : std::max<int64_t>(1, (int64_t(1) << 21) / V);
  const Tensor wt = kern::swap_last2(w);
  Tensor buf = Tensor::empty({std::min(rows, Ns), V}, xs.dtype());
  std::vector<double> lse(Ns);
  for (int64_t r0 = 0; r0 < Ns; r0 += rows) {
    const int64_t r1 = std::min(Ns, r0 + rows), n = r1 - r0;
    const Tensor xc = kern::row_range(xs, r0, r1), lc = kern::row_range(buf, 0, n);
    kern::gemm(xc, wt, lc, false, kern::BCopy::weight);  // logits of rows [r0, r1)
    GRAFT_DISPATCH_FLOAT(xs.dtype(), "linear_cross_entropy", [&] {
      if (dx.defined() || dw.defined())
        ce_fused_rows(lc.data<T>(), n, V, t.data() + r0, o.label_smoothing, o.ignore_index, o.g,
                      row_loss + r0);
      else
        ce_forward_rows(lc.data<const T>(), n, V, t.data() + r0, o.label_smoothing, o.ignore_index,
                        lse.data() + r0, row_loss + r0);
    });
    if (dx.defined())
      kern::gemm(lc, w, kern::row_range(dx, r0, r1), false, kern::BCopy::weight);  // dx = G w
    if (dw.defined())
      kern::gemm(kern::swap_last2(lc), xc, dw, /*accumulate=*/r0 > 0);  // dw += G^T x
  }
}

GRAFT_DECLARE_OP("linear_cross_entropy_backward", "loss");

// linear_cross_entropy's gradients as recorded ops: G = dloss r (softmax(x w^T) - q) (r = 1 / the
// valid targets, 0 on ignored rows), dx = G w, dw = G^T x, each where `needs` asks for it.
Tensors lce_grads_composed(const Tensor& x, const Tensor& w, const Tensor& dloss, const Tensor& tgt,
                           const CrossEntropySpec& spec, std::vector<bool> needs = {true, true}) {
  const Tensor g = cross_entropy_backward_graph(dloss, matmul(x, transpose(w, 0, 1)), tgt, spec);
  return {needs[0] ? matmul(g, w) : Tensor(), needs[1] ? matmul(transpose(g, 0, 1), x) : Tensor()};
}

// One chunk of lce_second_backward's rows, in place: the logits z become dloss G and h (= H)
// becomes Z; dot[n] = <G, H>'s row n for dloss 1. Ignored rows give zeros.
template <class T>
void lce_second_rows(T* z, T* h, int64_t n, int64_t C, const int64_t* t, const LceOptions& o,
                     double dloss, double* dot) {
  const double eps = o.label_smoothing;
  const T a = (T)(dloss * o.g), off = (T)(eps / (double)C);
#pragma omp parallel for if (n * C > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T *zr = z + i * C, *hr = h + i * C;
    if (t[i] == o.ignore_index) {
      std::fill(zr, zr + C, T(0));
      std::fill(hr, hr + C, T(0));
      dot[i] = 0;
      continue;
    }
    T mx = zr[0];
#pragma omp simd reduction(max : mx)
    for (int64_t c = 1; c < C; ++c) mx = std::max(mx, zr[c]);
    double se = 0;
#pragma omp simd reduction(+ : se)
    for (int64_t c = 0; c < C; ++c) {
      zr[c] = kern::exp_nonpos(zr[c] - mx, T());
      se += (double)zr[c];
    }
    const T inv = (T)(1.0 / se);
    double ph = 0, sh = 0;  // <P, h>, sum of h
#pragma omp simd reduction(+ : ph, sh)
    for (int64_t c = 0; c < C; ++c) {
      zr[c] *= inv;
      ph += (double)zr[c] * (double)hr[c];
      sh += (double)hr[c];
    }
    dot[i] = o.g * (ph - eps / (double)C * sh - (1 - eps) * (double)hr[t[i]]);
    const T s = (T)ph;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      hr[c] = a * zr[c] * (hr[c] - s);
      zr[c] = a * (zr[c] - off);
    }
    zr[t[i]] -= a * (T)(1 - eps);
  }
}

// The backward of linear_cross_entropy_backward (outputs dx = dloss G w, dw = dloss G^T x with
// G = r (softmax(x w^T) - q)), without recording. For upstream gradients gdx, gdw and
// H = gdx w^T + x gdw^T [N, V]:
//   d/dx = dloss G gdw + Z w,  d/dw = dloss G^T gdx + Z^T x,  d/ddloss = <G, H>,
// with Z = dloss r (P . H - P rowsum(P . H)), the softmax's Jacobian applied to H. Chunks of rows
// as in the forward: 7 matmuls of the logits' size per chunk (the composed form's graph takes 9)
// and one pass over its rows.
Tensors lce_second_backward(const Tensor& gdx, const Tensor& gdw, const Ctx& c,
                            const CrossEntropySpec& spec, int64_t chunk_rows) {
  const Tensor x = kern::contig(c.saved[0]), &w = c.saved[1], &tgt = c.saved[2];
  const double dloss = c.saved[3].item();
  const int64_t N = x.size(0), V = w.size(0);
  const LceOptions o{spec.eps, spec.ignore_index, chunk_rows,
                     spec.n_valid > 0 ? 1.0 / (double)spec.n_valid : 0.0};
  const int64_t rows = chunk_rows > 0 ? chunk_rows : std::max<int64_t>(1, (int64_t(1) << 21) / V);
  Tensor zb = Tensor::empty({std::min(rows, N), V}, x.dtype()),
         hb = Tensor::empty(zb.shape(), x.dtype());
  Tensor gx = c.needs[0] ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  Tensor gw = c.needs[1] ? Tensor::empty(w.shape(), w.dtype()) : Tensor();
  if (gw.defined() && N == 0) fill_(gw, 0);
  std::vector<double> dot((size_t)N);
  const int64_t* pt = tgt.data<const int64_t>();
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t r1 = std::min(N, r0 + rows), n = r1 - r0;
    const Tensor xc = kern::row_range(x, r0, r1), gc = kern::row_range(gdx, r0, r1),
                 zc = kern::row_range(zb, 0, n), hc = kern::row_range(hb, 0, n);
    kern::gemm(xc, kern::swap_last2(w), zc, false, kern::BCopy::weight);  // logits
    kern::gemm(gc, kern::swap_last2(w), hc, false, kern::BCopy::weight);  // H = gdx w^T
    kern::gemm(xc, kern::swap_last2(gdw), hc, /*accumulate=*/true);       //   + x gdw^T
    GRAFT_DISPATCH_FLOAT(x.dtype(), "linear_cross_entropy_backward", [&] {
      lce_second_rows(zc.data<T>(), hc.data<T>(), n, V, pt + r0, o, dloss, dot.data() + r0);
    });
    if (gx.defined()) {
      const Tensor gxc = kern::row_range(gx, r0, r1);
      kern::gemm(zc, gdw, gxc);                                          // dloss G gdw
      kern::gemm(hc, w, gxc, /*accumulate=*/true, kern::BCopy::weight);  //   + Z w
    }
    if (gw.defined()) {
      kern::gemm(kern::swap_last2(zc), gc, gw, /*accumulate=*/r0 > 0);  // dloss G^T gdx
      kern::gemm(kern::swap_last2(hc), xc, gw, /*accumulate=*/true);    //   + Z^T x
    }
  }
  double total = 0;
  for (double d : dot) total += d;
  return {gx, gw, c.needs[2] ? scalar(total, c.saved[3].dtype()) : Tensor()};
}

}  // namespace

// The forward already made dx and dw (for an upstream gradient of 1): the backward scales them
// by the upstream scalar, in place when nothing else holds them.
Tensors linear_cross_entropy_backward(double dloss, const Ctx& c) {
  Tensors grads(2);
  for (size_t i = 0; i < 2; ++i) {
    if (!c.needs[i] || !c.saved[i].defined()) continue;
    const Tensor& gi = c.saved[i];  // fresh, contiguous
    if (dloss == 1.0) {
      grads[i] = gi;
    } else if (autograd::can_overwrite(c, i)) {
      GRAFT_DISPATCH_FLOAT(gi.dtype(), "linear_cross_entropy",
                           [&] { scale_in_place(gi.data<T>(), gi.numel(), (T)dloss); });
      grads[i] = gi;
    } else {
      grads[i] = affine(gi, dloss, 0.0);
    }
  }
  return grads;
}

namespace {
// linear_cross_entropy's backward under create_graph: the gradients its forward made, scaled by
// dloss, become the outputs of a recorded linear_cross_entropy_backward (its inputs x, w and
// dloss), whose own backward is lce_second_backward, or lce_grads_composed differentiated under
// create_graph again. When the forward made only one of them, the composed form is recorded.
Tensors record_lce_grads(const Tensor& dloss, const Ctx& c, const CrossEntropySpec& spec,
                         int64_t chunk_rows) {
  const Tensor &x = c.saved[2], &w = c.saved[3], &tgt = c.saved[4];
  if (!c.saved[0].defined() || !c.saved[1].defined())
    return lce_grads_composed(x, w, dloss, tgt, spec, {c.needs[0], c.needs[1]});
  Tensors grads(2);
  {
    // Copies: create_graph keeps the forward's entry (and its saved gradients, which a later
    // plain backward hands out), so they cannot become this entry's outputs.
    autograd::NoGrad values;
    const double scale = dloss.item();
    for (size_t i = 0; i < 2; ++i) grads[i] = affine(c.saved[i], scale, 0.0);
  }
  autograd::record("linear_cross_entropy_backward", {x, w, dloss}, grads, {x, w, tgt, dloss},
                   [spec, chunk_rows, prec = precision_state()](const Ctx& c2, const Tensors& g) {
                     PrecisionGuard guard(prec);
                     if (!c2.create_graph)
                       return lce_second_backward(g[0], g[1], c2, spec, chunk_rows);
                     const Tensor t = c2.saved[2];
                     return autograd::differentiate(
                         [t, spec](const Tensors& in) {
                           return lce_grads_composed(in[0], in[1], in[2], t, spec);
                         },
                         {c2.saved[0], c2.saved[1], c2.saved[3]}, g, c2.needs);
                   });
  return {c.needs[0] ? grads[0] : Tensor(), c.needs[1] ? grads[1] : Tensor()};
}
}  // namespace

namespace {
// What linear_cross_entropy's forward makes: the mean loss, dx and dw (for an upstream gradient
// of 1, where asked for) and the count of valid targets.
struct LceForward {
  Tensor out, dx, dw;
  int64_t n_valid = 0;
};

// The forward on checked float32 or float64 x (N, d), w (V, d), recording nothing.
LceForward lce_forward(const Tensor& x, const Tensor& w, const Tensor& target,
                       double label_smoothing, int64_t ignore_index, int64_t chunk_rows,
                       bool need_dx, bool need_dw) {
  const int64_t N = x.size(0), d = x.size(1);
  std::vector<int64_t> t, valid;
  const int64_t n_valid = check_targets("linear_cross_entropy", target, w.size(0), ignore_index,
                                        "x " + describe(x) + ", w " + describe(w), t);
  const DType dt = x.dtype();
  Tensor xs = valid_rows(x, t, ignore_index, valid);
  // dw += G^T x reduces over the chunk's rows of x: rows 1 KiB multiples apart are padded.
  if (dt == DType::f32 && need_dw && xs.is_contiguous()) xs = kern::unaliased(xs);
  const int64_t Ns = (int64_t)t.size();
  Tensor dx = need_dx ? Tensor::empty({Ns, d}, dt) : Tensor();
  Tensor dw = need_dw ? Tensor::empty(w.shape(), dt) : Tensor();
  if (need_dw && Ns == 0) fill_(dw, 0);
  std::vector<double> row_loss(Ns);
  const LceOptions o{label_smoothing, ignore_index, chunk_rows,
                     n_valid > 0 ? 1.0 / (double)n_valid : 0.0};
  lce_chunks(xs, w, t, o, dx, dw, row_loss.data());
  if (need_dx && Ns < N) {  // back to all N rows, zeros where the target is ignored
    Tensor full_dx = zeros({N, d}, dt);
    GRAFT_DISPATCH_FLOAT(dt, "linear_cross_entropy",
                         [&] { scatter_rows(dx.data<const T>(), valid, d, full_dx.data<T>()); });
    dx = full_dx;
  }
  double total = 0;
  for (double l : row_loss) total += l;
  return {scalar(n_valid > 0 ? total / (double)n_valid : 0.0, dt), dx, dw, n_valid};
}

// The first-order backward of the bf16 entry: the saved bf16 gradients times dloss (float32
// products rounded to bf16; dloss 1 hands them out as they are). For dloss != 1 the gradient is
// rounded twice, round(round(dx32) * dloss): within one bf16 ulp of the single rounding
// round(dx32 * dloss), the price of not keeping float32 gradients. f16 does not take this
// entry: its loss scaling needs the float32 product (an entry that underflowed when saved
// cannot be scaled back).
Tensors lce_half_grads(double dloss, const Ctx& c) {
  Tensors grads(2);
  for (size_t i = 0; i < 2; ++i)
    if (c.needs[i] && c.saved[i].defined())
      grads[i] = dloss == 1.0 ? c.saved[i] : affine(c.saved[i], dloss, 0.0);
  return grads;
}

// The backward of the 16-bit entry under create_graph: the float32 op between recorded casts,
// differentiated (its own create_graph backward records the second-order graph) under the
// precision setting of the forward.
Tensors lce_half_composed_backward(const Ctx& c, const Tensors& dout, const CrossEntropySpec& spec,
                                   int64_t chunk_rows, DType dt, const PrecisionState& prec) {
  const Tensor t = c.saved[4];
  return autograd::differentiate(
      [t, spec, chunk_rows, dt, prec](const Tensors& in) {
        PrecisionGuard guard(prec);
        const Tensor loss =
            linear_cross_entropy(to_dtype(in[0], DType::f32), to_dtype(in[1], DType::f32), t,
                                 spec.eps, spec.ignore_index, chunk_rows);
        return Tensors{to_dtype(loss, dt)};
      },
      {c.saved[2], c.saved[3]}, dout, c.needs);
}

// bf16 x and w on the tape: the float32 forward on float32 copies made for the call (freed
// after it), its loss and gradients rounded once, and an entry that saves the 16-bit dx, dw, x
// and w. Through kern::via_f32 the float32 entry kept float32 x, w, dx and dw (24 MiB on bf16
// base training's 4096 target tokens, from the end of the forward into the backward).
Tensor lce_half_recorded(const Tensor& x, const Tensor& w, const Tensor& target,
                         double label_smoothing, int64_t ignore_index, int64_t chunk_rows) {
  check_linear_cross_entropy(x, w, target, label_smoothing, chunk_rows);
  kern::count_f32_detour();
  const DType dt = x.dtype();
  const bool need_dx = autograd::needs_record({x}), need_dw = autograd::needs_record({w});
  LceForward f = lce_forward(kern::widened(x), kern::widened(w), target, label_smoothing,
                             ignore_index, chunk_rows, need_dx, need_dw);
  const Tensor out = kern::narrowed(f.out, dt), dx = kern::narrowed(f.dx, dt),
               dw = kern::narrowed(f.dw, dt);
  const CrossEntropySpec spec{label_smoothing, ignore_index, f.n_valid};
  f = LceForward();  // the float32 gradients go before the backward
  autograd::record(
      "linear_cross_entropy", {x, w}, {out}, {dx, dw, x, w, kern::contig(target)},
      [spec, chunk_rows, dt, prec = precision_state()](const Ctx& c, const Tensors& dout) {
        if (!c.create_graph) return lce_half_grads(dout[0].item(), c);
        return lce_half_composed_backward(c, dout, spec, chunk_rows, dt, prec);
      });
  return out;
}
}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target,
                            double label_smoothing, int64_t ignore_index, int64_t chunk_rows) {
  // bf16 only: f16 keeps via_f32's float32 gradients, scaled by dloss and rounded once.
  if (kern::half_dtype_of("linear_cross_entropy", x, w) == DType::bf16 &&
      autograd::needs_record({x, w}))
    return lce_half_recorded(x, w, target, label_smoothing, ignore_index, chunk_rows);
  GRAFT_VIA_F32("linear_cross_entropy", linear_cross_entropy, x, w, target, label_smoothing,
                ignore_index, chunk_rows);
  check_linear_cross_entropy(x, w, target, label_smoothing, chunk_rows);
  const bool need_dx = autograd::needs_record({x}), need_dw = autograd::needs_record({w});
  const LceForward f =
      lce_forward(x, w, target, label_smoothing, ignore_index, chunk_rows, need_dx, need_dw);
  // x, w and the targets are kept for the backward under create_graph (x and w are alive anyway
  // until this last op's backward, the first to run).
  if (need_dx || need_dw)
    autograd::record("linear_cross_entropy", {x, w}, {f.out},
                     {f.dx, f.dw, x, w, kern::contig(target)},
                     [spec = CrossEntropySpec{label_smoothing, ignore_index, f.n_valid},
                      chunk_rows](const Ctx& c, const Tensors& dout) {
                       if (!c.create_graph) return linear_cross_entropy_backward(dout[0].item(), c);
                       return record_lce_grads(dout[0], c, spec, chunk_rows);
                     });
  return f.out;
}

// ---- gradcheck cases ---------------------------------------------------------------------------

}  // namespace graft
