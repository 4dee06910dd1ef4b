// Fused scaled dot-product attention, one tape entry with its own backward.
//
// Shape legend: q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv), S and P (B, H, Tq, Tk),
// out (B, H, Tq, Dv). float32: the four matmuls of the forward and backward run as oneDNN
// batched matmuls over the 4-D views (their strides describe transposes and head-split
// permutes, so nothing is copied), and the mask + softmax is an OpenMP loop over (b, h, i)
// rows. float64: plain loops of the same formulas.
//
// Memory: the tape keeps q, k, v (views of the projections, no copies) and the bias, not P:
// the backward recomputes P with one more Q K^T matmul (cheap next to the projections) rather
// than hold B*H*Tq*Tk floats per layer from forward to backward.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "autograd/gradcheck.h"
#include "ops/cases.h"
#include "ops/kernels.h"
#include "ops/onednn/dnnl_utils.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace graft {

using autograd::Ctx;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

GRAFT_DECLARE_OP(kOp, "attention");

struct Geom {
  int64_t B, H, Tq, Tk, D, Dv;
  int64_t rows() const { return B * H * Tq; }
};

// Reads element (b, h, t, d) of a rank-4 view through its strides.
template <class T>
struct View4 {
  const T* p;
  int64_t s0, s1, s2, s3;
  explicit View4(const Tensor& x)
      : p(x.data<const T>()),
        s0(x.strides()[0]),
        s1(x.strides()[1]),
        s2(x.strides()[2]),
        s3(x.strides()[3]) {}
  const T* row(int64_t b, int64_t h, int64_t t) const { return p + b * s0 + h * s1 + t * s2; }
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

// In place on one row s (Tk): s += bias, masked keys dropped, s = softmax(s). A row with no
// attendable key (or only -inf scores) becomes all zeros, so out = 0 and its gradients are 0.
// Separate branch-free passes so each vectorises (kern::exp_nonpos instead of a libm call):
// measured 14 -> 4 ms for the forward softmax of the attention micro-benchmark.
template <class T>
void softmax_row(T* s, int64_t Tk, int64_t end, const uint8_t* pad, const T* bias,
                 int64_t bias_stride) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (bias)
    for (int64_t j = 0; j < end; ++j) s[j] += bias[j * bias_stride];
  if (pad)
    for (int64_t j = 0; j < end; ++j) s[j] = pad[j] ? kNegInf : s[j];
  T mx = kNegInf;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < end; ++j) mx = std::max(mx, s[j]);
  if (mx == kNegInf) {
    for (int64_t j = 0; j < Tk; ++j) s[j] = 0;
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
template <class T>
void softmax_rows(T* s, const Geom& g, const RowMask& m, const BiasView<T>& bias) {
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

// ---- float64 reference (also used for empty float32 problems oneDNN cannot describe) -------

template <class T>
void forward_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Geom& g, T scale,
                 const RowMask& m, const BiasView<T>& bias, const Tensor& P, const Tensor& out) {
  const View4<T> Q(q), K(k), V(v);
  T* pp = P.data<T>();
  T* po = out.defined() ? out.data<T>() : nullptr;
  const int64_t rows = g.rows();
#pragma omp parallel for if (rows * g.Tk * g.D > kern::kParallelGrain) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % g.Tq, bh = r / g.Tq, h = bh % g.H, b = bh / g.H;
    T* s = pp + r * g.Tk;
    const T* qi = Q.row(b, h, i);
    for (int64_t j = 0; j < g.Tk; ++j) {
      const T* kj = K.row(b, h, j);
      T acc = 0;
      for (int64_t d = 0; d < g.D; ++d) acc += qi[d * Q.s3] * kj[d * K.s3];
      s[j] = scale * acc;
    }
    softmax_row(s, g.Tk, m.end(i), m.pad ? m.pad + b * g.Tk : nullptr, bias.row(b, h, i),
                bias.col_stride());
    if (!po) continue;  // P only (the backward's recompute)
    T* o = po + r * g.Dv;
    for (int64_t e = 0; e < g.Dv; ++e) o[e] = 0;
    for (int64_t j = 0; j < g.Tk; ++j) {
      const T* vj = V.row(b, h, j);
      for (int64_t e = 0; e < g.Dv; ++e) o[e] += s[j] * vj[e * V.s3];
    }
  }
}

// dS is written into dS (contiguous (B, H, Tq, Tk)); dq, dk, dv may be undefined (not needed).
template <class T>
void backward_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& P,
                  const Tensor& dout, const Geom& g, T scale, const Tensor& dS, const Tensor& dq,
                  const Tensor& dk, const Tensor& dv) {
  const View4<T> Q(q), K(k), V(v);
  const T* pp = P.data<T>();
  const T* pdo = dout.data<T>();
  T* pds = dS.defined() ? dS.data<T>() : nullptr;
  T* pdq = dq.defined() ? dq.data<T>() : nullptr;
  T* pdk = dk.defined() ? dk.data<T>() : nullptr;
  T* pdv = dv.defined() ? dv.data<T>() : nullptr;
  const int64_t BH = g.B * g.H, Tq = g.Tq, Tk = g.Tk, D = g.D, Dv = g.Dv;
  // One (b, h) per iteration: every gradient element is written by one thread.
#pragma omp parallel for if (BH * Tq * Tk * (D + Dv) > kern::kParallelGrain) schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t b = bh / g.H, h = bh % g.H;
    const T* P_ = pp + bh * Tq * Tk;
    const T* dO = pdo + bh * Tq * Dv;
    if (pdv) {  // dV = P^T dO
      T* dV = pdv + bh * Tk * Dv;
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t e = 0; e < Dv; ++e) {
          T acc = 0;
          for (int64_t i = 0; i < Tq; ++i) acc += P_[i * Tk + j] * dO[i * Dv + e];
          dV[j * Dv + e] = acc;
        }
    }
    if (!pds) continue;
    T* dS_ = pds + bh * Tq * Tk;
    for (int64_t i = 0; i < Tq; ++i) {  // dP = dO V^T, then dS = P * (dP - rowsum(dP * P))
      T dot = 0;
      for (int64_t j = 0; j < Tk; ++j) {
        const T* vj = V.row(b, h, j);
        T acc = 0;
        for (int64_t e = 0; e < Dv; ++e) acc += dO[i * Dv + e] * vj[e * V.s3];
        dS_[i * Tk + j] = acc;
        dot += acc * P_[i * Tk + j];
      }
      for (int64_t j = 0; j < Tk; ++j) dS_[i * Tk + j] = P_[i * Tk + j] * (dS_[i * Tk + j] - dot);
    }
    if (pdq) {  // dQ = scale * dS K
      T* dQ = pdq + bh * Tq * D;
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t d = 0; d < D; ++d) {
          T acc = 0;
          for (int64_t j = 0; j < Tk; ++j) acc += dS_[i * Tk + j] * K.row(b, h, j)[d * K.s3];
          dQ[i * D + d] = scale * acc;
        }
    }
    if (pdk) {  // dK = scale * dS^T Q
      T* dK = pdk + bh * Tk * D;
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t d = 0; d < D; ++d) {
          T acc = 0;
          for (int64_t i = 0; i < Tq; ++i) acc += dS_[i * Tk + j] * Q.row(b, h, i)[d * Q.s3];
          dK[j * D + d] = scale * acc;
        }
    }
  }
}

// ---- validation ----------------------------------------------------------------------------

std::string qkv_str(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q " + describe(q) + ", k " + describe(k) + ", v " + describe(v);
}

Geom validate(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  const std::string op = kOp;
  if (!q.defined() || !k.defined() || !v.defined()) fail(op + ": q, k and v must be defined");
  for (const Tensor* t : {&q, &k, &v}) kern::check_float(kOp, *t);
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    fail(op + ": dtype mismatch, " + qkv_str(q, k, v));
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    fail(op + ": q, k, v must be rank 4 (B, H, T, D), got " + qkv_str(q, k, v));
  const Geom g{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  if (k.size(0) != g.B || k.size(1) != g.H || v.size(0) != g.B || v.size(1) != g.H)
    fail(op + ": batch and head dims (B, H) differ: " + qkv_str(q, k, v));
  if (k.size(3) != g.D)
    fail(op + ": q and k head dims differ (" + std::to_string(g.D) + " vs " +
         std::to_string(k.size(3)) + "): " + qkv_str(q, k, v));
  if (v.size(2) != g.Tk)
    fail(op + ": k and v key counts differ (" + std::to_string(g.Tk) + " vs " +
         std::to_string(v.size(2)) + "): " + qkv_str(q, k, v));
  const Tensor& mask = opt.key_padding_mask;
  if (mask.defined() && (mask.dim() != 2 || mask.size(0) != g.B || mask.size(1) != g.Tk))
    fail(op + ": key_padding_mask " + describe(mask) + " must be (B, Tk) = " +
         shape_str({g.B, g.Tk}) + " for " + qkv_str(q, k, v));
  const Tensor& bias = opt.bias;
  if (bias.defined()) {
    if (bias.dtype() != q.dtype())
      fail(op + ": bias " + describe(bias) + " must have the dtype of q " + describe(q));
    const Shape full{g.B, g.H, g.Tq, g.Tk};
    bool ok = bias.dim() <= 4;
    for (int64_t d = 0; ok && d < bias.dim(); ++d) {
      const int64_t n = bias.size(d), want = full[4 - bias.dim() + d];
      ok = n == want || n == 1;
    }
    if (!ok)
      fail(op + ": bias " + describe(bias) + " does not broadcast to (B, H, Tq, Tk) = " +
           shape_str(full));
  }
  if (!std::isfinite(opt.scale))
    fail(op + ": scale must be finite, got " + std::to_string(opt.scale));
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

// P = softmax(scale Q K^T + bias) over the attendable keys; also out = P V when out is defined.
void attention_probs(const Tensor& q, const Tensor& k, const Tensor& v, const Geom& g,
                     double scale, const RowMask& m, const Tensor& bias, const Tensor& P,
                     const Tensor& out) {
  const DType dt = q.dtype();
  if (dt == DType::f32 && P.numel() > 0 && q.numel() > 0 && v.numel() > 0) {
    kern::bmm(q, kern::swap_last2(k), P, scale);  // S = scale Q K^T
    softmax_rows(P.data<float>(), g, m, bias_view<float>(bias, g));
    if (out.defined()) kern::bmm(P, v, out);  // out = P V
  } else if (dt == DType::f32) {
    forward_ref<float>(q, k, v, g, (float)scale, m, bias_view<float>(bias, g), P, out);
  } else {
    forward_ref<double>(q, k, v, g, scale, m, bias_view<double>(bias, g), P, out);
  }
}

// P is recomputed here (same code and inputs as the forward, so the same values), not kept
// from the forward: one Q K^T matmul and a softmax pass instead of B*H*Tq*Tk floats per layer
// held from forward to backward. dbias is dS of the full (B, H, Tq, Tk) shape (the bias enters
// S unscaled); the tape sums it over the dims the bias was broadcast along.
Tensors scaled_dot_product_attention_backward(const Ctx& c, const Tensor& dout, const Geom& g,
                                              double scale, const RowMask& m) {
  const Tensor &q = c.saved[0], &k = c.saved[1], &v = c.saved[2], &bias = c.saved[3];
  const DType dt = q.dtype();
  Tensor P = Tensor::empty({g.B, g.H, g.Tq, g.Tk}, dt);
  attention_probs(q, k, v, g, scale, m, bias, P, Tensor());
  const bool need_q = c.needs[0], need_k = c.needs[1], need_v = c.needs[2];
  const bool need_bias = c.needs.size() > 3 && c.needs[3];
  const bool need_ds = need_q || need_k || need_bias;
  Tensor dq = need_q ? Tensor::empty(q.shape(), dt) : Tensor();
  Tensor dk = need_k ? Tensor::empty(k.shape(), dt) : Tensor();
  Tensor dv = need_v ? Tensor::empty(v.shape(), dt) : Tensor();
  Tensor dS = need_ds ? Tensor::empty(P.shape(), dt) : Tensor();
  if (dt == DType::f32 && P.numel() > 0 && q.numel() > 0 && v.numel() > 0) {
    using kern::swap_last2;
    if (need_v) kern::bmm(swap_last2(P), dout, dv);  // dV = P^T dO
    if (need_ds) {
      kern::bmm(dout, swap_last2(v), dS);  // dP = dO V^T
      softmax_bwd_rows(dS.data<float>(), P.data<const float>(), g);
      if (need_q) kern::bmm(dS, k, dq, scale);               // dQ = scale dS K
      if (need_k) kern::bmm(swap_last2(dS), q, dk, scale);   // dK = scale dS^T Q
    }
  } else if (dt == DType::f32) {
    backward_ref<float>(q, k, v, P, dout, g, (float)scale, dS, dq, dk, dv);
  } else {
    backward_ref<double>(q, k, v, P, dout, g, scale, dS, dq, dk, dv);
  }
  return {dq, dk, dv, need_bias ? dS : Tensor()};
}

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opt) {
  const Geom g = validate(q, k, v, opt);
  const double scale = opt.scale != 0 ? opt.scale : 1.0 / std::sqrt((double)g.D);
  const DType dt = q.dtype();

  // Padding flags as bytes so the row loop does not care about the mask's dtype.
  std::vector<uint8_t> pad;
  if (opt.key_padding_mask.defined()) {
    const auto mv = opt.key_padding_mask.to_vector<double>();
    pad.resize(mv.size());
    for (size_t i = 0; i < mv.size(); ++i) pad[i] = mv[i] != 0;
  }
  const RowMask m{pad.empty() ? nullptr : pad.data(), opt.causal, g.Tq, g.Tk};

  Tensor P = Tensor::empty({g.B, g.H, g.Tq, g.Tk}, dt);
  Tensor out = Tensor::empty({g.B, g.H, g.Tq, g.Dv}, dt);
  attention_probs(q, k, v, g, scale, m, opt.bias, P, out);

  AttentionResult res;
  res.out = out;
  if (opt.return_weights) res.weights = P;
  if (autograd::needs_record({q, k, v, opt.bias})) {
    auto pad_bytes = std::make_shared<const std::vector<uint8_t>>(std::move(pad));
    autograd::record(kOp, {q, k, v, opt.bias}, {out}, {q, k, v, opt.bias},
                     [g, scale, pad_bytes, causal = opt.causal](const Ctx& c, const Tensors& dout) {
                       const RowMask m{pad_bytes->empty() ? nullptr : pad_bytes->data(), causal,
                                       g.Tq, g.Tk};
                       return scaled_dot_product_attention_backward(c, dout[0], g, scale, m);
                     });
  }
  return res;
}

// ---- gradcheck cases (B=2, H=2, T<=4, D<=3) -------------------------------------------------

namespace {

// x = {q, k, v, [mask or bias]}; extra names what x[3] is.
enum class Extra { none, mask, bias };
Tensor attn(const Tensors& x, bool causal, Extra extra = Extra::none) {
  AttentionOptions opt;
  opt.causal = causal;
  if (extra == Extra::mask) opt.key_padding_mask = x[3];
  if (extra == Extra::bias) opt.bias = x[3];
  return scaled_dot_product_attention(x[0], x[1], x[2], opt).out;
}

Tensors qkv(DType dt, Generator& g, int64_t Tq, int64_t Tk) {
  return {case_input({2, 2, Tq, 3}, dt, g), case_input({2, 2, Tk, 3}, dt, g),
          case_input({2, 2, Tk, 2}, dt, g)};
}

}  // namespace

void register_attention_cases() {
  register_case(OpCase{.name = "attention/plain",
                       .op = "scaled_dot_product_attention",
                       .make_inputs = [](DType dt, Generator& g) { return qkv(dt, g, 3, 4); },
                       .fn = [](const Tensors& x) { return attn(x, false); }});
  register_case(OpCase{.name = "attention/causal_square",
                       .op = "scaled_dot_product_attention",
                       .make_inputs = [](DType dt, Generator& g) { return qkv(dt, g, 4, 4); },
                       .fn = [](const Tensors& x) { return attn(x, true); }});
  register_case(OpCase{.name = "attention/causal_tq_lt_tk",
                       .op = "scaled_dot_product_attention",
                       .make_inputs = [](DType dt, Generator& g) { return qkv(dt, g, 2, 4); },
                       .fn = [](const Tensors& x) { return attn(x, true); }});
  // Batch 1 has every key masked: its outputs and gradients must be 0, not NaN.
  register_case(OpCase{.name = "attention/padding_all_masked_row",
                       .op = "scaled_dot_product_attention",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             Tensors x = qkv(dt, g, 3, 4);
                             x.push_back(from_vector(std::vector<int64_t>{0, 0, 1, 0, 1, 1, 1, 1}, {2, 4}));
                             return x;
                           },
                       .fn = [](const Tensors& x) { return attn(x, false, Extra::mask); }});
  register_case(OpCase{.name = "attention/broadcast_bias",
                       .op = "scaled_dot_product_attention",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             Tensors x = qkv(dt, g, 3, 4);
                             x.push_back(case_input({1, 2, 3, 4}, dt, g));
                             return x;
                           },
                       .fn = [](const Tensors& x) { return attn(x, true, Extra::bias); }});
  // q as the (B, T, H, D) output of a projection, split into heads by a permute view.
  register_case(OpCase{.name = "attention/noncontig_q",
                       .op = "scaled_dot_product_attention",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3, 2, 3}, dt, g), case_input({2, 2, 4, 3}, dt, g),
                                            case_input_t({2, 2, 4, 2}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             AttentionOptions opt;
                             opt.scale = 0.7;
                             return scaled_dot_product_attention(permute(x[0], {0, 2, 1, 3}), x[1], x[2], opt)
                                 .out;
                           }});
}

}  // namespace graft
