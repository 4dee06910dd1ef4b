#include "ops/internal/int8.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "graft/ops/custom.h"
#include "ops/internal/dnnl_utils.h"
#include "ops/internal/kept.h"
#include "ops/internal/kernels.h"

namespace graft::kern {

namespace {

std::atomic<uint64_t> copies_made{0};

// The largest reduction length whose int32 sums cannot overflow: IN * 255 * 127 < 2^31.
constexpr int64_t kMaxIn = (int64_t(1) << 31) / (255 * 127) - 1;
constexpr size_t kAlign = 64;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// max |p[k]| / 127 over a row, NaN when the row holds a NaN or an inf.
float row_scale(const float* p, int64_t n) {
  float amax = 0.f, nonfinite = 0.f;
#pragma omp simd reduction(max : amax) reduction(+ : nonfinite)
  for (int64_t k = 0; k < n; ++k) {
    amax = std::max(amax, std::fabs(p[k]));
    nonfinite += p[k] * 0.f;  // 0 for a finite value, NaN for a NaN or an inf
  }
  return nonfinite == 0.f ? amax / 127.f : NAN;
}

// q[k] = round(p[k] / scale) in [-127, 127] (+ offset), ties away from zero; zeros when the scale
// is 0 or not finite.
template <class Q>
void quantize_row(const float* p, int64_t n, float scale, int offset, Q* q) {
  if (!(scale > 0.f && scale <= FLT_MAX)) {  // never round p / scale: a NaN has no integer
    std::fill(q, q + n, (Q)offset);
    return;
  }
  int64_t k = 0;
#if defined(__AVX2__)
  // 8 at a time: g++ 12 compiles the loop below to scalar divisions and branches, 12% of an int8
  // prompt (SmolLM's shape, AMD EPYC Zen 3); the same arithmetic on vectors.
  const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  const __m256 half = _mm256_set1_ps(0.5f), sign = _mm256_set1_ps(-0.f);
  const __m256i off = _mm256_set1_epi32(offset);
  for (; k + 8 <= n; k += 8) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(p + k), s), lo), hi);
    const __m256 r = _mm256_add_ps(v, _mm256_or_ps(_mm256_and_ps(v, sign), half));
    const __m256i i = _mm256_add_epi32(_mm256_cvttps_epi32(r), off);
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    const __m128i b8 =
        std::is_same_v<Q, uint8_t> ? _mm_packus_epi16(w16, w16) : _mm_packs_epi16(w16, w16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), b8);
  }
#endif
  for (; k < n; ++k) {  // a division: 1 / scale overflows for a subnormal scale
    const float v = std::clamp(p[k] / scale, -127.f, 127.f);
    q[k] = (Q)((int)(v + (v >= 0.f ? 0.5f : -0.5f)) + offset);
  }
}

// A weight's int8 form: per output channel its scale and Σ_k wq, then wq itself, plain (OUT, IN)
// rows or in the oneDNN layout the kernel reads. One storage, 64-byte aligned parts.
struct QuantWeights {
  const float* scale;
  const int32_t* sum;
  const int8_t* data;
};
QuantWeights view_quantized(const Storage& s, int64_t OUT) {
  auto* base = static_cast<char*>(s.data);
  const size_t sums_at = aligned(OUT * sizeof(float)),
               data_at = sums_at + aligned(OUT * sizeof(int32_t));
  return {reinterpret_cast<const float*>(base), reinterpret_cast<const int32_t*>(base + sums_at),
          reinterpret_cast<const int8_t*>(base + data_at)};
}

// Storage for a weight's int8 form whose wq part takes `data_bytes`.
std::shared_ptr<Storage> quantized_storage(int64_t OUT, size_t data_bytes) {
  return std::make_shared<Storage>(aligned(OUT * sizeof(float)) + aligned(OUT * sizeof(int32_t)) +
                                   data_bytes);
}

// w (OUT, IN) quantized per output channel, wq as plain rows. A NaN or inf weight is refused: its
// channel's scale would be NaN, silently (the activations' rows keep the NaN-scale rule).
std::shared_ptr<Storage> quantize_weights(const Tensor& w) {
  check_weight_finite(w, "linear (int8)", false);
  const int64_t OUT = w.shape()[0], IN = w.shape()[1];
  auto s = quantized_storage(OUT, (size_t)OUT * IN);
  const QuantWeights q = view_quantized(*s, OUT);
  auto* scale = const_cast<float*>(q.scale);
  auto* sum = const_cast<int32_t*>(q.sum);
  auto* data = const_cast<int8_t*>(q.data);
  const float* pw = w.data<float>();
#pragma omp parallel for if (OUT * IN > kParallelGrain) schedule(static)
  for (int64_t o = 0; o < OUT; ++o) {
    scale[o] = row_scale(pw + o * IN, IN);
    quantize_row(pw + o * IN, IN, scale[o], 0, data + o * IN);
    int32_t total = 0;
    for (int64_t k = 0; k < IN; ++k) total += data[o * IN + k];
    sum[o] = total;
  }
  copies_made.fetch_add(1);
  return s;
}

// x (N, IN) quantized per row, in this thread's buffers: the bytes of xq + offset (offset 128:
// u8 rows, for oneDNN's u8 x s8 kernel; 0: s8 rows, for the integer loop) and the rows' scales.
struct QuantRows {
  const uint8_t* data;
  const float* scale;
  int32_t offset;
};
QuantRows quantize_activations(const Tensor& x2, int32_t offset) {
  thread_local std::vector<uint8_t> data;
  thread_local std::vector<float> scale;
  const int64_t N = x2.shape()[0], IN = x2.shape()[1];
  data.resize((size_t)N * IN);
  scale.resize(N);
  const float* px = x2.data<float>();
  uint8_t* pq =
      data.data();  // the pointers, not the thread_local vectors, go into the parallel loop
  float* ps = scale.data();
#pragma omp parallel for if (N * IN > kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    ps[n] = row_scale(px + n * IN, IN);
    if (offset == 0)
      quantize_row(px + n * IN, IN, ps[n], 0, reinterpret_cast<int8_t*>(pq) + n * IN);
    else quantize_row(px + n * IN, IN, ps[n], offset, pq + n * IN);
  }
  return {pq, ps, offset};
}

// acc (N, OUT, int32, written over y's bytes) -> y = (acc - offset sum[o]) xs[n] ws[o] + b[o]:
// acc summed the rows' bytes, xq + offset.
void dequantize(const QuantRows& x, const QuantWeights& w, const Tensor& b, float* y, int64_t N,
                int64_t OUT) {
  const float* pb = b.defined() ? b.data<float>() : nullptr;
#pragma omp parallel for if (N * OUT > kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = y + n * OUT;
    const float xs = x.scale[n];
#pragma omp simd
    for (int64_t o = 0; o < OUT; ++o) {
      const int32_t acc = std::bit_cast<int32_t>(row[o]) - x.offset * w.sum[o];
      row[o] = (float)acc * (xs * w.scale[o]) + (pb ? pb[o] : 0.f);
    }
  }
}

#if defined(__AVX2__)
// The 8 lanes of each of a[0..7] summed: lane i of the result is a[i]'s sum.
__m256i lane_sums8(const __m256i* a) {
  const __m256i s01 = _mm256_hadd_epi32(a[0], a[1]), s23 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i s45 = _mm256_hadd_epi32(a[4], a[5]), s67 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                          _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

// The sum of a's 8 lanes.
int32_t lane_sum(__m256i a) {
  const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  const __m128i q = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1)));
}
#endif

// acc[r][c] = the int32 sum over k of x[r * IN + k] * w[c * IN + k] for R rows of x and C rows of
// w, both s8 in [-127, 127]. With AVX2, 32 products at a time: vpmaddubsw multiplies |w| (u8) by
// x with w's sign (s8) and adds pairs into int16, which cannot saturate (2 * 127 * 127 < 2^15),
// and vpmaddwd by ones widens the pairs into int32: exact, and 1.2-1.7x the int16 vpmaddwd loop
// this replaced (128 x 512 x 58112, AMD EPYC Zen 3: docs/hub-models.md).
template <int R, int C>
void dot_tile_int8(const int8_t* x, const int8_t* w, int64_t IN, int32_t (*acc)[2]) {
  int64_t k = 0;
#if defined(__AVX2__)
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a[R * C];
  for (int i = 0; i < R * C; ++i) a[i] = _mm256_setzero_si256();
  for (; k + 32 <= IN; k += 32) {
    __m256i xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_si256((const __m256i*)(x + r * IN + k));
    for (int c = 0; c < C; ++c) {
      const __m256i wv = _mm256_loadu_si256((const __m256i*)(w + c * IN + k));
      const __m256i wa = _mm256_abs_epi8(wv);
      for (int r = 0; r < R; ++r) {
        const __m256i pairs = _mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv[r], wv));
        a[r * C + c] = _mm256_add_epi32(a[r * C + c], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  if constexpr (R * C == 8) {
    alignas(32) int32_t lanes[8];
    _mm256_store_si256((__m256i*)lanes, lane_sums8(a));
    for (int i = 0; i < 8; ++i) acc[i / C][i % C] = lanes[i];
  } else {
    for (int i = 0; i < R * C; ++i) acc[i / C][i % C] = lane_sum(a[i]);
  }
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = 0;
#endif
  for (; k < IN; ++k)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] += (int32_t)x[r * IN + k] * w[c * IN + k];
}

// The sums of rows [n, n + R) of x with weight rows [o, o + C) into y (as float bits): 4 x 2,
// 4 x 1 or one by one (a single row of x reads the weight rows one after the other: 2 rows at a
// time read 23 GB/s -> 13 GB/s here, the prefetcher losing the stream).
void int8_tile(const int8_t* x, const int8_t* w, float* y, int64_t IN, int64_t OUT, int64_t R,
               int64_t C) {
  int32_t acc[4][2];
  if (R == 4 && C == 2) dot_tile_int8<4, 2>(x, w, IN, acc);
  else if (R == 4 && C == 1) dot_tile_int8<4, 1>(x, w, IN, acc);
  else
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        int32_t one[1][2];
        dot_tile_int8<1, 1>(x + r * IN, w + c * IN, IN, one);
        acc[r][c] = one[0][0];
      }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) y[r * OUT + c] = std::bit_cast<float>(acc[r][c]);
}

// y (N, OUT) = the int32 sums xq (N, IN, s8: offset 0) . w (OUT, IN plain rows, s8), as
// float bits. The loop that runs where oneDNN has no VNNI kernel (its AVX2 u8 x s8 GEMM saturates
// int16 pair sums): the weight rows taken in blocks of 32 (16 KiB at 512 inputs: in the L1 cache)
// while every row of x passes, in tiles of 4 rows of x by 2 rows of w (int8_tile). The sums are
// exact, so neither the order nor the split over threads changes a bit.
void matmul_int8_reference(const QuantRows& x, const QuantWeights& w, float* y, int64_t N,
                           int64_t IN, int64_t OUT) {
  constexpr int64_t kBlock = 32;
  const auto* xp = reinterpret_cast<const int8_t*>(x.data);
  const int64_t blocks = (OUT + kBlock - 1) / kBlock;
#pragma omp parallel for if (N * OUT * IN > kParallelGrain) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(OUT, (b + 1) * kBlock);
    for (int64_t n = 0; n < N; n += 4)
      for (int64_t o = b * kBlock; o < end; o += 2)
        int8_tile(xp + n * IN, w.data + o * IN, y + n * OUT + o, IN, OUT,
                  std::min<int64_t>(4, N - n), std::min<int64_t>(2, end - o));
  }
}

// The oneDNN int8 matmul (u8 x s8 -> s32) for (N, IN) x (IN, OUT), cached per problem; mds: src,
// weights (the kernel's layout), dst, weights as plain (OUT, IN) rows.
const onednn::Cached<dnnl::matmul>& int8_matmul(int64_t N, int64_t IN, int64_t OUT) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  constexpr int64_t kInt8Key = -8;  // apart from kern::bmm's float matmuls in the same cache
  return onednn::cached<dnnl::matmul>({kInt8Key, N, IN, OUT}, [&] {
    const dnnl::memory::desc src({N, IN}, dt::u8, tag::ab), wei({IN, OUT}, dt::s8, tag::any),
        dst({N, OUT}, dt::s32, tag::ab), plain({IN, OUT}, dt::s8, tag::ba);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst),
                                          onednn::user_scratchpad(), onednn::engine());
    onednn::Cached<dnnl::matmul> made{dnnl::matmul(pd), {src, pd.weights_desc(), dst, plain}};
    made.weights_tag = onednn::layout_tag(pd.weights_desc());
    return made;
  });
}

// A quantized storage of OUT rows (plain (OUT, IN) rows of wq) with wq reordered into the
// kernel's layout `best`; plain: the plain rows' descriptor.
std::shared_ptr<Storage> kernel_form(const Storage& rows, int64_t OUT,
                                     const dnnl::memory::desc& plain,
                                     const dnnl::memory::desc& best) {
  auto s = quantized_storage(OUT, best.get_size());
  const QuantWeights from = view_quantized(rows, OUT), to = view_quantized(*s, OUT);
  std::memcpy(s->data, rows.data,
              reinterpret_cast<const char*>(from.data) - static_cast<const char*>(rows.data));
  auto src = onednn::mem(plain, const_cast<int8_t*>(from.data));
  auto dst = onednn::mem(best, const_cast<int8_t*>(to.data));
  dnnl::reorder(src, dst).execute(onednn::stream(), src, dst);
  onednn::stream().wait();
  return s;
}

// The int8 form that replaces a float32 weight whose values were freed (quantize_for_inference,
// kern::replace_weight): the whole weight quantized, wq in its layout (the kernel's, or plain rows
// for the reference loop, tag kPlainTag). Only this form is kept; a slice of the weight
// (attention's in_proj parts) or another layout is derived from it.
constexpr uint64_t kPlainTag = 0x1a78;  // apart from layout_tag()'s tags (top bit set)
using Replacement = KeptForm;

// The replacement of w's storage, or nullopt when w holds its float32 values.
const Replacement* replacement_of(const Tensor& w) { return kept_form(w, DType::i8); }

// The replacement's plain (OUT, IN) rows (a copy when it is kept in the kernel's layout).
std::shared_ptr<Storage> plain_rows(const Replacement& r) {
  if (r.tag == kPlainTag) return r.data;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc plain({r.IN, r.OUT}, dt::s8, dnnl::memory::format_tag::ba);
  auto s = quantized_storage(r.OUT, (size_t)r.OUT * r.IN);
  const QuantWeights from = view_quantized(*r.data, r.OUT), to = view_quantized(*s, r.OUT);
  std::memcpy(s->data, r.data->data,
              reinterpret_cast<const char*>(from.data) - static_cast<const char*>(r.data->data));
  auto src = onednn::mem(r.layout, const_cast<int8_t*>(from.data));
  auto dst = onednn::mem(plain, const_cast<int8_t*>(to.data));
  dnnl::reorder(src, dst).execute(onednn::stream(), src, dst);
  onednn::stream().wait();
  return s;
}

// Rows [first, first + n) of a plain quantized storage of OUT rows of IN.
std::shared_ptr<Storage> row_slice(const Storage& rows, int64_t OUT, int64_t IN, int64_t first,
                                   int64_t n) {
  auto s = quantized_storage(n, (size_t)n * IN);
  const QuantWeights from = view_quantized(rows, OUT), to = view_quantized(*s, n);
  std::memcpy(const_cast<float*>(to.scale), from.scale + first, n * sizeof(float));
  std::memcpy(const_cast<int32_t*>(to.sum), from.sum + first, n * sizeof(int32_t));
  std::memcpy(const_cast<int8_t*>(to.data), from.data + first * IN, (size_t)n * IN);
  return s;
}

// w (OUT, IN) quantized as plain rows: from its float32 values, or from its replacement when
// they were freed (w may be a slice of rows of the replaced weight).
std::shared_ptr<Storage> quantized_rows(const Tensor& w, const Replacement* r) {
  if (!r) return quantize_weights(w);
  const std::shared_ptr<Storage> all = plain_rows(*r);
  const int64_t OUT = w.shape()[0];
  if (OUT == r->OUT) return all;
  return row_slice(*all, r->OUT, r->IN, w.offset() / r->IN, OUT);
}

// Whether w is the whole replaced weight (not a slice of it).
bool whole(const Tensor& w, const Replacement* r) {
  return r && w.offset() == 0 && w.shape()[0] == r->OUT;
}

// The oneDNN matmul for a weight of OUT x IN, at the M a decoding step of 32 rows uses: the
// layout of a quantize_for_inference weight (oneDNN 2.6 picks the same one for every M here).
constexpr int64_t kLayoutRows = 32;

}  // namespace

void linear_int8(const Tensor& x2, const Tensor& w, const Tensor& b, const Tensor& y2,
                 bool reference) {
  const int64_t N = x2.shape()[0], IN = x2.shape()[1], OUT = w.shape()[0];
  if (IN > kMaxIn)
    fail("linear: int8 precision sums " + std::to_string(IN) +
         " products per output, more than the " + std::to_string(kMaxIn) +
         " an int32 sum of u8 x s8 products holds without overflow");
  float* y = y2.data<float>();
  const QuantRows xq = quantize_activations(x2, reference ? 0 : 128);
  const Replacement* r = replacement_of(w);
  if (reference) {
    const auto s = whole(w, r) && r->tag == kPlainTag
                       ? r->data
                       : derived_copy(w, kPlainTag, [&] { return quantized_rows(w, r); });
    const QuantWeights q = view_quantized(*s, OUT);
    matmul_int8_reference(xq, q, y, N, IN, OUT);
    dequantize(xq, q, b, y, N, OUT);
    return;
  }
  const auto& c = int8_matmul(N, IN, OUT);
  const auto s =
      whole(w, r) && r->tag == c.weights_tag ? r->data : derived_copy(w, c.weights_tag, [&] {
        return kernel_form(*quantized_rows(w, r), OUT, c.mds[3], c.mds[1]);
      });
  const QuantWeights q = view_quantized(*s, OUT);
  onednn::run(c, {{DNNL_ARG_SRC, c.mds[0], xq.data},
                  {DNNL_ARG_WEIGHTS, c.mds[1], q.data},
                  {DNNL_ARG_DST, c.mds[2], y}});
  dequantize(xq, q, b, y, N, OUT);
}

namespace {

// The replacement of a weight of OUT x IN from its int8 rows (a plain quantized storage): those
// rows themselves for the reference loop, else reordered into the kernel's layout.
Replacement replacement_from_rows(std::shared_ptr<Storage> rows, int64_t OUT, int64_t IN,
                                  bool reference) {
  Replacement r{std::move(rows), OUT, IN, DType::i8, kPlainTag, {}};
  if (reference) return r;
  const auto& c = int8_matmul(kLayoutRows, IN, OUT);
  r.data = kernel_form(*r.data, OUT, c.mds[3], c.mds[1]);
  r.tag = c.weights_tag;
  r.layout = c.mds[1];
  return r;
}

// Makes r the int8 form of w for good (kern::replace_weight): w's float32 values (if it holds
// any) are released, and linear_int8 reads r from then on. Returns the bytes freed.
size_t install_int8(const Tensor& w, const Replacement& r, const std::string& name) {
  return replace_weight(
      w, r,
      name + " " + describe(w) +
          ": its float32 values were freed when it was quantized to int8 for inference "
          "(quantize_weight_int8, or loaded as int8: set_weight_int8); only linear under "
          "PrecisionGuard(int8) without a tape reads it now: load the float32 weights again "
          "to train it, save it in float32 or run it in another precision");
}

// The checks of set_weight_int8's parts, each error naming `name` (the values' tensor) and
// `scale_name`: values int8 (OUT, IN) like w, in [-127, 127]; scales float32 (OUT), finite, >= 0.
void check_int8_parts(const Tensor& w, const Tensor& values, const Tensor& scales,
                      const std::string& name, const std::string& scale_name) {
  const std::string who = "set_weight_int8: ";
  if (values.dtype() != DType::i8 || values.shape() != w.shape() || !values.is_contiguous())
    fail(who + "tensor '" + name + "' is " + describe(values) + ", its int8 values must be i8 " +
         shape_str(w.shape()) + " (the weight's shape), contiguous");
  if (scales.dtype() != DType::f32 || scales.shape() != Shape{w.shape()[0]} ||
      !scales.is_contiguous())
    fail(who + "tensor '" + scale_name + "' is " + describe(scales) +
         ", the scales of an int8 weight must be f32 (" + std::to_string(w.shape()[0]) +
         "): one per output row of '" + name + "' " + shape_str(w.shape()));
  const float* s = scales.data<float>();
  const int64_t OUT = w.shape()[0], n = values.numel();
  for (int64_t o = 0; o < OUT; ++o)
    if (!(s[o] >= 0.f && s[o] <= FLT_MAX))
      fail(who + "tensor '" + scale_name + "' holds " + std::to_string(s[o]) + " at [" +
           std::to_string(o) + "]: a scale must be finite and >= 0");
  const int8_t* v = values.data<int8_t>();
  const int64_t at = std::find(v, v + n, int8_t(-128)) - v;
  if (at < n)
    fail(who + "tensor '" + name + "' holds -128 at element " + std::to_string(at) +
         ": int8 weights are symmetric, in [-127, 127]");
}

}  // namespace

int64_t int8_layout_mismatches(int64_t OUT, int64_t IN) {
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc plain({IN, OUT}, dnnl::memory::data_type::s8, tag::ba);
  std::vector<int8_t> from((size_t)(OUT * IN));
  for (size_t i = 0; i < from.size(); ++i) from[i] = (int8_t)(i * 37 % 255 - 127);
  int64_t bad = 0;
  for (tag t : {tag::ab, tag::ba, tag::AB16b64a4b, tag::AB16b32a4b, tag::AB16b16a4b,
                tag::BA16a64b4a, tag::BA16a48b4a, tag::BA16a32b4a, tag::BA16a16b4a}) {
    const dnnl::memory::desc d({IN, OUT}, dnnl::memory::data_type::s8, t);
    std::vector<int8_t> to(d.get_size(), 0);
    auto src = onednn::mem(plain, from.data());
    auto dst = onednn::mem(d, to.data());
    dnnl::reorder(src, dst).execute(onednn::stream(), src, dst);
    onednn::stream().wait();
    for (int64_t o = 0; o < OUT; ++o)
      for (int64_t k = 0; k < IN; ++k) bad += to[blocked_offset(d, k, o)] != from[o * IN + k];
  }
  return bad;
}

bool has_int8_form(const Tensor& w) { return replacement_of(w) != nullptr; }

bool gather_int8_rows(const Tensor& w, const int64_t* ids, int64_t N, float* out) {
  const Replacement* r = replacement_of(w);
  if (!r) return false;
  const int64_t IN = r->IN;
  const QuantWeights q = view_quantized(*r->data, r->OUT);
  const bool plain = r->tag == kPlainTag;
  const int64_t first = w.offset() / IN;  // w may be a slice of the table's rows
  for (int64_t n = 0; n < N; ++n) {
    const int64_t o = first + ids[n];
    float* row = out + n * IN;
    for (int64_t k = 0; k < IN; ++k)
      row[k] = q.scale[o] * q.data[plain ? o * IN + k : blocked_offset(r->layout, k, o)];
  }
  return true;
}

namespace {}  // namespace

size_t quantize_for_inference(const Tensor& w, const std::string& name, bool reference) {
  if (!w.impl()->storage->data) return 0;  // already replaced (or released by its owner)
  return quantize_into(w, w, name, reference);
}

size_t quantize_into(const Tensor& w, const Tensor& from, const std::string& name, bool reference) {
  check_whole_storage(w, "quantize_weight_int8", name);
  std::shared_ptr<Storage> rows;
  try {
    rows = quantize_weights(from);
  } catch (const Error& e) {
    fail("quantize_weight_int8: " + name + ": " + e.what());
  }
  return install_int8(
      w, replacement_from_rows(std::move(rows), w.shape()[0], w.shape()[1], reference), name);
}

std::pair<Tensor, Tensor> int8_parts(const Tensor& w) {
  const int64_t OUT = w.shape()[0], IN = w.shape()[1];
  const std::shared_ptr<Storage> rows = quantized_rows(w, replacement_of(w));
  const QuantWeights q = view_quantized(*rows, OUT);
  Tensor values = Tensor::empty({OUT, IN}, DType::i8), scales = Tensor::empty({OUT}, DType::f32);
  std::memcpy(values.raw(), q.data, (size_t)OUT * IN);
  std::memcpy(scales.raw(), q.scale, (size_t)OUT * sizeof(float));
  return {values, scales};
}

size_t set_int8_parts(const Tensor& w, const Tensor& values, const Tensor& scales,
                      const std::string& name, const std::string& scale_name, bool reference) {
  check_whole_storage(w, "set_weight_int8", name);
  check_int8_parts(w, values, scales, name, scale_name);
  const int64_t OUT = w.shape()[0], IN = w.shape()[1];
  if (IN > kMaxIn)
    fail("set_weight_int8: tensor '" + name + "' " + describe(values) + " sums " +
         std::to_string(IN) + " products per output, more than the " + std::to_string(kMaxIn) +
         " an int32 sum holds");
  auto rows = quantized_storage(OUT, (size_t)OUT * IN);
  const QuantWeights q = view_quantized(*rows, OUT);
  std::memcpy(const_cast<float*>(q.scale), scales.raw(), (size_t)OUT * sizeof(float));
  std::memcpy(const_cast<int8_t*>(q.data), values.raw(), (size_t)OUT * IN);
  auto* sum = const_cast<int32_t*>(q.sum);
  for (int64_t o = 0; o < OUT; ++o) {
    int32_t total = 0;
    for (int64_t k = 0; k < IN; ++k) total += q.data[o * IN + k];
    sum[o] = total;
  }
  return install_int8(w, replacement_from_rows(std::move(rows), OUT, IN, reference), name);
}

uint64_t int8_weight_copies() { return copies_made.load(); }

}  // namespace graft::kern
