#include "ops/internal/int8.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "graft/ops/custom.h"
#include "ops/internal/dnnl_utils.h"
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
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {  // a division: 1 / scale overflows for a subnormal scale
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

// x (N, IN) as u8 rows (xq + 128) with their scales, in this thread's buffers.
struct QuantRows {
  const uint8_t* data;
  const float* scale;
};
QuantRows quantize_activations(const Tensor& x2) {
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
    quantize_row(px + n * IN, IN, ps[n], 128, pq + n * IN);
  }
  return {pq, ps};
}

// acc (N, OUT, int32, written over y's bytes) -> y = (acc - 128 sum[o]) xs[n] ws[o] + b[o].
void dequantize(const QuantRows& x, const QuantWeights& w, const Tensor& b, float* y, int64_t N,
                int64_t OUT) {
  const float* pb = b.defined() ? b.data<float>() : nullptr;
#pragma omp parallel for if (N * OUT > kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = y + n * OUT;
    const float xs = x.scale[n];
#pragma omp simd
    for (int64_t o = 0; o < OUT; ++o) {
      const int32_t acc = std::bit_cast<int32_t>(row[o]) - 128 * w.sum[o];
      row[o] = (float)acc * (xs * w.scale[o]) + (pb ? pb[o] : 0.f);
    }
  }
}

// The integer sums in a plain loop: acc[n][o] = Σ_k xq[n][k] wq[o][k], over y's bytes.
void matmul_int8_reference(const QuantRows& x, const QuantWeights& w, float* y, int64_t N,
                           int64_t IN, int64_t OUT) {
#pragma omp parallel for collapse(2) if (N * OUT * IN > kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      int32_t acc = 0;
      for (int64_t k = 0; k < IN; ++k)
        acc += (int32_t)x.data[n * IN + k] * (int32_t)w.data[o * IN + k];
      y[n * OUT + o] = std::bit_cast<float>(acc);
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
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), onednn::engine());
    onednn::Cached<dnnl::matmul> made{dnnl::matmul(pd), {src, pd.weights_desc(), dst, plain}};
    made.weights_tag = onednn::layout_tag(pd.weights_desc());
    return made;
  });
}

// w's int8 form with wq reordered into the kernel's layout `best` (once per version of w).
// tag: layout_tag(best), kept with the cached matmul.
std::shared_ptr<Storage> weights_for_kernel(const Tensor& w, uint64_t tag,
                                            const dnnl::memory::desc& plain,
                                            const dnnl::memory::desc& best) {
  return derived_copy(w, tag, [&] {
    const int64_t OUT = w.shape()[0];
    const auto rows = quantize_weights(w);
    auto s = quantized_storage(OUT, best.get_size());
    const QuantWeights from = view_quantized(*rows, OUT), to = view_quantized(*s, OUT);
    std::memcpy(s->data, rows->data,
                reinterpret_cast<const char*>(from.data) - static_cast<const char*>(rows->data));
    auto src = onednn::mem(plain, const_cast<int8_t*>(from.data));
    auto dst = onednn::mem(best, const_cast<int8_t*>(to.data));
    dnnl::reorder(src, dst).execute(onednn::stream(), src, dst);
    onednn::stream().wait();
    return s;
  });
}

}  // namespace

void linear_int8(const Tensor& x2, const Tensor& w, const Tensor& b, const Tensor& y2,
                 bool reference) {
  const int64_t N = x2.shape()[0], IN = x2.shape()[1], OUT = w.shape()[0];
  if (IN > kMaxIn)
    fail("linear: int8 precision sums " + std::to_string(IN) +
         " products per output, more than the " + std::to_string(kMaxIn) +
         " an int32 sum of u8 x s8 products holds without overflow");
  float* y = y2.data<float>();
  const QuantRows xq = quantize_activations(x2);
  if (reference) {
    constexpr uint64_t kPlainTag = 0x1a78;  // apart from layout_tag()'s tags (top bit set)
    const auto s = derived_copy(w, kPlainTag, [&] { return quantize_weights(w); });
    const QuantWeights q = view_quantized(*s, OUT);
    matmul_int8_reference(xq, q, y, N, IN, OUT);
    dequantize(xq, q, b, y, N, OUT);
    return;
  }
  const auto& c = int8_matmul(N, IN, OUT);
  const auto s = weights_for_kernel(w, c.weights_tag, c.mds[3], c.mds[1]);
  const QuantWeights q = view_quantized(*s, OUT);
  onednn::run(c, {{DNNL_ARG_SRC, c.mds[0], xq.data},
                  {DNNL_ARG_WEIGHTS, c.mds[1], q.data},
                  {DNNL_ARG_DST, c.mds[2], y}});
  dequantize(xq, q, b, y, N, OUT);
}

uint64_t int8_weight_copies() { return copies_made.load(); }

}  // namespace graft::kern
