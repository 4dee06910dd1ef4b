// Fused scaled dot-product attention, one tape entry with its own backward.
//
// Shape legend: q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv), S and P (B, H, Tq, Tk),
// out (B, H, Tq, Dv). The four matmuls of the forward and backward run through kern::bmm over
// the 4-D views (their strides describe transposes and head-split permutes, so nothing is
// copied): oneDNN batched matmuls for float32, the reference loop for float64. The mask +
// softmax (and the attention dropout) are OpenMP loops over (b, h, i) rows.
// Without a tape, a call with few query rows per head (cached decoding) takes one loop over
// (b, h, i) rows instead (few_queries_attention).
//
// Memory: the tape keeps q, k, v (the caller's tensors, no copies; under the oneDNN bf16 path
// their bf16 copies instead, when nothing else keeps them) and the bias, not P:
// the backward recomputes P with one more Q K^T matmul (cheap next to the projections) rather
// than hold B*H*Tq*Tk floats per layer from forward to backward. The dropout mask is recomputed
// from its generator state, like ops/dropout.
#include "graft/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "autograd/internal/parallel.h"
#include "graft/autograd/gradcheck.h"
#include "graft/ops/dropout.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/matmul.h"
#include "graft/ops/precision.h"
#include "graft/ops/reduce.h"
#include "graft/ops/shape.h"
#include "graft/ops/softmax.h"
#include "ops/internal/bf16.h"
#include "ops/internal/dnnl_utils.h"
#include "ops/internal/kernels.h"

namespace graft {

using autograd::Ctx;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

GRAFT_DECLARE_OP(kOp, "attention");

struct Geom {
  int64_t B, H, Tq, Tk, D, Dv;
  int64_t rows() const { return B * H * Tq; }
};

// Which keys a query row may attend: keys [0, end) minus the padded ones.
struct RowMask {
  const uint8_t* pad;  // (B, Tk) 1 = padding, or null
  bool causal;
  int64_t Tq, Tk;
  int64_t end(int64_t i) const {
    if (!causal) return Tk;
    // Aligned to the end: the last query sees every key (cached decoding has Tq < Tk).
    return std::clamp<int64_t>(i + (Tk - Tq) + 1, 0, Tk);
  }
};

template <class T>
bool has_nan(const T* s, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (std::isnan(s[j])) return true;
  return false;
}

// In place on one row s (Tk): s += bias, masked keys dropped, s = softmax(s). A row with no
// attendable key (or only -inf scores) becomes all zeros, so out = 0 and its gradients are 0;
// a row whose attendable scores are NaN (a NaN query) is NaN.
// Separate branch-free passes so each vectorises (kern::exp_nonpos instead of a libm call):
// measured 14 -> 4 ms for the forward softmax of the attention micro-benchmark.
// The bias B may be 16-bit (a bf16 model's), widened as it is read.
template <class T, class B>
void softmax_row(T* s, int64_t Tk, int64_t end, const uint8_t* pad, const B* bias,
                 int64_t bias_stride) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (bias)
    for (int64_t j = 0; j < end; ++j) s[j] += T(bias[j * bias_stride]);
  if (pad)
    for (int64_t j = 0; j < end; ++j) s[j] = pad[j] ? kNegInf : s[j];
  T mx = kNegInf;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < end; ++j) mx = std::max(mx, s[j]);
  if (mx == kNegInf) {
    // The max reduction may drop NaN: a row of NaN scores (a NaN query) is all NaN, as PyTorch's.
    const T fill = has_nan(s, end) ? std::numeric_limits<T>::quiet_NaN() : T(0);
    for (int64_t j = 0; j < Tk; ++j) s[j] = j < end ? fill : T(0);
    return;
  }
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < end; ++j) {
    // exp_nonpos(-inf) is 1.6e-38: a -inf score (a padded key) gets exactly 0.
    const T x = s[j];
    s[j] = x == kNegInf ? T(0) : kern::exp_nonpos(x - mx, T());
    sum += s[j];
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (int64_t j = 0; j < end; ++j) s[j] *= inv;
  for (int64_t j = end; j < Tk; ++j) s[j] = 0;
}

// bias read as (B, H, Tq, Tk) through broadcast strides (0 along broadcast dims).
template <class T>
struct BiasView {
  const T* p = nullptr;
  Shape st;
  const T* row(int64_t b, int64_t h, int64_t i) const {
    return p ? p + b * st[0] + h * st[1] + i * st[2] : nullptr;
  }
  int64_t col_stride() const { return p ? st[3] : 0; }
};

// Turns the scaled scores S (contiguous (B, H, Tq, Tk)) into P in place.
template <class T, class B>
void softmax_rows(T* s, const Geom& g, const RowMask& m, const BiasView<B>& bias) {
  const int64_t rows = g.rows(), Tk = g.Tk;
#pragma omp parallel for if (rows * Tk > kern::kParallelGrain) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % g.Tq, bh = r / g.Tq, h = bh % g.H, b = bh / g.H;
    softmax_row(s + r * Tk, Tk, m.end(i), m.pad ? m.pad + b * Tk : nullptr, bias.row(b, h, i),
                bias.col_stride());
  }
}

// In place on dP (contiguous (B, H, Tq, Tk)): dS = P * (dP - rowsum(dP * P)).
template <class T>
void softmax_bwd_rows(T* dp, const T* p, const Geom& g) {
  const int64_t rows = g.rows(), Tk = g.Tk;
#pragma omp parallel for if (rows * Tk > kern::kParallelGrain) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* d = dp + r * Tk;
    const T* pr = p + r * Tk;
    T dot = 0;
    for (int64_t j = 0; j < Tk; ++j) dot += d[j] * pr[j];
    for (int64_t j = 0; j < Tk; ++j) d[j] = pr[j] * (d[j] - dot);
  }
}

// In place on P (contiguous, n elements): P *= keep(i) ? keep_value : 0 (attention dropout).
template <class T>
void apply_dropout(T* p, int64_t n, const kern::DropoutMask& m) {
  const T kv = (T)m.keep_value;
#pragma omp parallel for simd if (n > kern::kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= m.keep(i) ? kv : T(0);
}

void apply_dropout(const Tensor& P, const kern::DropoutMask& m) {
  GRAFT_DISPATCH_FLOAT(P.dtype(), kOp, [&] { apply_dropout(P.data<T>(), P.numel(), m); });
}

// ---- validation ----------------------------------------------------------------------------

std::string qkv_str(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q " + describe(q) + ", k " + describe(k) + ", v " + describe(v);
}

Geom validate(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  // The op name joins the message only on failure: no string is built per call (4 a decoding step).
  const auto fail_op = [](const std::string& what) { fail(std::string(kOp) + ": " + what); };
  if (!q.defined() || !k.defined() || !v.defined()) fail_op("q, k and v must be defined");
  for (const Tensor* t : {&q, &k, &v}) kern::check_float(kOp, *t);
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    fail_op("dtype mismatch, " + qkv_str(q, k, v));
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    fail_op("q, k, v must be rank 4 (B, H, T, D), got " + qkv_str(q, k, v));
  const Geom g{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  if (k.size(0) != g.B || k.size(1) != g.H || v.size(0) != g.B || v.size(1) != g.H)
    fail_op("batch and head dims (B, H) differ: " + qkv_str(q, k, v));
  if (k.size(3) != g.D)
    fail_op("q and k head dims differ (" + std::to_string(g.D) + " vs " +
            std::to_string(k.size(3)) + "): " + qkv_str(q, k, v));
  if (v.size(2) != g.Tk)
    fail_op("k and v key counts differ (" + std::to_string(g.Tk) + " vs " +
            std::to_string(v.size(2)) + "): " + qkv_str(q, k, v));
  const Tensor& mask = opt.key_padding_mask;
  if (mask.defined() && (mask.dim() != 2 || mask.size(0) != g.B || mask.size(1) != g.Tk))
    fail_op("key_padding_mask " + describe(mask) + " must be (B, Tk) = " + shape_str({g.B, g.Tk}) +
            " for " + qkv_str(q, k, v));
  const Tensor& bias = opt.bias;
  if (bias.defined()) {
    if (bias.dtype() != q.dtype())
      fail_op("bias " + describe(bias) + " must have the dtype of q " + describe(q));
    const Shape full{g.B, g.H, g.Tq, g.Tk};
    bool ok = bias.dim() <= 4;
    for (int64_t d = 0; ok && d < bias.dim(); ++d) {
      const int64_t n = bias.size(d), want = full[4 - bias.dim() + d];
      ok = n == want || n == 1;
    }
    if (!ok)
      fail_op("bias " + describe(bias) +
              " does not broadcast to (B, H, Tq, Tk) = " + shape_str(full));
  }
  if (!std::isfinite(opt.scale)) fail_op("scale must be finite, got " + std::to_string(opt.scale));
  if (!is_dropout_p(opt.dropout))
    fail_op("dropout must be in [0, 1], got " + std::to_string(opt.dropout));
  if (opt.dropout > 0 && !opt.generator)
    fail_op("dropout " + std::to_string(opt.dropout) + " needs a generator");
  return g;
}

template <class T>
BiasView<T> bias_view(const Tensor& bias, const Geom& g) {
  BiasView<T> bv;
  if (!bias.defined()) return bv;
  bv.p = bias.data<const T>();
  bv.st = kern::broadcast_strides(bias, {g.B, g.H, g.Tq, g.Tk});
  return bv;
}

// P = softmax(scale Q K^T + bias) over the attendable keys.
// With `reuse_kv` the bf16 copy of k is kept while k stays unchanged (AttentionOptions::steady_kv).
void attention_probs(const kern::Operand& q, const kern::Operand& k, const Geom& g, double scale,
                     const RowMask& m, const Tensor& bias, const Tensor& P, bool reuse_kv = false) {
  kern::bmm(q, kern::transposed(k), P, scale, false,
            reuse_kv ? kern::BCopy::steady : kern::BCopy::per_call);  // S = scale Q K^T
  GRAFT_DISPATCH_FLOAT(P.dtype(), kOp,
                       [&] { softmax_rows(P.data<T>(), g, m, bias_view<T>(bias, g)); });
}

// The attention's settings that its backward needs again.
struct AttentionCtx {
  Geom g;
  double scale;
  std::shared_ptr<const std::vector<uint8_t>> pad;  // (B, Tk) flags, or empty
  bool causal;
  bool dropout;
  kern::DropoutMask mask;
  RowMask row_mask() const {
    return RowMask{pad->empty() ? nullptr : pad->data(), causal, g.Tq, g.Tk};
  }
};

// q, k, v as the matmuls read them: the caller's tensors, or bf16 copies kept for backward.
struct QKV {
  kern::Operand q, k, v;
};

// Under the oneDNN bf16 path every matmul reads q, k and v as bf16: when no other tape entry
// keeps them, bf16 copies made once serve the forward and are kept for backward in their place
// (half the bytes, no conversions in backward).
bool keep_qkv_in_bf16(const Tensor& q, const Tensor& k, const Tensor& v) {
  return kern::keep_bf16_of(q) && kern::keep_bf16_of(k) && kern::keep_bf16_of(v);
}
QKV kept_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  return QKV{kern::kept_bf16(q), kern::kept_bf16(k), kern::kept_bf16(v)};
}

// P is recomputed here (same code and inputs as the forward, so the same values), not kept
// from the forward: one Q K^T matmul and a softmax pass instead of B*H*Tq*Tk floats per layer
// held from forward to backward. With dropout, Pd = P * mask / (1 - p) is what multiplied V:
// dV = Pd^T dO, dPd = dO V^T, dP = dPd * mask / (1 - p). dS = P * (dP - rowsum(dP * P));
// dbias is dS of the full (B, H, Tq, Tk) shape (the bias enters S unscaled), which the tape sums
// over the dims the bias was broadcast along.
Tensors scaled_dot_product_attention_backward(const Tensor& dout, const Ctx& c, const QKV& in,
                                              const Tensor& bias, const AttentionCtx& a) {
  using kern::bmm;
  using kern::transposed;
  const Geom& g = a.g;
  const DType dt = dout.dtype();
  Tensor P = Tensor::empty({g.B, g.H, g.Tq, g.Tk}, dt);
  attention_probs(in.q, in.k, g, a.scale, a.row_mask(), bias, P);
  const bool need_bias = c.needs.size() > 3 && c.needs[3];
  const bool need_ds = c.needs[0] || c.needs[1] || need_bias;
  Tensor dq = c.needs[0] ? Tensor::empty(in.q.shape(), dt) : Tensor();
  Tensor dk = c.needs[1] ? Tensor::empty(in.k.shape(), dt) : Tensor();
  Tensor dv = c.needs[2] ? Tensor::empty(in.v.shape(), dt) : Tensor();
  if (dv.defined()) {
    Tensor Pd = a.dropout ? contiguous_copy(P) : P;
    if (a.dropout) apply_dropout(Pd, a.mask);
    bmm(kern::swap_last2(Pd), dout, dv);  // dV = Pd^T dO
  }
  if (!need_ds) return {dq, dk, dv, Tensor()};
  Tensor dS = Tensor::empty(P.shape(), dt);
  bmm(dout, transposed(in.v), dS);  // dPd = dO V^T
  if (a.dropout) apply_dropout(dS, a.mask);
  GRAFT_DISPATCH_FLOAT(dt, kOp, [&] { softmax_bwd_rows(dS.data<T>(), P.data<const T>(), g); });
  {
    kern::Bf16ReuseScope reuse;                    // under bf16, dS converted once for both
    if (dq.defined()) bmm(dS, in.k, dq, a.scale);  // dQ = scale dS K
    if (dk.defined()) bmm(kern::swap_last2(dS), in.q, dk, a.scale);  // dK = scale dS^T Q
  }
  return {dq, dk, dv, need_bias ? dS : Tensor()};
}

// The attention as recorded ops, for the backward under create_graph (autograd::differentiate):
// the same scores, mask, softmax, dropout mask (as a constant) and product with V. A masked score
// is -1e30 instead of -inf, and a row with no key left is multiplied by 0, so it gives zeros as
// the fused path does instead of NaN.
Tensor attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                          const AttentionCtx& a) {
  const Geom& g = a.g;
  Tensor s = mul(matmul(q, transpose(k, -1, -2)), a.scale);
  if (bias.defined()) s = add(s, bias);
  const RowMask m = a.row_mask();
  std::vector<double> masked((size_t)(g.B * g.Tq * g.Tk), 0.0), alive((size_t)(g.B * g.Tq), 0.0);
  bool any_masked = false, any_dead = false;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.Tq; ++i) {
      for (int64_t j = 0; j < g.Tk; ++j) {
        const bool off = j >= m.end(i) || (m.pad && m.pad[b * g.Tk + j]);
        masked[(size_t)((b * g.Tq + i) * g.Tk + j)] = off;
        alive[(size_t)(b * g.Tq + i)] += off ? 0.0 : 1.0;
        any_masked |= off;
      }
      double& row = alive[(size_t)(b * g.Tq + i)];
      row = row > 0 ? 1.0 : 0.0;
      any_dead |= row == 0;
    }
  if (any_masked) s = masked_fill(s, from_vector(masked, {g.B, 1, g.Tq, g.Tk}, DType::f64), -1e30);
  Tensor p = softmax(s, -1);
  if (any_dead) p = mul(p, from_vector(alive, {g.B, 1, g.Tq, 1}, p.dtype()));
  if (a.dropout) {
    Tensor keep = full(p.shape(), 1.0, p.dtype());
    apply_dropout(keep, a.mask);
    p = mul(p, keep);
  }
  return matmul(p, v);
}

// ---- few queries per head, no tape (cached decoding) ------------------------------------------
//
// Decoding one token attends 1 query row per head over the cached keys: the batched matmuls
// become B*H matrix-vector products, which oneDNN runs as gemv after a transposed copy of K, per
// call. This loop instead reads each key and value row once per query, scores, softmax and the
// weighted sum of values in one pass over (b, h, i). Same mask, bias and softmax as the matmul
// path (softmax_row); only the order of the dot products' sums differs.
constexpr int64_t kFewQueries = 4;

// Whether few_queries_attention serves this call: no tape, no dropout, few query rows, and the
// head dim contiguous in q, k and v (the KV cache's slices are). Whether the weights are asked for
// plays no part, so asking for them never changes the output (the loop writes them too). Under
// the oneDNN bf16 path too: this float32 loop over the cache beat the bf16 matmuls over kept bf16
// copies of a steady K and V (half the bytes, but gemv calls and a transposed copy per call).
bool few_queries(const Tensor& q, const Tensor& k, const Tensor& v, const Geom& g, bool record,
                 const AttentionOptions& opt) {
  if (record || opt.dropout > 0 || g.Tq > kFewQueries) return false;
  return q.strides()[3] == 1 && k.strides()[3] == 1 && v.strides()[3] == 1;
}

// o[0, N) = the sum over keys j < Tk of p[j] v_j[0, N) (v_j at vb + j * vstride), each element
// summed key by key from 0 with one multiply-add per key: N / 16 independent register chains.
template <int64_t N, class S, class T>
void weighted_block(const T* p, const S* vb, int64_t vstride, int64_t Tk, T* o) {
  T acc[N] = {};
  for (int64_t j = 0; j < Tk; ++j) {
    const S* vj = vb + j * vstride;
    const T pj = p[j];
#pragma omp simd
    for (int64_t e = 0; e < N; ++e) acc[e] += pj * T(vj[e]);
  }
  std::copy(acc, acc + N, o);
}

// o (Dv) = the sum over keys j < Tk of p[j] v_j (v_j at vb + j * vstride), each element summed
// key by key from 0, one multiply-add per key (as `o[e] += p[j] * v_j[e]` over j, so the same
// values): blocks of 64, 32 or 16 elements stay in registers over the keys instead of a store
// and reload of o per key (a decoding step's attention spent a third of its time on those).
template <class S, class T>
void weighted_values(const T* p, const S* vb, int64_t vstride, int64_t Tk, int64_t Dv, T* o) {
  int64_t e0 = 0;
  for (; e0 + 64 <= Dv; e0 += 64) weighted_block<64>(p, vb + e0, vstride, Tk, o + e0);
  if (e0 + 32 <= Dv) weighted_block<32>(p, vb + e0, vstride, Tk, o + e0), e0 += 32;
  if (e0 + 16 <= Dv) weighted_block<16>(p, vb + e0, vstride, Tk, o + e0), e0 += 16;
  // The last Dv % 16 elements in place, in the same statement as the blocks (so the compiler
  // fuses or rounds the multiply-add alike: a reduction loop over j may not be fused).
  std::fill(o + e0, o + Dv, T(0));
  for (int64_t j = 0; j < Tk && e0 < Dv; ++j) {
    const S* vj = vb + j * vstride;
    const T pj = p[j];
#pragma omp simd
    for (int64_t e = e0; e < Dv; ++e) o[e] += pj * T(vj[e]);
  }
}

// out (contiguous (B, H, Tq, Dv)) = softmax(scale q k^T + bias, masked) v, row by row; the
// probabilities also go to `weights` (contiguous (B, H, Tq, Tk)) when it is defined. S is the
// storage type: 16-bit q, k, v (a bf16 model's KV cache) are read as they are, each element
// widened in registers (the query row once into the thread's buffer), the sums float32's, and
// the output and weights rounded once; the cache is never converted.
template <class S>
void few_queries_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& weights, const Geom& g, double scale, const RowMask& m,
                           const BiasView<S>& bias) {
  using T = kern::acc_t<S>;
  constexpr bool widen = !std::is_same_v<S, T>;
  const S *qp = q.data<const S>(), *kp = k.data<const S>(), *vp = v.data<const S>();
  const Shape &qs = q.strides(), &ks = k.strides(), &vs = v.strides();
  S* op = out.data<S>();
  S* wp = weights.defined() ? weights.data<S>() : nullptr;
  const int64_t rows = g.rows(), D = g.D, Dv = g.Dv;
  const T sc = (T)scale;
  detail::parallel_for_scratch(
      rows, rows * g.Tk * (D + Dv) > kern::kParallelGrain,
      [&] { return std::vector<T>(g.Tk + (widen ? D + Dv : 0)); },
      [&](int64_t r, std::vector<T>& buf) {
        const int64_t i = r % g.Tq, bh = r / g.Tq, h = bh % g.H, b = bh / g.H, end = m.end(i);
        T* s = buf.data();
        const S* q_row = qp + b * qs[0] + h * qs[1] + i * qs[2];
        const T* qi = nullptr;
        if constexpr (widen) {
          for (int64_t e = 0; e < D; ++e) s[g.Tk + e] = T(q_row[e]);
          qi = s + g.Tk;
        } else {
          qi = q_row;
        }
        const S* kb = kp + b * ks[0] + h * ks[1];
        const S* vb = vp + b * vs[0] + h * vs[1];
        for (int64_t j = 0; j < end; ++j) {
          const S* kj = kb + j * ks[2];
          T acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t e = 0; e < D; ++e) acc += qi[e] * T(kj[e]);
          s[j] = sc * acc;
        }
        softmax_row(s, g.Tk, end, m.pad ? m.pad + b * g.Tk : nullptr, bias.row(b, h, i),
                    bias.col_stride());
        if (wp)
          for (int64_t j = 0; j < g.Tk; ++j) wp[r * g.Tk + j] = S(s[j]);
        T* o = nullptr;
        if constexpr (widen) o = s + g.Tk + D;
        else o = op + r * Dv;
        // Every key, masked ones too (p = 0, past `end` as well): 0 * a NaN value is NaN, as in
        // the matmul path, so both paths give one result for a NaN value at any key.
        weighted_values(s, vb, vs[2], g.Tk, Dv, o);
        if constexpr (widen)
          for (int64_t e = 0; e < Dv; ++e) op[r * Dv + e] = S(o[e]);
      });
}

// Padding flags as bytes so the row loop does not care about the mask's dtype. Without a mask
// all calls share one empty list, and a dense float32 or int64 mask (the decoder's source
// padding, read by every cross-attention step) is read directly: no allocation, resp. two
// instead of three and a float64 copy.
template <class T>
void flags_of(const T* m, std::vector<uint8_t>& pad) {
  for (size_t i = 0; i < pad.size(); ++i) pad[i] = m[i] != 0;
}
std::shared_ptr<const std::vector<uint8_t>> pad_flags(const Tensor& key_padding_mask) {
  static const auto none = std::make_shared<const std::vector<uint8_t>>();
  const Tensor& m = key_padding_mask;
  if (!m.defined()) return none;
  std::vector<uint8_t> pad((size_t)m.numel());
  if (m.dtype() == DType::f32 && m.is_contiguous()) flags_of(m.data<const float>(), pad);
  else if (m.dtype() == DType::i64 && m.is_contiguous()) flags_of(m.data<const int64_t>(), pad);
  else flags_of(m.to_vector<double>().data(), pad);
  return std::make_shared<const std::vector<uint8_t>>(std::move(pad));
}

// The attention of few queries through few_queries_attention (no tape): the output, and the
// weights when asked for.
AttentionResult few_queries_result(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionCtx& a, const AttentionOptions& opt) {
  const Geom& g = a.g;
  AttentionResult res;
  res.out = Tensor::empty({g.B, g.H, g.Tq, g.Dv}, q.dtype());
  if (opt.return_weights) res.weights = Tensor::empty({g.B, g.H, g.Tq, g.Tk}, q.dtype());
  auto run = [&]<class S>(S*) {
    few_queries_attention<S>(q, k, v, res.out, res.weights, g, a.scale, a.row_mask(),
                             bias_view<S>(opt.bias, g));
  };
  if (is_half(q.dtype())) GRAFT_DISPATCH_HALF(q.dtype(), [&] { run((S*)nullptr); });
  else GRAFT_DISPATCH_FLOAT(q.dtype(), kOp, [&] { run((T*)nullptr); });
  return res;
}

// 16-bit q, k, v without a tape, more query rows than few_queries_attention takes: S = scale Q
// K^T by the 16-bit matmul into a float32 (B, H, Tq, Tk) tensor, the mask and softmax in float32
// there, P rounded to the 16-bit dtype for the P V matmul (an operand of the 16-bit matmul, as
// PyTorch's CPU flash attention rounds it for reduced types) and out = P V by the 16-bit matmul.
// Nothing of q, k or v is converted.
AttentionResult half_matmul_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionCtx& a, const AttentionOptions& opt) {
  const Geom& g = a.g;
  const kern::BCopy copy = opt.steady_kv ? kern::BCopy::steady : kern::BCopy::per_call;
  Tensor P = Tensor::empty({g.B, g.H, g.Tq, g.Tk}, DType::f32);
  Tensor P16 = Tensor::empty(P.shape(), q.dtype());
  AttentionResult res;
  res.out = Tensor::empty({g.B, g.H, g.Tq, g.Dv}, q.dtype());
  if (opt.return_weights) res.weights = P16;
  if (P.numel() == 0) {  // no key: every output row is 0, as a row with every key masked
    if (res.out.numel() > 0) fill_(res.out, 0);
    return res;
  }
  kern::bmm(q, kern::transposed(k), P, a.scale, false, copy);
  GRAFT_DISPATCH_HALF(q.dtype(), [&] {
    softmax_rows(P.data<float>(), g, a.row_mask(), bias_view<S>(opt.bias, g));
  });
  kern::store_rounded(P, P16);
  kern::bmm(P16, v, res.out, 1.0, false, copy);
  return res;
}

// The settings of a call of geometry g (its dropout mask drawn later, when there is one).
AttentionCtx attention_ctx(const Geom& g, const AttentionOptions& opt) {
  return AttentionCtx{g,
                      opt.scale != 0 ? opt.scale : 1.0 / std::sqrt((double)g.D),
                      pad_flags(opt.key_padding_mask),
                      opt.causal,
                      opt.dropout > 0,
                      {}};
}

// The float32 attention's forward (no tape): P from q and k, its dropout mask drawn into a, and
// out = P V (and the weights when asked for).
AttentionResult attention_forward(const QKV& in, AttentionCtx& a, const AttentionOptions& opt,
                                  bool record) {
  const Geom& g = a.g;
  const DType dt = in.q.is_kept() ? DType::f32 : in.q.f32.dtype();
  Tensor P = Tensor::empty({g.B, g.H, g.Tq, g.Tk}, dt);
  const bool steady = !record && opt.steady_kv;
  attention_probs(in.q, in.k, g, a.scale, a.row_mask(), opt.bias, P, steady);
  AttentionResult res;
  if (opt.return_weights) res.weights = a.dropout ? contiguous_copy(P) : P;
  if (a.dropout) {
    a.mask = kern::DropoutMask::draw(*opt.generator, opt.dropout, P.numel());
    apply_dropout(P, a.mask);
  }
  res.out = Tensor::empty({g.B, g.H, g.Tq, g.Dv}, dt);
  kern::bmm(P, in.v, res.out, 1.0, false,
            steady ? kern::BCopy::steady : kern::BCopy::per_call);  // out = P V
  return res;
}

// The backward of a recorded 16-bit attention (attention_half_recorded): the float32 backward
// run on float32 copies of the saved 16-bit q, k, v and bias, its gradients rounded back; under
// create_graph the composed float32 attention between recorded casts, differentiated.
Tensors attention_half_backward(const Ctx& c, const Tensors& dout, const AttentionCtx& a,
                                DType dt) {
  if (c.create_graph)
    return autograd::differentiate(
        [a, dt](const Tensors& in) {
          auto lift = [](const Tensor& t) { return t.defined() ? to_dtype(t, DType::f32) : t; };
          return Tensors{to_dtype(
              attention_composed(lift(in[0]), lift(in[1]), lift(in[2]), lift(in[3]), a), dt)};
        },
        c.saved, dout, c.needs);
  const QKV in{kern::widened(c.saved[0]), kern::widened(c.saved[1]), kern::widened(c.saved[2])};
  Tensors d = scaled_dot_product_attention_backward(kern::widened(dout[0]), c, in,
                                                    kern::widened(c.saved[3]), a);
  // dbias summed to the bias's shape in float32 before rounding (not per element of dS)
  if (d.size() > 3 && d[3].defined() && c.saved[3].defined())
    d[3] = sum_to_shape(d[3], c.saved[3].shape());
  for (Tensor& t : d) t = kern::narrowed(t, dt);
  return d;
}

// 16-bit q, k, v on the tape: the float32 attention on float32 copies made for the call (freed
// after it), one entry that saves the 16-bit q, k, v and bias and widens them again in backward.
// Through kern::via_f32 the float32 entry saved float32 copies of q, k and v (twice the bytes)
// beside its cast entries.
AttentionResult attention_half_recorded(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionOptions& opt) {
  kern::count_f32_detour();
  const DType dt = q.dtype();
  const Geom g = validate(q, k, v, opt);
  AttentionOptions of = opt;
  of.bias = kern::widened(opt.bias);
  const Tensor qf = kern::widened(q), kf = kern::widened(k), vf = kern::widened(v);
  AttentionCtx a = attention_ctx(g, of);
  AttentionResult rf = attention_forward(QKV{qf, kf, vf}, a, of, true);
  AttentionResult res{kern::narrowed(rf.out, dt), kern::narrowed(rf.weights, dt)};
  autograd::record(kOp, {q, k, v, opt.bias}, {res.out}, {q, k, v, opt.bias},
                   [a, dt, prec = precision_state()](const Ctx& c, const Tensors& dout) {
                     PrecisionGuard guard(prec);  // the forward's matmul precision, as float32's
                     return attention_half_backward(c, dout, a, dt);
                   });
  return res;
}

// bf16 and f16 through float32 (kern::via_f32): q, k, v and the bias cast, the output and the
// weights cast back; nullopt when none of them is 16-bit.
std::optional<AttentionResult> attention_via_f32(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const AttentionOptions& opt) {
  auto on_f32 = [&](const Tensor& qf, const Tensor& kf, const Tensor& vf, const Tensor& bias) {
    AttentionOptions o = opt;
    o.bias = bias;
    const AttentionResult r = scaled_dot_product_attention(qf, kf, vf, o);
    return Tensors{r.out, r.weights};
  };
  const auto r = kern::via_f32(kOp, on_f32, q, k, v, opt.bias);
  if (!r) return std::nullopt;
  return AttentionResult{(*r)[0], (*r)[1]};
}

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opt) {
  // 16-bit tensors without a tape (or dropout) run their own loops; else through float32.
  const bool half = kern::native_half(kOp, q, k, v, opt.bias) && !(opt.dropout > 0);
  if (!half && kern::half_dtype_of(kOp, q, k, v, opt.bias) &&
      autograd::needs_record({q, k, v, opt.bias}))
    return attention_half_recorded(q, k, v, opt);
  if (!half)
    if (auto r = attention_via_f32(q, k, v, opt)) return *r;
  const Geom g = validate(q, k, v, opt);
  AttentionCtx a = attention_ctx(g, opt);
  const bool record = autograd::needs_record({q, k, v, opt.bias});
  if (few_queries(q, k, v, g, record, opt)) return few_queries_result(q, k, v, a, opt);
  if (half) return half_matmul_attention(q, k, v, a, opt);
  const bool keep = record && g.rows() > 0 && g.Tk > 0 && keep_qkv_in_bf16(q, k, v);
  const QKV in = keep ? kept_qkv(q, k, v) : QKV{q, k, v};
  AttentionResult res = attention_forward(in, a, opt, record);
  if (!record) return res;
  auto backward = [a, prec = precision_state()](const Tensor& dout, const Ctx& c, const QKV& in,
                                                const Tensor& bias) {
    PrecisionGuard guard(prec);
    return scaled_dot_product_attention_backward(dout, c, in, bias, a);
  };
  if (keep) {
    autograd::record(kOp, {q, k, v, opt.bias}, {res.out}, {opt.bias},
                     {{in.q.kept.storage, q}, {in.k.kept.storage, k}, {in.v.kept.storage, v}},
                     [backward, in](const Ctx& c, const Tensors& dout) {
                       if (c.create_graph)
                         fail(autograd::ordinal(c.order) + " backward of '" + kOp +
                              "': under create_graph it needs q, k and v, "
                              "which the bf16 path kept only as bfloat16; compute higher-order "
                              "gradients in float32 precision");
                       return backward(dout[0], c, in, c.saved[0]);
                     });
  } else {
    autograd::record(
        kOp, {q, k, v, opt.bias}, {res.out}, {q, k, v, opt.bias},
        [backward, a](const Ctx& c, const Tensors& dout) {
          if (c.create_graph)
            return autograd::differentiate(
                [a](const Tensors& in) {
                  return Tensors{attention_composed(in[0], in[1], in[2], in[3], a)};
                },
                c.saved, dout, c.needs);
          return backward(dout[0], c, QKV{c.saved[0], c.saved[1], c.saved[2]}, c.saved[3]);
        });
  }
  return res;
}

}  // namespace graft
