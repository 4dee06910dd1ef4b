// matmul and linear. float32 runs oneDNN (kern::bmm for matmul and linear's training forward;
// inner_product for linear's inference and backward) on the tensors' own strides, so transposed
// views are read in place; float64 runs reference loops. bf16 and f16 tensors run natively,
// forward and backward, in their own dtype (kern::bmm's 16-bit path; linear over at most 4 rows
// its own loop), no copy of a weight made or kept.
#include "graft/ops/matmul.h"
#include "ops/internal/backward_ops.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <type_traits>
#if defined(__AVX512BF16__) || defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "graft/autograd/gradcheck.h"
#include "graft/ops/precision.h"
#include "graft/ops/reduce.h"
#include "graft/ops/shape.h"
#include "ops/internal/backward_ops.h"
#include "ops/internal/bf16.h"
#include "ops/internal/dnnl_utils.h"
#include "ops/internal/int8.h"
#include "ops/internal/kept.h"
#include "ops/internal/kernels.h"
#include "ops/internal/panels.h"

namespace graft {

using kern::reshaped;
using kern::swap_last2;
using kern::view_as;

namespace {

// Prepends size-1 dims up to rank r (the broadcasting rule for batch dims).
Tensor pad_rank(const Tensor& t, size_t r) {
  Shape s = t.shape(), st = t.strides();
  const size_t k = s.size();
  s.insert(s.begin(), r - k, 1);
  st.insert(st.begin(), r - k, k ? st[0] * s[r - k] : 1);
  return view_as(t, s, st);
}

// out = a @ b for operands of equal rank >= 2 whose batch dims broadcast; a fresh tensor.
Tensor matmul_core(const Tensor& a, const Tensor& b) {
  const int64_t r = a.dim();
  Shape out_shape(r);
  for (int64_t d = 0; d < r - 2; ++d) out_shape[d] = std::max(a.shape()[d], b.shape()[d]);
  out_shape[r - 2] = a.shape()[r - 2];
  out_shape[r - 1] = b.shape()[r - 1];
  Tensor out = Tensor::empty(out_shape, a.dtype());
  kern::bmm(a, b, out);
  return out;
}

// torch.matmul's promotion: a 1-D a becomes (1, K), a 1-D b becomes (K, 1), then both are
// padded to a common rank. Also validates and returns the final output shape.
struct Promoted {
  Tensor a, b;
  Shape out_shape;
};

Promoted promote(const Tensor& a, const Tensor& b) {
  // The message prefix, built only when a check fails.
  const auto what = [&] {
    return "matmul: " + shape_str(a.shape()) + " @ " + shape_str(b.shape());
  };
  if (a.dim() == 0 || b.dim() == 0) fail(what() + ": both operands need at least 1 dim");
  Promoted p;
  p.a = a.dim() == 1
            ? view_as(a, {1, a.shape()[0]}, {a.shape()[0] * a.strides()[0], a.strides()[0]})
            : a;
  p.b = b.dim() == 1 ? view_as(b, {b.shape()[0], 1}, {b.strides()[0], 1}) : b;
  const int64_t K = p.a.shape().back(), Kb = p.b.shape()[p.b.dim() - 2];
  if (K != Kb) fail(what() + ": inner dims " + std::to_string(K) + " != " + std::to_string(Kb));
  const size_t r = std::max(p.a.dim(), p.b.dim());
  p.a = pad_rank(p.a, r);
  p.b = pad_rank(p.b, r);
  for (size_t d = 0; d + 2 < r; ++d) {
    const int64_t da = p.a.shape()[d], db = p.b.shape()[d];
    if (da != db && da != 1 && db != 1)
      fail(what() + ": batch dims " +
           shape_str(Shape(a.shape().begin(), a.shape().end() - std::min<int64_t>(a.dim(), 2))) +
           " and " +
           shape_str(Shape(b.shape().begin(), b.shape().end() - std::min<int64_t>(b.dim(), 2))) +
           " cannot be broadcast");
    p.out_shape.push_back(std::max(da, db));
  }
  if (a.dim() > 1) p.out_shape.push_back(a.shape()[a.dim() - 2]);
  if (b.dim() > 1) p.out_shape.push_back(b.shape().back());
  return p;
}

}  // namespace

// matmul: a (..., M, K) @ b (..., K, N) -> out (broadcast(...), M, N)
GRAFT_DECLARE_OP("matmul", "matmul");

// dout (out's shape) -> da = dout @ b^T, db = a^T @ dout, each of the broadcast (batch..., M, K)
// or (batch..., K, N) shape the tape sums down to the operand's (a 1-D b excepted: its (K, 1)
// promotion is not a broadcast, so it is reduced here).
// matmul's backward as recorded ops (under create_graph): 1-D operands promoted as in the forward
// (a (K) as (1, K), b (K) as (K, 1)), the promoted dims dropped again; broadcast batch dims are
// summed by the tape.
Tensors matmul_backward_graph(const Tensor& dout, const Tensor& a, const Tensor& b,
                              const std::vector<bool>& needs) {
  const Tensor pa = a.dim() == 1 ? unsqueeze(a, 0) : a, pb = b.dim() == 1 ? unsqueeze(b, -1) : b;
  Shape ps = dout.shape();
  if (a.dim() == 1) ps.insert(ps.end() - (b.dim() == 1 ? 0 : 1), 1);
  if (b.dim() == 1) ps.push_back(1);
  const Tensor g = reshape(dout, ps);
  Tensor da, db;
  if (needs[0]) {
    da = matmul(g, transpose(pb, -1, -2));
    if (a.dim() == 1) da = squeeze(da, -2);
  }
  if (needs[1]) {
    db = matmul(transpose(pa, -1, -2), g);
    if (b.dim() == 1) db = squeeze(db, -1);
  }
  return {da, db};
}

Tensors matmul_backward(const Tensor& dout, const Tensor& a, const Tensor& b,
                        const std::vector<bool>& needs) {
  const Promoted p = promote(a, b);
  const int64_t r = p.a.dim();
  Shape ps(p.out_shape.begin(), p.out_shape.begin() + (r - 2));
  ps.push_back(p.a.shape()[r - 2]);
  ps.push_back(p.b.shape()[r - 1]);
  const Tensor g = reshaped(dout, ps);  // dout as the promoted (B..., M, N) product
  Tensor da, db;
  if (needs[0]) da = matmul_core(g, swap_last2(p.b));
  if (needs[1]) {
    // For a 2-D b under a batched a, db is one gemm over all rows: (K, B*M) @ (B*M, N).
    const int64_t rs = kern::batch_is_one(p.b) ? kern::merged_row_stride(p.a) : -1;
    if (r > 2 && rs >= 0) {
      const int64_t K = p.a.shape().back(), rows = p.a.numel() / K;
      db = reshaped(matmul_core(view_as(p.a, {K, rows}, {p.a.strides().back(), rs}),
                                reshaped(g, {rows, g.shape().back()})),
                    p.b.shape());  // (K, N) as b's promoted (1..., K, N)
    } else {
      db = matmul_core(swap_last2(p.a), g);
    }
    if (b.dim() == 1) db = reshaped(kern::contig(sum_to_shape(db, {b.size(0), 1})), b.shape());
  }
  return {da, db};
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  kern::check_float("matmul", a);
  kern::check_float("matmul", b);
  if (a.dtype() != b.dtype())
    fail("matmul: " + shape_str(a.shape()) + " @ " + shape_str(b.shape()) + ": dtype mismatch, " +
         describe(a) + " vs " + describe(b));
  Promoted p = promote(a, b);
  Tensor out = reshaped(matmul_core(p.a, p.b), p.out_shape);
  if (autograd::needs_record({a, b}))
    autograd::record("matmul", {a, b}, {out}, {a, b},
                     [prec = precision_state()](const autograd::Ctx& c, const Tensors& dout) {
                       PrecisionGuard guard(prec);
                       if (c.create_graph)
                         return matmul_backward_graph(dout[0], c.saved[0], c.saved[1], c.needs);
                       return matmul_backward(dout[0], c.saved[0], c.saved[1], c.needs);
                     });
  return out;
}

// ---- linear ----

namespace {

// x (N, IN) contiguous, w (OUT, IN) contiguous, b (OUT) or undefined -> y (N, OUT)
template <class T>
void linear_loop(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t N = x.shape()[0], IN = x.shape()[1], OUT = w.shape()[0];
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  T* py = y.data<T>();
#pragma omp parallel for if (N * IN * OUT > kern::kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      T acc = pb ? pb[o] : T(0);
      for (int64_t i = 0; i < IN; ++i) acc += px[n * IN + i] * pw[o * IN + i];
      py[n * OUT + o] = acc;
    }
}

// dy (N, OUT), w (OUT, IN), x (N, IN), all contiguous; fills the defined outputs.
template <class T>
void linear_backward_loop(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                          const Tensor& dw, const Tensor& db) {
  const int64_t N = x.shape()[0], IN = x.shape()[1], OUT = w.shape()[0];
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const bool big = N * IN * OUT > kern::kParallelGrain;
  // dx = dy W, split over rows of x
  if (dx.defined()) {
    T* pdx = dx.data<T>();
#pragma omp parallel for if (big) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      T* row = pdx + n * IN;
      for (int64_t i = 0; i < IN; ++i) row[i] = T(0);
      for (int64_t o = 0; o < OUT; ++o) {
        const T g = pdy[n * OUT + o];
        for (int64_t i = 0; i < IN; ++i) row[i] += g * pw[o * IN + i];
      }
    }
  }
  // dW = dy^T x and db = sum of dy's rows, split over output features
  if (dw.defined() || db.defined()) {
    T* pdw = dw.defined() ? dw.data<T>() : nullptr;
    T* pdb = db.defined() ? db.data<T>() : nullptr;
#pragma omp parallel for if (big) schedule(static)
    for (int64_t o = 0; o < OUT; ++o) {
      if (pdw)
        for (int64_t i = 0; i < IN; ++i) pdw[o * IN + i] = T(0);
      T bsum = T(0);
      for (int64_t n = 0; n < N; ++n) {
        const T g = pdy[n * OUT + o];
        bsum += g;
        if (pdw)
          for (int64_t i = 0; i < IN; ++i) pdw[o * IN + i] += g * px[n * IN + i];
      }
      if (pdb) pdb[o] = bsum;
    }
  }
}

// Descriptors of a linear over contiguous x (N, IN), w (OUT, IN), b (OUT), y (N, OUT).
struct LinearMds {
  dnnl::memory::desc x, w, b, y;
  LinearMds(int64_t N, int64_t IN, int64_t OUT, bool has_bias)
      : x(onednn::md_contiguous({N, IN})),
        w(onednn::md_contiguous({OUT, IN})),
        b(has_bias ? onednn::md_contiguous({OUT}) : dnnl::memory::desc()),
        y(onednn::md_contiguous({N, OUT})) {}
};

dnnl::inner_product_forward::primitive_desc linear_fwd_pd(const LinearMds& m,
                                                          dnnl::prop_kind kind) {
  using ipf = dnnl::inner_product_forward;
  const auto attr = onednn::user_scratchpad();
  return m.b.is_zero()
             ? ipf::primitive_desc(ipf::desc(kind, m.x, m.w, m.y), attr, onednn::engine())
             : ipf::primitive_desc(ipf::desc(kind, m.x, m.w, m.b, m.y), attr, onednn::engine());
}

// Runs a cached inner_product forward (mds: x, w, b, y) on x, w at those pointers, b and y2.
void execute_inner_product(const onednn::Cached<dnnl::inner_product_forward>& c, void* x, void* w,
                           const Tensor& b, const Tensor& y2) {
  onednn::run(c, {{DNNL_ARG_SRC, c.mds[0], x},
                  {DNNL_ARG_WEIGHTS, c.mds[1], w},
                  {DNNL_ARG_BIAS, c.mds[2], b.defined() ? b.raw() : nullptr},
                  {DNNL_ARG_DST, c.mds[3], y2.raw()}});
}

#if defined(__AVX512F__)
// The sum of v's 16 lanes in a fixed order (halves added, then their halves...).
// _mm512_reduce_add_ps would do: g++ 12 warns on its undefined upper half (GCC bug 105593).
float lanes_sum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  for (int half = 8; half > 0; half /= 2)
    for (int j = 0; j < half; ++j) t[j] += t[j + half];
  return t[0];
}

// y[0, R) for R rows of w (IN apart) at once: x's 16 values loaded once for the R rows, R
// independent chains of 16-lane sums, the last (IN % 16) columns under a mask, one horizontal sum
// per row at the end. A row's sum does not depend on R (the same lanes in the same order), so
// neither on the split over threads.
template <int R>
void rows_dot(const float* x, const float* w, const float* b, float* y, int64_t IN) {
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= IN; i += 16) {
    const __m512 xv = _mm512_loadu_ps(x + i);
    for (int r = 0; r < R; ++r) a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w + r * IN + i), xv, a[r]);
  }
  if (i < IN) {
    const auto m = static_cast<__mmask16>((1u << (IN - i)) - 1);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    for (int r = 0; r < R; ++r)
      a[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + r * IN + i), xv, a[r]);
  }
  for (int r = 0; r < R; ++r) {
    const float s = lanes_sum(a[r]);
    y[r] = b ? s + b[r] : s;
  }
}

// Short rows (IN <= 256: a tied output projection of a small model): 8 rows at a time, the groups
// split over the threads. One row at a time, each output paid a loop's start, a masked tail and a
// horizontal sum for a few vectors of work: 8 at once took a tiny model's projection (1000 x 128)
// from 13.5 to 7 us on one Zen 4 thread, small's (8000 x 256) from 160 to 125. Longer rows keep
// the one-row loop: one stream of weights, which read base's (8000 x 512) no slower than 8 streams.
// So do weights past 1 MiB (kShortRowsMost): a decoding step reads them again only after the rest
// of the model has gone through the caches, and from there 8 rows side by side ran 1.7-2.5x slower
// than one row after another (small's 8000 x 256 projection rotated through 64 MiB: 300 against
// 174 us; 1000 x 128 through 20 MiB: 10.4 against 8.0; AMD EPYC Zen 4, 2 threads): small's greedy
// batch 1 went 18.7 -> 12.8 ms without it. Held in the caches (tiny's whole model is 2.5 MiB)
// they ran 1.4-2x faster (docs/performance.md).
constexpr int64_t kShortRowsMost = int64_t(1) << 18;  // float32 values: 1 MiB

bool linear_short_rows(const float* x, const float* w, const float* b, float* y, int64_t IN,
                       int64_t OUT) {
  constexpr int64_t R = 8;
  if (IN > 256 || OUT * IN > kShortRowsMost) return false;
  const int64_t groups = (OUT + R - 1) / R;
#pragma omp parallel for schedule(static) if (OUT * IN >= 16384)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o0 = g * R;
    const float* bb = b ? b + o0 : nullptr;
    if (o0 + R <= OUT) rows_dot<R>(x, w + o0 * IN, bb, y + o0, IN);
    else
      for (int64_t o = o0; o < OUT; ++o) rows_dot<1>(x, w + o * IN, b ? b + o : nullptr, y + o, IN);
  }
  return true;
}
#else
bool linear_short_rows(const float*, const float*, const float*, float*, int64_t, int64_t) {
  return false;  // the one-row loop below (no 512-bit vectors to hold 8 rows' sums)
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// The sum of v's 8 lanes in a fixed order (halves added, then their halves).
float lanes_sum8(__m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int half = 4; half > 0; half /= 2)
    for (int j = 0; j < half; ++j) t[j] += t[j + half];
  return t[0];
}

// y[0, R) for R rows of w (IN apart) with 8-lane vectors: x's 8 values loaded once for the R
// rows, R independent chains, the last (IN % 8) columns under a mask. A row's sum does not depend
// on R, so neither on the split over threads.
template <int R>
void rows_dot8(const float* x, const float* w, const float* b, float* y, int64_t IN) {
  __m256 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= IN; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    for (int r = 0; r < R; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * IN + i), xv, a[r]);
  }
  if (i < IN) {
    alignas(32) int32_t lane[8];
    for (int j = 0; j < 8; ++j) lane[j] = i + j < IN ? -1 : 0;
    const __m256i m = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane));
    const __m256 xv = _mm256_maskload_ps(x + i, m);
    for (int r = 0; r < R; ++r)
      a[r] = _mm256_fmadd_ps(_mm256_maskload_ps(w + r * IN + i, m), xv, a[r]);
  }
  for (int r = 0; r < R; ++r) {
    const float s = lanes_sum8(a[r]);
    y[r] = b ? s + b[r] : s;
  }
}

// M rows of x (IN apart; y's rows OUT apart) through plain rows on AVX2, 8 weight rows side by
// side (8 streams), each group read from memory once and from the L1/L2 cache for the other rows
// of x, the groups split over the threads. One row: TinyLlama's and SmolLM's weights from memory
// at 31.7 and 27.9 GB/s against 27.7 and 25.2 one row at a time (AMD EPYC Zen 3, 2 threads,
// 2 MiB pages: docs/hub-models.md); 2-4 rows (beam search) in place of oneDNN's gemm:jit, which
// reads a weight for each call as it does for 32 rows.
bool linear_rows_avx2(const float* x, const float* w, const float* b, float* y, int64_t IN,
                      int64_t OUT, int64_t M = 1) {
  constexpr int64_t R = 8;
  const int64_t groups = (OUT + R - 1) / R;
#pragma omp parallel for schedule(static) if (M * OUT * IN >= 16384)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o0 = g * R;
    const float* bb = b ? b + o0 : nullptr;
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * IN;
      float* ym = y + m * OUT;
      if (o0 + R <= OUT) rows_dot8<R>(xm, w + o0 * IN, bb, ym + o0, IN);
      else
        for (int64_t o = o0; o < OUT; ++o)
          rows_dot8<1>(xm, w + o * IN, b ? b + o : nullptr, ym + o, IN);
    }
  }
  return true;
}

std::atomic<uint64_t> pieces_calls{0};  // kern::linear_pieces_calls

// M rows of x through plain rows of a wide weight (OUT >= 2048) on AVX2: the outputs cut into
// pieces of 256 rows of w split over the threads, each piece one single-threaded dnnl_sgemm.
// oneDNN's gemm:jit run on the whole problem with two threads reached 48 GMAC/s at Marian's
// vocabulary projection (32 x 512 x 58112) and 70 at its FFN (32 x 512 x 2048); in pieces 54
// and 76 (AMD EPYC Zen 3: docs/hub-models.md). Narrower weights stay whole (pieces of 512
// outputs were slower), and so does a weight with fewer than 2 pieces a thread (measured at 2
// threads only: more threads than that would idle).
bool linear_pieces_avx2(const float* x, const float* w, const float* b, float* y, int64_t IN,
                        int64_t OUT, int64_t M) {
  constexpr int64_t kPiece = 256;
  const int64_t pieces = (OUT + kPiece - 1) / kPiece;
  if (OUT < 8 * kPiece || pieces < 2 * (int64_t)omp_get_max_threads()) return false;
  pieces_calls.fetch_add(1, std::memory_order_relaxed);
  std::atomic<int> failed{dnnl_success};
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t o0 = p * kPiece, n = std::min(kPiece, OUT - o0);
    const dnnl_status_t st =
        dnnl_sgemm('N', 'T', M, n, IN, 1.f, x, IN, w + o0 * IN, IN, 0.f, y + o0, OUT);
    if (st != dnnl_success) failed = st;
    if (b)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t o = o0; o < o0 + n; ++o) y[m * OUT + o] += b[o];
  }
  if (failed != dnnl_success)
    fail("linear: oneDNN's dnnl_sgemm refused " + std::to_string(M) + " x " + std::to_string(IN) +
         " x " + std::to_string(OUT) + " (status " + std::to_string(failed.load()) + ")");
  return true;
}
#else
bool linear_rows_avx2(const float*, const float*, const float*, float*, int64_t, int64_t,
                      int64_t = 1) {
  return false;  // AVX-512 (linear_short_rows, the one-row loop) or no AVX2
}
bool linear_pieces_avx2(const float*, const float*, const float*, float*, int64_t, int64_t,
                        int64_t) {
  return false;  // AVX-512 (keep_for_inference keeps blocked weights there) or no AVX2 / FMA
}
#endif

// One row through graft's own loop: y (OUT) = w (OUT, IN) x (IN) + b, the rows of w split over
// the threads and read in order (one stream for the prefetcher). oneDNN's inner product at one row
// splits outputs of 128-256 features over two threads poorly (15-18 GB/s of weights from L3
// against 45-60 here, measured on a Zen 4); see docs/performance.md. Short rows go 8 at a time
// (linear_short_rows).
void linear_one_row_f32(const float* x, const float* w, const float* b, float* y, int64_t IN,
                        int64_t OUT) {
  if (linear_short_rows(x, w, b, y, IN, OUT) || linear_rows_avx2(x, w, b, y, IN, OUT)) return;
#pragma omp parallel for schedule(static) if (OUT * IN >= 16384)
  for (int64_t o = 0; o < OUT; ++o) {
    const float* row = w + o * IN;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < IN; ++i) s += row[i] * x[i];
    y[o] = b ? s + b[o] : s;
  }
}

// y[o0, o0 + m) for G consecutive blocks of L outputs (panels S0 apart) at once: the G panels
// read side by side, as G streams, each x[i] broadcast over G * L accumulators. A Zen 4 streams a
// base decoder's weights from 4 KiB pages about 1.3x as fast this way (G = 4) as one panel after
// another (G = 1): one stream per core keeps too few lines in flight (docs/performance.md); from
// 2 MiB pages one panel after another is faster. Every output is one chain over i in order,
// whatever G: G follows the thread count and the pages, and the outputs' bits must not
// (docs/reliability.md).
template <int L, int G>
void one_row_panels(const float* x, const float* w, const float* b, float* y, int64_t IN,
                    const kern::OutInnermost& f, int64_t m) {
  float a[G][L] = {};
  // Blocks of IB inputs counted as they go: no division per block (graft's panels have IB = 1).
  for (int64_t i0 = 0, block = 0; i0 < IN; i0 += f.IB, ++block) {
    const float* p = w + block * f.S1;
    const int64_t n = std::min(f.IB, IN - i0);
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[i0 + i];
      for (int g = 0; g < G; ++g)
#pragma omp simd
        for (int o = 0; o < L; ++o) a[g][o] += xi * p[g * f.S0 + i * f.OB + o];
    }
  }
  for (int64_t o = 0; o < m; ++o) y[o] = a[o / L][o % L] + (b ? b[o] : 0.f);
}

// Block ob (OB outputs) of one row through a weight of the OUT-innermost family; an unpadded last
// block (transposed rows) one output at a time.
template <int OB>
void one_row_one_block(const float* x, const float* w, const float* b, float* y, int64_t IN,
                       int64_t OUT, const kern::OutInnermost& f, int64_t ob) {
  const int64_t o0 = ob * OB, m = std::min<int64_t>(OB, OUT - o0);
  const float* bb = b ? b + o0 : nullptr;
  if (m == OB || f.padded) one_row_panels<OB, 1>(x, w + ob * f.S0, bb, y + o0, IN, f, m);
  else
    for (int64_t o = 0; o < m; ++o)
      one_row_panels<1, 1>(x, w + ob * f.S0 + o, bb ? bb + o : nullptr, y + o0 + o, IN, f, 1);
}

std::atomic<uint64_t> panel_calls{0};  // kern::kept_f32_panel_calls

// One row through a weight of the OUT-innermost family, G blocks of OB outputs at a time
// (one_row_panels), the groups split over the threads. A group short of G
// blocks (the last), or whose last block ends inside the weight's last row of blocks unpadded
// (transposed rows), runs block by block.
template <int OB, int G>
void one_row_out_innermost(const float* x, const float* w, const float* b, float* y, int64_t IN,
                           int64_t OUT, const kern::OutInnermost& f, bool parallel) {
  const int64_t blocks = (OUT + OB - 1) / OB, groups = (blocks + G - 1) / G;
  if (G > 1) panel_calls.fetch_add(1, std::memory_order_relaxed);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t first = gi * G, last = std::min(blocks, first + G), o0 = first * OB;
    if (G > 1 && last - first == G && (f.padded || o0 + G * OB <= OUT)) {
      one_row_panels<OB, G>(x, w + first * f.S0, b ? b + o0 : nullptr, y + o0, IN, f,
                            std::min<int64_t>(G * OB, OUT - o0));
      continue;
    }
    for (int64_t ob = first; ob < last; ++ob) one_row_one_block<OB>(x, w, b, y, IN, OUT, f, ob);
  }
}

// The most blocks of OB outputs one_row_panels reads side by side: 4 x 64 sums fill 16 of
// AVX-512's 32 vector registers; AVX2's 16 hold 64 sums (4 panels of 16: SmolLM's and TinyLlama's
// shapes streamed at 31 and 33 GB/s against 28 and 29-31 one panel at a time, AMD EPYC Zen 3, 2
// threads, 2 MiB pages: docs/hub-models.md).
#if defined(__AVX512F__)
constexpr int64_t max_panels(int64_t) { return 4; }
constexpr bool kAvx512Build = true;
#else
constexpr int64_t max_panels(int64_t OB) {
  return std::max<int64_t>(1, std::min<int64_t>(4, 64 / OB));
}
constexpr bool kAvx512Build = false;
#endif

// One row through a weight of the OUT-innermost family with OB outputs per block: 4 blocks side
// by side while every thread still gets a group of them (up to max_panels), else 2, else 1. On
// AVX-512, weights on 2 MiB pages (`huge_pages`) are read one block after another: one stream per
// thread, which a Zen 4 read 7-9% faster there than 4 side by side (a base decoder's one-row
// steps; on 4 KiB pages 4 streams were 3-8% faster: docs/performance.md).
template <int OB>
void one_row_by_groups(const float* x, const float* w, const float* b, float* y, int64_t IN,
                       int64_t OUT, const kern::OutInnermost& f, bool huge_pages) {
  const bool parallel = OUT * IN >= 16384;
  const int64_t blocks = (OUT + OB - 1) / OB, threads = parallel ? omp_get_max_threads() : 1;
  const int64_t most = (huge_pages && kAvx512Build) ? 1 : max_panels(OB);
  if (most >= 4 && blocks >= 4 * threads)
    one_row_out_innermost<OB, 4>(x, w, b, y, IN, OUT, f, parallel);
  else if (most >= 2 && blocks >= 2 * threads)
    one_row_out_innermost<OB, 2>(x, w, b, y, IN, OUT, f, parallel);
  else one_row_out_innermost<OB, 1>(x, w, b, y, IN, OUT, f, parallel);
}

// One row through a weight in layout d (f32, OUT x IN) at w (on 2 MiB pages: `huge_pages`);
// false when the loop does not know d's layout (the caller runs the inner product instead).
bool linear_one_row_blocked(const float* x, const float* w, const dnnl::memory::desc& d,
                            const float* b, float* y, int64_t IN, int64_t OUT, bool huge_pages) {
  const std::optional<kern::OutInnermost> f = kern::out_innermost(d);
  if (!f) return false;
  switch (f->OB) {
    case 64:
      one_row_by_groups<64>(x, w, b, y, IN, OUT, *f, huge_pages);
      return true;
    case 32:
      one_row_by_groups<32>(x, w, b, y, IN, OUT, *f, huge_pages);
      return true;
    case 16:
      one_row_by_groups<16>(x, w, b, y, IN, OUT, *f, huge_pages);
      return true;
    case 8:
      one_row_by_groups<8>(x, w, b, y, IN, OUT, *f, huge_pages);
      return true;
    default:
      return false;
  }
}

// The row count whose inner product's weights layout keep_weight_fp32 keeps: a decoding step's 32
// rows (oneDNN 2.6 picks the same layout for every row count on a Zen 4; another one is derived).
constexpr int64_t kLayoutRows = 32;

// Whether d is the plain rows' transpose (IN x OUT row-major: oneDNN 2.6's pick under AVX2).
bool is_transposed_rows(const dnnl::memory::desc& d, int64_t OUT, int64_t IN) {
  return d == dnnl::memory::desc({OUT, IN}, d.data_type(), dnnl::memory::format_tag::ba);
}

// The inference inner product on the weights' own rows where oneDNN would read their transpose:
// a kept transpose costs nothing at 32 rows and more, but one row reads it as 64-output panels
// whose 256-byte runs lie a row of the transpose apart, 22.9-24.1 GB/s from memory against
// 29.6-31.7 for 8 plain rows side by side (TinyLlama's shapes, AMD EPYC Zen 3, 2 threads:
// docs/hub-models.md). `any` stays when the plain rows have only a reference kernel.
dnnl::inner_product_forward::primitive_desc plain_rows_pd(
    LinearMds m, const dnnl::memory::desc& plain,
    const dnnl::inner_product_forward::primitive_desc& any) {
  m.w = plain;
  auto pd = linear_fwd_pd(m, dnnl::prop_kind::forward_inference);
  return std::string(pd.impl_info_str()).find("ref") == std::string::npos ? pd : any;
}

// The float32 inference inner product for N rows of IN -> OUT (mds: x, w in the kernel's layout,
// b, y, w as plain rows), cached per problem.
const onednn::Cached<dnnl::inner_product_forward>& inference_inner_product(int64_t N, int64_t IN,
                                                                           int64_t OUT,
                                                                           bool has_bias,
                                                                           bool bf16) {
  const auto kind = dnnl::prop_kind::forward_inference;
  const auto dt = bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  using ipf = dnnl::inner_product_forward;
  return onednn::cached<ipf>({(int64_t)kind, N, IN, OUT, has_bias, bf16}, [&] {
    LinearMds m(N, IN, OUT, has_bias);
    const auto plain = m.w;
    m.x = dnnl::memory::desc(m.x.dims(), dt, dnnl::memory::format_tag::ab);
    m.w = dnnl::memory::desc(m.w.dims(), dt, dnnl::memory::format_tag::any);
    auto pd = linear_fwd_pd(m, kind);
    if (!bf16 && is_transposed_rows(pd.weights_desc(), OUT, IN)) pd = plain_rows_pd(m, plain, pd);
    onednn::Cached<ipf> made{ipf(pd), {m.x, pd.weights_desc(), m.b, m.y, plain}};
    made.weights_tag = onednn::layout_tag(pd.weights_desc());
    return made;
  });
}

// Weights (float32) a kernel reads: their layout, where they start, and what keeps them alive.
struct WeightsAt {
  dnnl::memory::desc md;
  const float* data = nullptr;
  std::shared_ptr<Storage> hold;
};

// Where w's rows lie in its storage's kept form k (any dtype): their layout and the element they
// start at, the whole form or a slice of its rows that starts at a block of rows (attention's
// in_proj parts, 512 rows of a 64-row block); nullopt when the slice cuts a block. For oneDNN
// (a memory made on the rows) also nullopt when the slice ends inside a block short of the form's
// end: the padding of its last block is the next slice's rows, and oneDNN may zero-fill a memory's
// padding where it is made on a pointer (memory_t::zero_pad; this build's CPU engine does not).
struct RowsInForm {
  dnnl::memory::desc md;
  int64_t first = 0;
};
std::optional<RowsInForm> rows_in_form(const Tensor& w, const kern::KeptForm& k, bool onednn) {
  const int64_t first = w.offset() / k.IN, n = w.shape()[0];
  if (first == 0 && n == k.OUT) return RowsInForm{k.layout, 0};
  dnnl_memory_desc_t d = k.layout.data;
  const auto& bl = d.format_desc.blocking;
  int64_t blk = 1;
  for (int j = 0; j < bl.inner_nblks; ++j)
    if (bl.inner_idxs[j] == 0) blk *= bl.inner_blks[j];
  const int64_t padded = (n + blk - 1) / blk * blk;
  if (d.format_kind != dnnl_blocked || first % blk != 0 || first + padded > d.padded_dims[0])
    return std::nullopt;
  if (onednn && (first + n) % blk != 0 && first + n != k.OUT) return std::nullopt;
  d.dims[0] = n;
  d.padded_dims[0] = padded;
  return RowsInForm{dnnl::memory::desc(d), first / blk * bl.strides[0]};
}

// w's rows inside its storage's float32 kept form k (keep_weight_fp32) without a copy; nullopt
// when the slice cuts a block (or, for oneDNN, ends inside one: rows_in_form).
std::optional<WeightsAt> kept_rows(const Tensor& w, const kern::KeptForm& k, bool onednn = true) {
  const auto rows = rows_in_form(w, k, onednn);
  if (!rows) return std::nullopt;
  return WeightsAt{rows->md, static_cast<const float*>(k.bytes()) + rows->first, k.data};
}

// Reorders the values at `data` in layout `from` into `out` in layout `to`.
void reorder_into(const dnnl::memory::desc& from, const void* data, const dnnl::memory::desc& to,
                  void* out) {
  auto src = onednn::mem(from, const_cast<void*>(data));
  auto dst = onednn::mem(to, out);
  dnnl::reorder(src, dst).execute(onednn::stream(), src, dst);
  onednn::stream().wait();
}

// Reorders weights `from` into a new storage in layout `to`.
std::shared_ptr<Storage> reorder_weights(const WeightsAt& from, const dnnl::memory::desc& to) {
  auto s = std::make_shared<Storage>(to.get_size());
  reorder_into(from.md, from.data, to, s->data);
  return s;
}

// w (a slice of rows of its storage's kept form k) in layout `best`: straight from the kept rows
// when they can be viewed, else through the whole form as plain rows (a passing buffer).
std::shared_ptr<Storage> kept_in_layout(const Tensor& w, const kern::KeptForm& k,
                                        const dnnl::memory::desc& best) {
  if (const auto rows = kept_rows(w, k)) return reorder_weights(*rows, best);
  const auto plain = onednn::md_contiguous({k.OUT, k.IN});
  const std::shared_ptr<Storage> all =
      reorder_weights({k.layout, static_cast<const float*>(k.bytes()), k.data}, plain);
  const auto* first = static_cast<const float*>(all->data) + w.offset();
  return reorder_weights({onednn::md_contiguous(w.shape()), first, all}, best);
}

// w in layout `best` (plain: its plain rows' descriptor) for float32 inference: w's own bytes,
// its kept form or a view of it when that is the layout, else a copy made once per version of w
// (kern::derived_copy, from w's values or from its kept form) and kept while w lives.
WeightsAt f32_weights(const Tensor& w, uint64_t tag, const dnnl::memory::desc& plain,
                      const dnnl::memory::desc& best) {
  const kern::KeptForm* k = kern::kept_form(w, DType::f32);
  if (!k && best == plain) return {best, w.data<float>(), nullptr};
  if (k)
    if (auto rows = kept_rows(w, *k); rows && rows->md == best) return *rows;
  const std::shared_ptr<Storage> s = kern::derived_copy(w, tag, [&] {
    return k ? kept_in_layout(w, *k, best)
             : reorder_weights({plain, w.data<float>(), nullptr}, best);
  });
  return {best, static_cast<const float*>(s->data), s};
}

// w in layout `best` for the bf16 inner product: converted and reordered once per version of w
// (kern::derived_copy), kept while w lives; a weight beyond bf16's range is refused.
std::shared_ptr<Storage> bf16_weights(const Tensor& w, uint64_t tag,
                                      const dnnl::memory::desc& plain,
                                      const dnnl::memory::desc& best) {
  return kern::derived_copy(w, tag, [&] {
    kern::check_weight_finite(w, "linear (bf16)", true);
    kern::count_bf16_weight_copy();
    return reorder_weights({plain, w.data<float>(), nullptr}, best);
  });
}

// One row through oneDNN's inner product reading weights `wa` in their own layout (one the loop
// over blocks does not know, as AVX2's transposed rows); false when oneDNN has no kernel for it.
bool one_row_in_layout(const Tensor& x, const WeightsAt& wa, const Tensor& b, const Tensor& y) {
  constexpr int64_t kInLayoutKey = -32;  // apart from the inference primitives keyed by N >= 1
  const int64_t IN = wa.md.dims()[1], OUT = wa.md.dims()[0];
  using ipf = dnnl::inner_product_forward;
  try {
    const auto& c = onednn::cached<ipf>(
        {kInLayoutKey, IN, OUT, b.defined(), (int64_t)onednn::layout_tag(wa.md)}, [&] {
          LinearMds m(1, IN, OUT, b.defined());
          m.w = wa.md;
          const auto pd = linear_fwd_pd(m, dnnl::prop_kind::forward_inference);
          if (std::string(pd.impl_info_str()).find("ref") != std::string::npos)
            throw dnnl::error(dnnl_unimplemented, "only a reference kernel");  // far too slow
          return onednn::Cached<ipf>{ipf(pd), {m.x, wa.md, m.b, m.y}};
        });
    execute_inner_product(c, x.raw(), const_cast<float*>(wa.data), b, y);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// One float32 row without a copy of the weights: the plain rows' loop, graft's loop over a kept
// form's blocks, or the inner product on a kept form in a layout that loop does not know; false
// when none applies (a slice that cuts a block: the inner product runs on its copy).
bool linear_one_row(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t IN = w.shape()[1], OUT = w.shape()[0];
  const float* pb = b.defined() ? b.data<float>() : nullptr;
  const kern::KeptForm* k = kern::kept_form(w, DType::f32);
  if (!k) {
    linear_one_row_f32(x.data<float>(), w.data<float>(), pb, y.data<float>(), IN, OUT);
    return true;
  }
  const std::optional<WeightsAt> rows = kept_rows(w, *k, /*onednn=*/false);
  if (!rows) return false;
  if (linear_one_row_blocked(x.data<float>(), rows->data, rows->md, pb, y.data<float>(), IN, OUT,
                             k->huge_pages))
    return true;
  const std::optional<WeightsAt> for_onednn = kept_rows(w, *k);
  return for_onednn && one_row_in_layout(x, *for_onednn, b, y);
}

// N rows through w's kept panels (keep_weight_fp32 in an AVX2 build: ops/internal/panels.h) at
// any row count; false where w is not kept as panels or is a slice of rows that starts inside a
// panel (the inner product then runs on its copy). oneDNN's gemm:jit re-packs plain weights at
// every call: on the panels a decoding step of 32 rows ran Marian's vocabulary projection
// (32 x 512 x 58112) at 55-75 GMAC/s against its 43-54, its FFN (32 x 512 x 2048) at 75-83
// against 67-68 (AMD EPYC Zen 3, 2 threads: docs/hub-models.md).
bool linear_kept_panels(const Tensor& x, int64_t N, const Tensor& w, const Tensor& b,
                        const Tensor& y) {
  const kern::KeptForm* k = kern::kept_form(w, DType::f32);
  if (!kern::panels_built() || !k || !kern::is_panel_layout(k->layout)) return false;
  const std::optional<WeightsAt> rows = kept_rows(w, *k, /*onednn=*/false);
  if (!rows) return false;
  kern::linear_panels(x.data<float>(), N, rows->data, b.defined() ? b.data<float>() : nullptr,
                      y.data<float>(), w.shape()[1], w.shape()[0]);
  return true;
}

// Up to this many rows (a beam of 4 at batch 1) float32 plain weights go through
// linear_rows_avx2 on AVX2.
constexpr int64_t kFewRows = 4;
// Up to this many rows (a decoding step of batch 32 and beam 4) wide float32 plain weights go
// through linear_pieces_avx2 on AVX2; more rows (a long prompt) stay with one oneDNN call.
constexpr int64_t kPiecesRows = 128;

// Inference (no tape) through oneDNN inner_product, its primitive cached per problem, the
// weights in the primitive's preferred layout (f32_weights(): decoding reads every weight once
// per token; its 32-row steps read plain weights through gemm:jit at about half the rate brgemm
// reads its blocked ones, docs/performance.md); one float32 row through linear_one_row instead.
// With bf16, x and w are read as bf16 (x converted into the per-thread buffer), bias and y stay
// float32. x and y are dense with N rows (any rank: no row views made, which cost a decoding step
// of a small model 6%).
void linear_forward_inference(const Tensor& x, int64_t N, const Tensor& w, const Tensor& b,
                              const Tensor& y, bool bf16) {
  const int64_t IN = w.shape()[1], OUT = w.shape()[0];
  if (N == 1 && !bf16 && linear_one_row(x, w, b, y)) return;
  if (!bf16 && linear_kept_panels(x, N, w, b, y)) return;
  const float* pb = b.defined() ? b.data<float>() : nullptr;
  if (N <= kFewRows && !bf16 && !kern::kept_form(w, DType::f32) &&
      linear_rows_avx2(x.data<float>(), w.data<float>(), pb, y.data<float>(), IN, OUT, N))
    return;
  if (N <= kPiecesRows && !bf16 && !kern::kept_form(w, DType::f32) &&
      linear_pieces_avx2(x.data<float>(), w.data<float>(), pb, y.data<float>(), IN, OUT, N))
    return;
  const auto& c = inference_inner_product(N, IN, OUT, b.defined(), bf16);
  if (bf16) {
    const bool reorder = c.mds[1] != c.mds[4];
    const std::shared_ptr<Storage> wr =
        reorder ? bf16_weights(w, c.weights_tag, c.mds[4], c.mds[1]) : nullptr;
    const kern::Bf16Operand x16 = kern::to_bf16(x, /*contiguous=*/true, /*reuse=*/false, 0);
    return execute_inner_product(c, x16.data(), reorder ? wr->data : w.raw(), b, y);
  }
  const WeightsAt wa = f32_weights(w, c.weights_tag, c.mds[4], c.mds[1]);
  execute_inner_product(c, x.raw(), const_cast<float*>(wa.data), b, y);
}

// dx (N, IN) = dy (N, OUT) @ w (OUT, IN), through oneDNN inner_product backward-data.
void linear_backward_data_f32(const LinearMds& m, const Tensor& dy, const Tensor& w,
                              const Tensor& dx2) {
  using ipd = dnnl::inner_product_backward_data;
  const dnnl::memory::dims xd = m.x.dims(), wd = m.w.dims();
  const auto& c = onednn::cached<ipd>({xd[0], xd[1], wd[0], !m.b.is_zero()}, [&] {
    auto hint = linear_fwd_pd(m, dnnl::prop_kind::forward_training);
    return onednn::Cached<ipd>{
        ipd(ipd::primitive_desc(ipd::desc(m.x, m.w, m.y), onednn::user_scratchpad(),
                                onednn::engine(), hint)),
        {}};
  });
  onednn::run(c, {{DNNL_ARG_DIFF_DST, m.y, dy.raw()},
                  {DNNL_ARG_WEIGHTS, m.w, w.raw()},
                  {DNNL_ARG_DIFF_SRC, m.x, dx2.raw()}});
}

// dw (OUT, IN) = dy^T x and db (OUT) = column sums of dy, where defined.
void linear_backward_weights_f32(const LinearMds& m, const Tensor& x2, const Tensor& dy,
                                 const Tensor& dw, Tensor& db) {
  if (dw.defined() && (kern::aliasing(dy) || kern::aliasing(x2))) {
    // As a matmul on copies whose rows are not 1 KiB multiples apart (see kern::aliasing).
    kern::gemm(swap_last2(kern::unaliased(dy)), kern::unaliased(x2), dw);
    if (db.defined()) db = sum(dy, {0});
    return;
  }
  // oneDNN computes dW and db together; whichever was not asked for goes to scratch.
  using ipw = dnnl::inner_product_backward_weights;
  const bool with_db = db.defined();
  const dnnl::memory::dims xd = m.x.dims(), wd = m.w.dims();
  const auto& c = onednn::cached<ipw>({xd[0], xd[1], wd[0], !m.b.is_zero(), with_db}, [&] {
    auto d = with_db ? ipw::desc(m.x, m.w, m.b, m.y) : ipw::desc(m.x, m.w, m.y);
    auto hint = linear_fwd_pd(m, dnnl::prop_kind::forward_training);
    return onednn::Cached<ipw>{
        ipw(ipw::primitive_desc(d, onednn::user_scratchpad(), onednn::engine(), hint)), {}};
  });
  const Tensor dw_buf = dw.defined() ? dw : Tensor::empty(m.w.dims(), DType::f32);
  onednn::run(c, {{DNNL_ARG_SRC, m.x, x2.raw()},
                  {DNNL_ARG_DIFF_DST, m.y, dy.raw()},
                  {DNNL_ARG_DIFF_WEIGHTS, m.w, dw_buf.raw()},
                  {DNNL_ARG_DIFF_BIAS, m.b, with_db ? db.raw() : nullptr}});
}

// Under PrecisionGuard(bf16), linear's matmuls go through kern::bmm (bf16 operands), the bias
// added in float32 by the forward matmul's kernel. Inference keeps each weight's bf16 copy until
// the weight changes (decoding reads it every step); training converts it for each use, once in
// the forward and once in the backward: kept from one to the other, a base model's copies (92 MiB)
// would all be alive at the start of backward, the step's memory peak, for one conversion pass
// (~2% of a bf16 base step) saved.
bool linear_in_bf16(const Tensor& x) {
  return x.dtype() == DType::f32 && matmul_precision() == Precision::bf16;
}

// The training forward, float32 or bf16 (x2 or w read as bf16 under PrecisionGuard(bf16)):
// y2 = x2 w^T + b through oneDNN matmul, the bias added by its kernel. For float32 this replaced
// inner_product forward on plain weights, which ran 1024 x 2048 -> 512 at 138-156 GFLOP/s on a
// Zen 4 where matmul runs it at 216 (docs/performance.md).
void linear_forward_matmul(const kern::Operand& x2, const Tensor& w, const Tensor& b,
                           const Tensor& y2, kern::BCopy w_copy) {
  if (b.defined()) kern::gemm_bias(x2, swap_last2(w), b, y2, w_copy);
  else kern::gemm(x2, swap_last2(w), y2, /*accumulate=*/false, w_copy);
}

void linear_backward_bf16(const Tensor& dy, const kern::Operand& x2, const Tensor& w,
                          const Tensor& dx2, const Tensor& dw, Tensor& db) {
  kern::Bf16ReuseScope reuse;  // dy converted once for both matmuls
  if (dx2.defined()) kern::gemm(dy, w, dx2, /*accumulate=*/false, kern::BCopy::per_call);
  if (dw.defined()) kern::gemm(swap_last2(dy), x2, dw);
  if (db.defined()) db = sum(dy, {0});
}

// ---- 16-bit linear (x, w and b bf16, or all f16) ----
// Forward and backward are kern::gemm / gemm_bias on the tensors as they are: the weight read in
// place as its transpose view, float32 sums, outputs and gradients rounded once into the 16-bit
// dtype. No copy of the weight is made, in training or inference: a reordered (blocked) bf16
// copy, as the float32 inference path keeps, would double a bf16 model's weight memory (see
// docs/mixed-precision.md#matmuls for its speed).

// Up to this many rows, a 16-bit linear runs linear_rows_half: oneDNN 2.6's bf16 matmul on the
// plain weight runs 1 x 4096 -> 4096 at 19 GB/s of weights (it repacks the weight each call),
// half the rate of its inner product on a reordered copy, which the loop matches without a copy
// (docs/mixed-precision.md#matmuls).
constexpr int64_t kHalfRowLoop = 4;

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
// 8 16-bit values from p widened to float32: bf16 shifted into a float's upper half, f16 through
// F16C's conversion.
inline __m256 widen8(const bfloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 widen8(const float16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// sum of w[i] x[i] over [0, n) on AVX2: four 8-lane accumulators, folded in a fixed order, the
// last (n % 8) terms one by one. A stand-alone loop over SmolLM's and TinyLlama's matrices read
// them with the generic loop below at 22.1-29.1 GB/s, with this one at 25.5-30.6 (AMD EPYC Zen 3,
// 2 threads: docs/hub-models.md).
template <class H>
float dot_half(const H* w, const float* x, int64_t n) {
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      a[k] = _mm256_fmadd_ps(widen8(w + i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), a[k]);
  for (; i + 8 <= n; i += 8) a[0] = _mm256_fmadd_ps(widen8(w + i), _mm256_loadu_ps(x + i), a[0]);
  float s = lanes_sum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  for (; i < n; ++i) s += static_cast<float>(w[i]) * x[i];
  return s;
}

// s[0, R) = R rows of w (IN apart) dotted with x on AVX2, x's values loaded once for the R rows,
// two 8-lane accumulators a row: TinyLlama's matrices (IN >= 2048) from memory at 28.9-37.2
// GB/s against 27.4-30.6 for dot_half row after row; SmolLM's shorter rows (IN 576, 1536) ran
// slower this way (Zen 3, 2 threads: docs/hub-models.md). A row's sum depends on IN only, not on
// the threads' split.
template <class H, int R>
void dot_half_rows(const H* w, int64_t IN, const float* x, float* s) {
  __m256 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= IN; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    for (int r = 0; r < R; ++r) {
      a[r][0] = _mm256_fmadd_ps(widen8(w + r * IN + i), x0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(widen8(w + r * IN + i + 8), x1, a[r][1]);
    }
  }
  for (; i + 8 <= IN; i += 8)
    for (int r = 0; r < R; ++r)
      a[r][0] = _mm256_fmadd_ps(widen8(w + r * IN + i), _mm256_loadu_ps(x + i), a[r][0]);
  for (int r = 0; r < R; ++r) {
    s[r] = lanes_sum8(_mm256_add_ps(a[r][0], a[r][1]));
    for (int64_t j = i; j < IN; ++j) s[r] += static_cast<float>(w[r * IN + j]) * x[j];
  }
}
constexpr int64_t kHalfRowsMinIn = 2048;  // dot_half_rows from this row length on
#else
// sum of w[i] x[i] over [0, n) in float32 with 64 partial sums (four AVX-512 accumulators): one
// accumulator waits on its FMA's latency.
template <class H>
float dot_half(const H* w, const float* x, int64_t n) {
  constexpr int64_t kLanes = 64;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += static_cast<float>(w[i + l]) * x[i + l];
  for (int64_t l = 0; i < n; ++i, ++l) acc[l] += static_cast<float>(w[i]) * x[i];
  // Folded in halves (vector adds), not summed one lane after another.
  for (int64_t half = kLanes / 2; half >= 1; half /= 2)
    for (int64_t l = 0; l < half; ++l) acc[l] += acc[l + half];
  return acc[0];
}

// Not called (kHalfRowsMinIn: no row length reaches it).
template <class H, int R>
void dot_half_rows(const H*, int64_t, const float*, float*) {}
constexpr int64_t kHalfRowsMinIn = std::numeric_limits<int64_t>::max();
#endif

#if defined(__AVX512BF16__)
// The same for bf16 w and x on AVX512_BF16's dot-product instruction (pairs of bf16 products
// added to float32 lanes): 2.5x the widening loop's rate on a Zen 4 (1024 x 4096 weights: 128
// against 321 us, one core), which spends its time widening bf16 to float32.
float dot_bf16(const bfloat16* w, const bfloat16* x, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm512_dpbf16_ps(acc[k], (__m512bh)_mm512_loadu_si512(w + i + 32 * k),
                                (__m512bh)_mm512_loadu_si512(x + i + 32 * k));
  alignas(64) float lanes[16];  // (GCC 12's _mm512_reduce_add_ps warns in its own header)
  _mm512_store_ps(lanes,
                  _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  for (int half = 8; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  float s = lanes[0];
  for (; i < n; ++i) s += static_cast<float>(w[i]) * static_cast<float>(x[i]);
  return s;
}
constexpr bool kDotBf16 = true;
#else
// Not called without AVX512_BF16 (kDotBf16 false).
[[maybe_unused]] float dot_bf16(const bfloat16*, const bfloat16*, int64_t) { return 0; }
constexpr bool kDotBf16 = false;
#endif

// y2 (M, OUT) = x2 (M, IN) w^T + b for M <= kHalfRowLoop, all contiguous, of 16-bit type H: each
// row of w read once (the threads split the outputs) and dotted with every row of x in float32
// (dot_bf16, or dot_half on x widened once), the sum rounded once.
template <class H>
void linear_rows_half(const Tensor& x2, const Tensor& w, const Tensor& b, const Tensor& y2) {
  const int64_t M = x2.shape()[0], IN = w.shape()[1], OUT = w.shape()[0];
  constexpr bool native = kDotBf16 && std::is_same_v<H, bfloat16>;
  std::vector<float> xf(native ? 0 : (size_t)(M * IN));
  if (!native) to_float(x2.data<const H>(), xf.data(), M * IN);
  const H* px = x2.data<const H>();
  const H* pw = w.data<const H>();
  const H* pb = b.defined() ? b.data<const H>() : nullptr;
  H* py = y2.data<H>();
  constexpr int kR = 4;  // rows of w a group (dot_half_rows), or 1 where it does not run
  const int64_t R = !native && IN >= kHalfRowsMinIn ? kR : 1, groups = (OUT + R - 1) / R;
#pragma omp parallel for schedule(static) if (OUT * IN >= 16384)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o0 = g * R, n = std::min(R, OUT - o0);
    for (int64_t m = 0; m < M; ++m) {
      float s[kR];
      if constexpr (native) s[0] = dot_bf16(pw + o0 * IN, px + m * IN, IN);
      else if (n == kR) dot_half_rows<H, kR>(pw + o0 * IN, IN, xf.data() + m * IN, s);
      else
        for (int64_t r = 0; r < n; ++r) s[r] = dot_half(pw + (o0 + r) * IN, xf.data() + m * IN, IN);
      for (int64_t r = 0; r < n; ++r)
        py[m * OUT + o0 + r] = H(pb ? s[r] + static_cast<float>(pb[o0 + r]) : s[r]);
    }
  }
}

// ---- bf16 weights kept in the inner product's blocked layout (keep_weight_bf16) ----
// oneDNN 2.6's bf16 matmul repacks a plain bf16 weight on every call (a batch-32 decoding step
// of the base Transformer 1.08x 0.6.0's, which reordered once into a cached blocked copy); a bf16
// inference model keeps each linear weight once in the inner product's blocked layout instead,
// its plain bytes freed (the same 2 bytes a weight).

// The bf16 inference inner product for N rows, x, b and y bf16, w in layout `w_md` (format any:
// the kernel's choice; mds: x, w, b, y, w as plain rows), cached per problem; fails (dnnl::error)
// where oneDNN has only its reference kernel, far too slow for decoding.
const onednn::Cached<dnnl::inner_product_forward>& half_inner_product(
    int64_t N, const dnnl::memory::desc& w_md, bool has_bias) {
  constexpr int64_t kHalfKey = -16;  // apart from the float32 inference primitives' keys
  const int64_t OUT = w_md.dims()[0], IN = w_md.dims()[1];
  const int64_t layout =
      w_md.data.format_kind == dnnl_format_kind_any ? 0 : (int64_t)onednn::layout_tag(w_md);
  using ipf = dnnl::inner_product_forward;
  return onednn::cached<ipf>({kHalfKey, N, IN, OUT, has_bias, layout}, [&] {
    using tag = dnnl::memory::format_tag;
    const auto bf = dnnl::memory::data_type::bf16;
    LinearMds m(N, IN, OUT, has_bias);
    m.x = dnnl::memory::desc({N, IN}, bf, tag::ab);
    m.w = w_md;
    m.y = dnnl::memory::desc({N, OUT}, bf, tag::ab);
    if (has_bias) m.b = dnnl::memory::desc({OUT}, bf, tag::a);
    const auto pd = linear_fwd_pd(m, dnnl::prop_kind::forward_inference);
    if (std::string(pd.impl_info_str()).find("ref") != std::string::npos)
      throw dnnl::error(dnnl_unimplemented, "only a reference kernel");
    const auto plain = dnnl::memory::desc({OUT, IN}, bf, tag::ab);
    onednn::Cached<ipf> made{ipf(pd), {m.x, pd.weights_desc(), m.b, m.y, plain}};
    made.weights_tag = onednn::layout_tag(pd.weights_desc());
    return made;
  });
}

#if defined(__AVX512BF16__)
// Whether md is oneDNN's AB8b64a2b bf16 layout (blocks of 64 outputs x 16 inputs, each block
// 8 input pairs x 64 outputs x the pair), the layout its AVX512_BF16 inner product reads and the
// loop below knows.
bool pairs_of_64(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  const auto& bl = d.format_desc.blocking;
  return d.format_kind == dnnl_blocked && d.data_type == dnnl_bf16 && d.ndims == 2 &&
         bl.inner_nblks == 3 && bl.inner_blks[0] == 8 && bl.inner_idxs[0] == 1 &&
         bl.inner_blks[1] == 64 && bl.inner_idxs[1] == 0 && bl.inner_blks[2] == 2 &&
         bl.inner_idxs[2] == 1 && bl.strides[1] == 1024 && bl.strides[0] == 64 * d.padded_dims[1];
}

// Outputs [o0, o0 + 64) of M rows from one block column of w (w: its first block, INp inputs
// padded to 16; x: M rows of INp bf16, zero past IN): each input pair of x broadcast and dotted
// with 16 outputs' pairs at once (dpbf16), float32 sums rounded once with the bias added.
template <int M>
void block_of_64(const bfloat16* x, const bfloat16* w, const bfloat16* b, bfloat16* y, int64_t INp,
                 int64_t o0, int64_t OUT) {
  __m512 acc[M][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t i = 0; i < INp; i += 16, w += 1024)
    for (int p = 0; p < 8; ++p) {
      __m512i wv[4];
      for (int k = 0; k < 4; ++k) wv[k] = _mm512_loadu_si512(w + p * 128 + k * 32);
      for (int m = 0; m < M; ++m) {
        int32_t pair;
        std::memcpy(&pair, x + m * INp + i + 2 * p, sizeof pair);
        const __m512i xb = _mm512_set1_epi32(pair);
        for (int k = 0; k < 4; ++k)
          acc[m][k] = _mm512_dpbf16_ps(acc[m][k], (__m512bh)wv[k], (__m512bh)xb);
      }
    }
  alignas(64) float lanes[16];
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < 4; ++k) {
      _mm512_store_ps(lanes, acc[m][k]);
      for (int64_t l = 0, o = o0 + 16 * k; l < 16 && o < OUT; ++l, ++o)
        y[m * OUT + o] = bfloat16(b ? lanes[l] + static_cast<float>(b[o]) : lanes[l]);
    }
}

// y (M, OUT) = x (M, IN) w^T + b for M <= kHalfRowLoop rows, w kept in layout AB8b64a2b at wp:
// each block column of 64 outputs read once (the threads split them). The inner product reads
// the same bytes at 1 row no faster than a plain-row loop (docs/mixed-precision.md#matmuls).
template <int M>
void rows_pairs_of_64(const Tensor& x, const bfloat16* wp, int64_t INp, const Tensor& b,
                      const Tensor& y) {
  const int64_t IN = x.shape()[1], OUT = y.shape()[1];
  const bfloat16* xs = x.data<const bfloat16>();  // read in place where IN fills the pairs
  std::vector<bfloat16> xp;
  if (INp != IN) {
    xp.assign((size_t)(M * INp), bfloat16(0.0f));  // zero past IN: pairs read whole
    for (int m = 0; m < M; ++m)
      std::memcpy(xp.data() + m * INp, xs + m * IN, IN * sizeof(bfloat16));
    xs = xp.data();
  }
  const bfloat16* pb = b.defined() ? b.data<const bfloat16>() : nullptr;
  bfloat16* py = y.data<bfloat16>();
  const int64_t blocks = (OUT + 63) / 64;
#pragma omp parallel for schedule(static) if (OUT * IN >= 16384)
  for (int64_t ob = 0; ob < blocks; ++ob)
    block_of_64<M>(xs, wp + ob * 64 * INp, pb, py, INp, ob * 64, OUT);
}

std::atomic<uint64_t> kept_loop_calls{0};  // kern::kept_bf16_loop_calls

// The loop over the kept blocks for up to kHalfRowLoop rows; false where the layout is another.
bool kept_rows_loop(const Tensor& x2, const bfloat16* wp, const dnnl::memory::desc& md,
                    const Tensor& b, const Tensor& y2) {
  if (!pairs_of_64(md) || x2.shape()[0] > kHalfRowLoop) return false;
  kept_loop_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t INp = md.data.padded_dims[1];
  switch (x2.shape()[0]) {
    case 1:
      return rows_pairs_of_64<1>(x2, wp, INp, b, y2), true;
    case 2:
      return rows_pairs_of_64<2>(x2, wp, INp, b, y2), true;
    case 3:
      return rows_pairs_of_64<3>(x2, wp, INp, b, y2), true;
    case 4:
      return rows_pairs_of_64<4>(x2, wp, INp, b, y2), true;
    default:
      return false;
  }
}
#else
bool kept_rows_loop(const Tensor&, const bfloat16*, const dnnl::memory::desc&, const Tensor&,
                    const Tensor&) {
  return false;  // no AVX512_BF16 at compile time: the inner product reads the kept form
}
#endif

// w's rows as plain bf16 rows reordered out of its kept form k, for a slice of rows that cuts one
// of the form's blocks (no kernel reads it in place: a model whose d_model is not a multiple of
// 64): made once per slice (kern::derived_copy) and kept while w lives, so such a model holds
// those slices twice.
Tensor plain_rows_of_kept(const Tensor& w, const kern::KeptForm& k) {
  using tag = dnnl::memory::format_tag;
  const auto bf = dnnl::memory::data_type::bf16;
  const int64_t first = w.offset() / k.IN, n = w.shape()[0];
  const dnnl::memory::desc rows({n, k.IN}, bf, tag::ab);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = kern::derived_copy(w, onednn::layout_tag(rows), [&] {
    const Tensor all = Tensor::empty({k.OUT, k.IN}, DType::bf16);
    reorder_into(k.layout, k.bytes(), dnnl::memory::desc({k.OUT, k.IN}, bf, tag::ab), all.raw());
    return contiguous_copy(slice(all, 0, first, first + n)).impl()->storage;
  });
  impl->shape = {n, k.IN};
  impl->strides = {k.IN, 1};
  impl->dtype = DType::bf16;
  return Tensor(impl);
}

void linear_forward_half(const Tensor& x2, const Tensor& w, const Tensor& b, const Tensor& y2,
                         bool inference);

// y2 (N, IN) = x2 w^T + b on w's kept bf16 form k: graft's loop over its blocks up to
// kHalfRowLoop rows, oneDNN's inner product on it above (or where the loop does not know the
// layout), plain rows copied out of it once for a slice that cuts a block, one oneDNN must not
// be given (rows_in_form) or one oneDNN builds no fast kernel for (row counts, bias or slices
// other than those tried at keep time).
void linear_kept_bf16(const Tensor& x2, const Tensor& w, const kern::KeptForm& k, const Tensor& b,
                      const Tensor& y2) {
  const auto* form = static_cast<const bfloat16*>(k.bytes());
  if (x2.shape()[0] <= kHalfRowLoop)
    if (const auto rows = rows_in_form(w, k, /*onednn=*/false))
      if (kept_rows_loop(x2, form + rows->first, rows->md, b, y2)) return;
  if (const std::optional<RowsInForm> rows = rows_in_form(w, k, /*onednn=*/true)) {
    try {
      const auto& c = half_inner_product(x2.shape()[0], rows->md, b.defined());
      return execute_inner_product(c, x2.raw(), const_cast<bfloat16*>(form + rows->first), b, y2);
    } catch (const dnnl::error&) {
      // no fast kernel for this case: the plain rows below
    }
  }
  linear_forward_half(x2, plain_rows_of_kept(w, k), b, y2, false);
}

// y2 (N, OUT) = x2 (N, IN) w^T + b; in inference (no tape), on w's kept bf16 form where it has
// one (keep_weight_bf16).
void linear_forward_half(const Tensor& x2, const Tensor& w, const Tensor& b, const Tensor& y2,
                         bool inference) {
  if (y2.numel() == 0) return;
  if (x2.shape()[1] == 0) {  // an empty sum: y is the bias (or 0) on every row
    if (b.defined()) copy_into(y2, view_as(b, y2.shape(), {0, 1}));
    else fill_(y2, 0);
    return;
  }
  if (inference && x2.dtype() == DType::bf16)
    if (const auto k = kern::kept_form(w, DType::bf16)) return linear_kept_bf16(x2, w, *k, b, y2);
  if (x2.shape()[0] <= kHalfRowLoop && x2.dtype() == DType::bf16)
    return linear_rows_half<bfloat16>(x2, w, b, y2);
  if (x2.shape()[0] <= kHalfRowLoop) return linear_rows_half<float16>(x2, w, b, y2);
  if (b.defined()) kern::gemm_bias(x2, swap_last2(w), b, y2);
  else kern::gemm(x2, swap_last2(w), y2);
}

// dx2 = dy w, dw = dy^T x2, db = column sums of dy (float32 inside), where defined; gemm fills
// the empty sums with 0.
void linear_backward_half(const Tensor& dy, const Tensor& x2, const Tensor& w, const Tensor& dx2,
                          const Tensor& dw, Tensor& db) {
  if (dx2.defined()) kern::gemm(dy, w, dx2);
  if (dw.defined()) kern::gemm(swap_last2(dy), x2, dw);
  if (db.defined()) db = sum_axes(dy, {0});
}

// linear's argument checks; the message names every shape.
void check_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  kern::check_float("linear", x);
  kern::check_float("linear", w);
  const bool has_bias = b.defined();
  const auto what = [&] {  // the message prefix, built only when a check fails
    return "linear: x " + shape_str(x.shape()) + ", w " + shape_str(w.shape()) +
           (has_bias ? ", b " + shape_str(b.shape()) : std::string());
  };
  if (x.dtype() != w.dtype() || (has_bias && b.dtype() != x.dtype()))
    fail(what() + ": dtype mismatch, " + describe(x) + " vs " + describe(w) +
         (has_bias ? " vs " + describe(b) : std::string()));
  if (x.dim() < 1) fail(what() + ": x needs at least 1 dim");
  if (w.dim() != 2) fail(what() + ": w must be 2-D (OUT, IN)");
  if (w.shape()[1] != x.shape().back())
    fail(what() + ": in features " + std::to_string(x.shape().back()) + " != w's " +
         std::to_string(w.shape()[1]));
  if (has_bias && (b.dim() != 1 || b.shape()[0] != w.shape()[0]))
    fail(what() + ": b must be (" + std::to_string(w.shape()[0]) + ")");
}

}  // namespace

// linear: x (..., IN), w (OUT, IN), b (OUT) -> y (..., OUT) = x W^T + b
GRAFT_DECLARE_OP("linear", "matmul");

namespace {
// linear's gradients, allocated where needed: dx like x, dw like w, db (OUT) with a bias.
struct LinearGrads {
  Tensor dx, dw, db;
  LinearGrads(const Shape& x_shape, const Tensor& w, bool has_bias, const std::vector<bool>& needs)
      : dx(needs[0] ? Tensor::empty(x_shape, w.dtype()) : Tensor()),
        dw(needs[1] ? Tensor::empty(w.shape(), w.dtype()) : Tensor()),
        db(has_bias && needs[2] ? Tensor::empty({w.shape()[0]}, w.dtype()) : Tensor()) {}
  Tensor dx_rows() const { return dx.defined() ? kern::as_rows(dx) : Tensor(); }
};

// The backward of a bf16 linear that kept x16 = bf16(x) (rows, IN) from its forward instead of x.
Tensors linear_backward_kept(const Tensor& dout, const kern::Bf16Operand& x16, const Shape& x_shape,
                             const Tensor& w_in, bool has_bias, const std::vector<bool>& needs) {
  const Tensor w = kern::contig(w_in), dy = kern::as_rows(dout);
  LinearGrads g(x_shape, w, has_bias, needs);
  linear_backward_bf16(dy, x16, w, g.dx_rows(), g.dw, g.db);
  return {g.dx, g.dw, g.db};
}
}  // namespace

// dy (..., OUT), x (..., IN), w (OUT, IN) -> dx (..., IN), dw (OUT, IN), db (OUT) where needed
// (db only with a bias).
Tensors linear_backward(const Tensor& dout, const Tensor& x, const Tensor& w_in, bool has_bias,
                        const std::vector<bool>& needs) {
  const Tensor x2 = kern::as_rows(kern::contig(x)), w = kern::contig(w_in);
  const Tensor dy = kern::as_rows(dout);
  LinearGrads g(x.shape(), w, has_bias, needs);
  const Tensor dx2 = g.dx_rows();
  if (is_half(x.dtype())) {
    linear_backward_half(dy, x2, w, dx2, g.dw, g.db);
  } else if (linear_in_bf16(x) && x2.numel() > 0 && dy.numel() > 0) {
    linear_backward_bf16(dy, x2, w, dx2, g.dw, g.db);
  } else if (x.dtype() == DType::f32 && x2.numel() > 0 && dy.numel() > 0) {
    const LinearMds m(x2.shape()[0], x2.shape()[1], w.shape()[0], has_bias);
    if (g.dx.defined()) linear_backward_data_f32(m, dy, w, dx2);
    if (g.dw.defined() || g.db.defined()) linear_backward_weights_f32(m, x2, dy, g.dw, g.db);
  } else {
    GRAFT_DISPATCH_FLOAT(x.dtype(), "linear",
                         [&] { linear_backward_loop<T>(dy, x2, w, dx2, g.dw, g.db); });
  }
  return {g.dx, g.dw, g.db};
}

// Under PrecisionGuard(int8) a float32 linear without a tape runs kern::linear_int8 (its
// reference loop where oneDNN has no VNNI kernel: said once on stderr); one that records is an
// error, int8 having no backward.
bool linear_in_int8(const Tensor& x, bool record) {
  if (x.dtype() != DType::f32 || matmul_precision() != Precision::int8) return false;
  if (record)
    fail(
        "linear: int8 precision is for inference, but this call records a tape (an input requires "
        "grad and recording is on): run it under autograd::NoGrad, or train in fp32 or bf16");
  if (!int8_kernel_available()) {
    static std::once_flag said;
    std::call_once(said, [] { std::fprintf(stderr, "graft: %s\n", int8_description().c_str()); });
  }
  return true;
}

// A float32 linear at fp32 precision that records nothing, on non-empty x and y: the path a
// decoding step takes most, run without row views (linear_forward_inference).
bool plain_f32_inference(const Tensor& x, const Tensor& y, bool record) {
  return !record && x.dtype() == DType::f32 && matmul_precision() == Precision::fp32 &&
         x.numel() > 0 && y.numel() > 0;
}

namespace {
GRAFT_DECLARE_OP("linear_weight_grad", "matmul");

// linear_weight_grad's backward for g (OUT, IN): d dy = x g^T, d x = dy g, each in its
// operand's shape; recorded ops under create_graph.
Tensors linear_weight_grad_backward(const Tensor& g, const Tensor& dy, const Tensor& x,
                                    const autograd::Ctx& c) {
  const int64_t out = g.size(0), in = g.size(1);
  if (c.create_graph)
    return {c.needs[0] ? reshape(matmul(reshape(x, {-1, in}), transpose(g, 0, 1)), dy.shape())
                       : Tensor(),
            c.needs[1] ? reshape(matmul(reshape(dy, {-1, out}), g), x.shape()) : Tensor()};
  const Tensor dy2 = kern::as_rows(kern::contig(dy)), x2 = kern::as_rows(kern::contig(x));
  Tensor ddy, dx;
  if (c.needs[0]) {
    ddy = Tensor::empty(dy.shape(), dy.dtype());
    kern::gemm(x2, kern::swap_last2(g), kern::as_rows(ddy));
  }
  if (c.needs[1]) {
    dx = Tensor::empty(x.shape(), x.dtype());
    kern::gemm(dy2, g, kern::as_rows(dx));
  }
  return {ddy, dx};
}

}  // namespace

// dw (OUT, IN) = dy^T x over all rows of dy (..., OUT) and x (..., IN): linear's weight gradient
// as an op of its own, which linear's backward records under create_graph. Written as
// matmul(transpose(dy), x) instead, the next backward would make the gradient of the transposed
// dy and copy it back into dy's layout (a tenth of the base model's Hessian-vector product's
// second backward, outside the matmuls).
Tensor linear_weight_grad(const Tensor& dy, const Tensor& x) {
  check_defined(dy, "linear_weight_grad", "dy");
  check_defined(x, "linear_weight_grad", "x");
  const Tensor dy2 = kern::as_rows(kern::contig(dy)), x2 = kern::as_rows(kern::contig(x));
  Tensor dw = Tensor::empty({dy2.size(1), x2.size(1)}, dy.dtype());
  if (dy2.size(0) == 0) fill_(dw, 0);
  else kern::gemm(kern::swap_last2(dy2), x2, dw);
  if (autograd::needs_record({dy, x}))
    autograd::record("linear_weight_grad", {dy, x}, {dw}, {dy, x},
                     [prec = precision_state()](const autograd::Ctx& c, const Tensors& dout) {
                       PrecisionGuard guard(prec);
                       return linear_weight_grad_backward(dout[0], c.saved[0], c.saved[1], c);
                     });
  return dw;
}

namespace {

// linear's backward as recorded ops (under create_graph): dx = dy w, dw = dy^T x over all rows,
// db = dy (the tape sums it to (OUT)).
Tensors linear_backward_graph(const Tensor& dy, const Tensor& x, const Tensor& w, bool has_bias,
                              const std::vector<bool>& needs) {
  Tensor dx, dw, db;
  if (needs[0]) dx = matmul(dy, w);
  if (needs[1]) dw = linear_weight_grad(dy, x);
  if (has_bias && needs[2]) db = dy;
  return {dx, dw, db};
}

// Under the oneDNN bf16 path the forward converts x to bf16 anyway: when no other tape entry
// keeps x, that copy is kept for dW instead of x (half the bytes, and no second conversion).
// Without a weight gradient to come, x is not needed at all.
void record_linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                   const std::shared_ptr<kern::Bf16Operand>& x16) {
  const bool has_bias = b.defined();
  const PrecisionState prec = precision_state();
  if (!x16) {
    autograd::record("linear", {x, w, b}, {y}, {x, w},
                     [has_bias, prec](const autograd::Ctx& c, const Tensors& dout) {
                       PrecisionGuard guard(prec);
                       if (c.create_graph)
                         return linear_backward_graph(dout[0], c.saved[0], c.saved[1], has_bias,
                                                      c.needs);
                       return linear_backward(dout[0], c.saved[0], c.saved[1], has_bias, c.needs);
                     });
    return;
  }
  autograd::record(
      "linear", {x, w, b}, {y}, {w}, {{x16->storage, x}},
      [has_bias, prec, x16, x_shape = x.shape()](const autograd::Ctx& c, const Tensors& dout) {
        PrecisionGuard guard(prec);
        if (c.create_graph)
          fail(autograd::ordinal(c.order) +
               " backward of 'linear': under create_graph it needs its float input x, "
               "which the bf16 path kept only as bfloat16; compute higher-order gradients in "
               "float32 precision");
        return linear_backward_kept(dout[0], *x16, x_shape, c.saved[0], has_bias, c.needs);
      });
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear(x, w, b);
  Shape y_shape = x.shape();
  y_shape.back() = w.shape()[0];
  const Tensor xc = kern::contig(x), wc = kern::contig(w);
  const Tensor bc = b.defined() ? kern::contig(b) : Tensor();
  Tensor y = Tensor::empty(y_shape, x.dtype());
  const bool record = autograd::needs_record({x, w, b});
  if (plain_f32_inference(x, y, record)) {  // the common inference case, without row views
    linear_forward_inference(xc, x.numel() / x.shape().back(), wc, bc, y, /*bf16=*/false);
    return y;
  }
  const Tensor x2 = kern::as_rows(xc), y2 = kern::as_rows(y);
  if (is_half(x.dtype())) {  // 16-bit tensors: their own kernels, forward and backward
    linear_forward_half(x2, wc, bc, y2, !record);
    if (record) record_linear(x, w, b, y, nullptr);
    return y;
  }
  if (linear_in_int8(x, record) && x2.numel() > 0 && y2.numel() > 0) {
    kern::linear_int8(x2, wc, bc, y2, /*reference=*/!int8_kernel_available());
    return y;
  }
  const bool bf16 = linear_in_bf16(x) && x2.numel() > 0 && y2.numel() > 0;
  std::shared_ptr<kern::Bf16Operand> x16;
  if (bf16 && record && w.requires_grad() && kern::keep_bf16_of(x))
    x16 = std::make_shared<kern::Bf16Operand>(kern::kept_bf16(x2));
  const bool f32 = x.dtype() == DType::f32 && x2.numel() > 0 && y2.numel() > 0;
  const kern::BCopy w_copy = record ? kern::BCopy::per_call : kern::BCopy::weight;
  if (x16) linear_forward_matmul(*x16, wc, bc, y2, w_copy);
  else if (bf16 && !record && kern::bf16_kernel_in_force())
    linear_forward_inference(x2, x2.shape()[0], wc, bc, y2, /*bf16=*/true);
  else if (bf16) linear_forward_matmul(x2, wc, bc, y2, w_copy);
  else if (f32 && !record) linear_forward_inference(x2, x2.shape()[0], wc, bc, y2, /*bf16=*/false);
  else if (f32) linear_forward_matmul(x2, wc, bc, y2, w_copy);
  else GRAFT_DISPATCH_FLOAT(x.dtype(), "linear", [&] { linear_loop<T>(x2, wc, bc, y2); });
  if (record) record_linear(x, w, b, y, x16);
  return y;
}

}  // namespace graft

namespace graft::kern {

namespace {

// A weight keep_blocked_f32 packs: its layouts and where its form starts in the block.
struct PackedWeight {
  const Tensor* w;
  const std::string* name;
  dnnl::memory::desc plain, blocked;
  uint64_t tag;
  size_t at;
};

std::string kept_f32_why(const std::string& name, const Tensor& w) {
  return name + " " + describe(w) +
         ": its float32 values were freed when it was kept in the blocked layout of float32 "
         "inference (keep_weight_fp32); only linear without a tape at fp32 precision (and "
         "embedding without a tape) reads it now: load the weights again to train it, save it "
         "or run it in another precision";
}

// The weights of `weights` that get a blocked form (each storage once), placed one after another
// (64-byte aligned); `total` their bytes.
std::vector<PackedWeight> pack_f32_forms(const std::vector<std::pair<std::string, Tensor>>& weights,
                                         size_t& total) {
  std::vector<PackedWeight> packed;
  std::set<const Storage*> seen;
  total = 0;
  for (const auto& [name, w] : weights) {
    const Storage* s = w.impl()->storage.get();
    if (!s->data || w.numel() == 0) continue;  // kept already, or nothing to keep
    check_whole_storage(w, "keep_weight_fp32", name);
    if (!seen.insert(s).second) continue;  // named twice
    const int64_t OUT = w.shape()[0], IN = w.shape()[1];
    const dnnl::memory::desc plain = onednn::md_contiguous({OUT, IN});
    dnnl::memory::desc blocked = kern::panel_layout(OUT, IN);
    if (!kern::panels_built()) {
      const auto& c = inference_inner_product(kLayoutRows, IN, OUT, /*has_bias=*/true, false);
      if (c.mds[1] == c.mds[4]) continue;  // the kernel reads w's own rows: nothing held twice
      blocked = c.mds[1];
    }
    const size_t at = (total + 63) / 64 * 64, bytes = blocked.get_size();
    if (at < total || bytes > SIZE_MAX - at) fail("keep_weight_fp32: the weights' bytes overflow");
    packed.push_back({&w, &name, plain, blocked, onednn::layout_tag(blocked), at});
    total = at + bytes;
  }
  return packed;
}

}  // namespace

// One block for all forms: a decoding step streams every weight from memory, and on 2 MiB pages
// it walks 512 times fewer pages (docs/performance.md). Each weight's values are freed as soon as
// its form is written, so the peak stays the weights plus one.
size_t keep_blocked_f32(const std::vector<std::pair<std::string, Tensor>>& weights) {
  size_t total = 0;
  const std::vector<PackedWeight> packed = pack_f32_forms(weights, total);
  if (packed.empty()) return 0;
  forget_dead_forms();  // a dead model's block goes before this one comes
  const HugeBlock block = huge_block(total, "keep_weight_fp32");
  size_t freed = 0;
  for (const PackedWeight& p : packed) {
    float* bytes = reinterpret_cast<float*>(block.at(p.at));
    const std::string why = kept_f32_why(*p.name, *p.w);
    const bool panels = kern::is_panel_layout(p.blocked);
    if (panels)
      kern::pack_panels(p.w->data<float>(), p.w->shape()[0], p.w->shape()[1], bytes, true);
    else reorder_into(p.plain, p.w->data<float>(), p.blocked, bytes);
    const bool huge = p.at >= block.huge_from && p.at + p.blocked.get_size() <= block.huge_to;
    const kern::KeptForm form{block.data, p.w->shape()[0], p.w->shape()[1],    DType::f32,
                              p.tag,      p.blocked,       block.shift + p.at, huge};
    try {
      freed += replace_weight(*p.w, form, why);
    } catch (...) {  // out of memory: packing consumed the values, so none may be read again
      if (panels) p.w->impl()->storage->release(why);
      throw;
    }
  }
  drop_stale_derived_copies();  // copies inference made from the values before
  return freed;
}

uint64_t kept_f32_panel_calls() { return panel_calls.load(std::memory_order_relaxed); }

uint64_t linear_pieces_calls() {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
  return pieces_calls.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

uint64_t kept_bf16_loop_calls() {
#if defined(__AVX512BF16__)
  return kept_loop_calls.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

bool kept_bf16_loop_expected() {
#if defined(__AVX512BF16__)
  return bf16_kernel_available() &&
         dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_bf16;
#else
  return false;
#endif
}

size_t keep_blocked_bf16(const Tensor& w, const std::string& name) {
  if (!w.impl()->storage->data) return 0;  // already kept (or released by its owner)
  check_whole_storage(w, "keep_weight_bf16", name);
  if (!bf16_kernel_available()) return 0;  // no bf16 kernel: the 16-bit loops read plain rows
  const int64_t OUT = w.shape()[0], IN = w.shape()[1];
  const dnnl::memory::desc any({OUT, IN}, dnnl::memory::data_type::bf16,
                               dnnl::memory::format_tag::any);
  const onednn::Cached<dnnl::inner_product_forward>* c = nullptr;
  try {
    c = &half_inner_product(kLayoutRows, any, /*has_bias=*/true);
  } catch (const dnnl::error&) {
    return 0;  // only a reference kernel: the plain rows stay, read as before
  }
  if (c->mds[1] == c->mds[4]) return 0;  // the kernel reads w's own rows: nothing to gain
  auto blocked = std::make_shared<Storage>(c->mds[1].get_size());
  reorder_into(c->mds[4], w.raw(), c->mds[1], blocked->data);
  return replace_weight(
      w, {blocked, OUT, IN, DType::bf16, c->weights_tag, c->mds[1]},
      name + " " + describe(w) +
          ": its bf16 values were freed when it was kept in the inner product's blocked layout "
          "for bf16 inference (keep_weight_bf16); only linear on bf16 tensors without a tape "
          "reads it now: load the weights again to train it, save it or run it in another "
          "precision");
}

}  // namespace graft::kern
