/// @file
/// Helpers for ops written outside the library (and used by the library's own ops): float math
/// that vectorises, the parallel loop over index ranges, strided iteration, the float checks
/// that make the library's error messages, and a matmul into a given buffer. No oneDNN here.
///
/// The float overloads of kern::exp, kern::log, kern::tanh, kern::sigmoid, kern::sin and
/// kern::cos are branch-free polynomials, so a loop calling them vectorises (glibc's expf/sinf do
/// not without -ffast-math); the double overloads call std:: (the float64 reference). The array
/// forms kern::exp(x, y, n) and friends are compiled into the library, vectorised whatever the
/// caller's flags. A unary op written as
/// a table row with unary_row() (ops/elementwise.h) uses them for its float32 loop, which the
/// compiler vectorises at -O3, or at any level under -fopenmp (GRAFT_SIMD).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "graft/autograd/tensor.h"

// GRAFT_OMP(omp parallel for ...) is that OpenMP pragma where the code is compiled with OpenMP
// and nothing elsewhere; GRAFT_SIMD before a loop asks for it to be vectorised (`omp simd` with
// OpenMP, `GCC ivdep` or clang's `loop vectorize(enable)` without). Either way a header using
// them gives no unknown-pragma warning to a program built without OpenMP.
#ifdef _OPENMP
/// The OpenMP pragma given as the argument (compiled with OpenMP).
#define GRAFT_OMP(...) _Pragma(#__VA_ARGS__)
/// Before a loop: vectorise it (`omp simd`).
#define GRAFT_SIMD _Pragma("omp simd")
#else
/// Nothing (compiled without OpenMP: the loop runs on the calling thread).
#define GRAFT_OMP(...)
#if defined(__clang__)
/// Before a loop: vectorise it (clang's `loop vectorize(enable)`).
#define GRAFT_SIMD _Pragma("clang loop vectorize(enable)")
#elif defined(__GNUC__)
/// Before a loop: vectorise it, its iterations being independent (`GCC ivdep`).
#define GRAFT_SIMD _Pragma("GCC ivdep")
#else
/// Nothing (a compiler without a known vectorisation pragma).
#define GRAFT_SIMD
#endif
#endif

namespace graft::kern {

// ---- vectorisable float math --------------------------------------------------------------------

/// The rounding constant 1.5 * 2^23: for |v| < 2^22, (v + kRound) - kRound is v rounded to an
/// integer, and the bits of v + kRound minus those of kRound are that integer, with no
/// float-to-int conversion (which is undefined for NaN and huge values).
constexpr float kRound = 12582912.0f;
/// The integer that v + kRound holds (see kRound): any bits for NaN or |v| >= 2^22, never UB.
inline int32_t rounded_bits(float v_plus_round) {
  return (int32_t)(std::bit_cast<uint32_t>(v_plus_round) - std::bit_cast<uint32_t>(kRound));
}

/// p * 2^n for n in [-126, 128] (2^128 gives inf), by two exponent fields so that neither
/// overflows; other n give some float, without undefined behaviour.
inline float scale_pow2(float p, int32_t n) {
  const uint32_t h = (uint32_t)(n >> 1);  // n / 2 rounded down
  const uint32_t e1 = (h + 127u) & 0xFFu, e2 = ((uint32_t)n - h + 127u) & 0xFFu;
  return p * std::bit_cast<float>(e1 << 23) * std::bit_cast<float>(e2 << 23);
}

/// e^x for x already in [-87, 89]: e^x = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2, e^r by
/// its degree-7 Taylor polynomial (at most 1.25 ulp from the correctly rounded e^x on
/// [-87, 0.5], a few ulp up to 88; measured).
inline float exp_in_range(float x) {
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  float r = x - n * 0.693145751953125f;  // ln 2 split in two so n * ln2_hi is exact
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return scale_pow2(p, rounded_bits(t));
}

/// e^x in float without a libm call (exp_in_range), so loops calling it vectorise. x is
/// clamped to [-87, 89]: below -87 it gives e^-87 = 1.6e-38 rather than a denormal or 0, from 89
/// on inf; NaN gives NaN.
inline float exp(float x) { return exp_in_range(std::min(std::max(x, -87.0f), 89.0f)); }
/// The float64 reference of exp(float): std::exp.
inline double exp(double x) { return std::exp(x); }

/// sin and cos of r in [-pi/4, pi/4] by their Taylor polynomials to degree 9 and 10 (error
/// below 4e-10, far under float's rounding).
///@{
inline float sin_small(float r) {
  const float r2 = r * r;
  float p = 1.0f / 362880;
  p = p * r2 - 1.0f / 5040;
  p = p * r2 + 1.0f / 120;
  p = p * r2 - 1.0f / 6;
  return r + r * r2 * p;
}
inline float cos_small(float r) {
  const float r2 = r * r;
  float p = -1.0f / 3628800;
  p = p * r2 + 1.0f / 40320;
  p = p * r2 - 1.0f / 720;
  p = p * r2 + 1.0f / 24;
  p = p * r2 - 0.5f;
  return 1.0f + r2 * p;
}
///@}

/// sin(x + q pi/2) from x = r + k pi/2, k = round(x / (pi/2)) (pi/2 in three parts, so r is
/// accurate for |x| up to about 10^5 (error < 2e-6 measured to 10^4); beyond that the result
/// loses digits, and from |x| = 2^22 on it is some value in [-1, 1], not sin x), picking +-sin or
/// +-cos of r by (k + q) mod 4 without branches. NaN and inf give NaN.
inline float sin_quadrant(float x, int32_t q) {
  const float t = x * 0.636619772367581343f + kRound;
  const float k = t - kRound;
  float r = x - k * 1.5703125f;  // pi/2 in three parts, the first two exact in float
  r = r - k * 4.837512969970703125e-4f;
  r = r - k * 7.549790126404332e-8f;
  const int32_t m = (rounded_bits(t) + q) & 3;
  const float s = sin_small(r), c = cos_small(r);
  const float v = (m & 1) ? c : s;
  return std::min(std::max((m & 2) ? -v : v, -1.0f), 1.0f);  // bounded where r is meaningless
}
/// sin x in float without a libm call (see sin_quadrant for the range where it is accurate).
inline float sin(float x) { return sin_quadrant(x, 0); }
/// cos x = sin(x + pi/2) in float without a libm call.
inline float cos(float x) { return sin_quadrant(x, 1); }
/// The float64 references: std::sin and std::cos.
///@{
inline double sin(double x) { return std::sin(x); }
inline double cos(double x) { return std::cos(x); }
///@}

/// The float bits of an int32 pattern and back (the special values below are selected by bits).
///@{
inline float float_bits(int32_t i) { return std::bit_cast<float>(i); }
inline int32_t bits_of(float x) { return std::bit_cast<int32_t>(x); }
///@}

/// ln x in float without a libm call, so loops calling it vectorise: x = m 2^e with m in
/// [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172, by its odd series
/// to s^9 (truncation below 4e-10), and e ln 2 in two parts. Denormals are scaled first. Within
/// 2 ulp of std::log (measured, tests/test_kern_math.cpp); 0 gives -inf, a negative x NaN, inf
/// inf, NaN NaN.
inline float log(float x) {
  // Every choice is an integer compare on the bits and a select, computed unconditionally: float
  // compares made GCC branch around the work and leave the loop scalar.
  const int32_t xb = bits_of(x), mag = xb & 0x7FFFFFFF;
  const bool tiny = xb < 0x00800000;  // subnormal, 0 or negative: scale by 2^23 (sign kept)
  const int32_t b = bits_of(x * (tiny ? 8388608.0f : 1.0f));
  const int32_t mb = (b & 0x007FFFFF) | 0x3F800000;  // m in [1, 2)
  const bool above = mb > 0x3FB504F3;                // m > sqrt(2): halve it
  const float m = float_bits(above ? mb - 0x00800000 : mb);
  const float e = (float)(((b >> 23) & 0xFF) - 127 + (above ? 1 : 0) - (tiny ? 23 : 0));
  const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  float p = 2.0f / 9;
  p = p * s2 + 2.0f / 7;
  p = p * s2 + 2.0f / 5;
  p = p * s2 + 2.0f / 3;
  p = p * s2 + 2.0f;
  int32_t r = bits_of(e * 0.693145751953125f + (s * p + e * 1.428606765330187e-06f));
  r = mag == 0 ? int32_t(0xFF800000) : r;        // +-0: -inf
  r = xb < 0 && mag != 0 ? 0x7FC00000 : r;       // negative: NaN
  r = xb == 0x7F800000 ? xb : r;                 // +inf: +inf
  return float_bits(mag > 0x7F800000 ? xb : r);  // NaN: itself
}
/// The float64 reference of log(float): std::log.
inline double log(double x) { return std::log(x); }

/// tanh x in float without a libm call: for |x| < 0.4 its odd Taylor series to x^15 (truncation
/// below 1e-9 relative), beyond 1 - 2 / (e^{2|x|} + 1) with kern::exp, the sign copied back.
/// Within 3 ulp of std::tanh (1.4 measured, tests/test_kern_math.cpp); +-inf give +-1, NaN NaN.
inline float tanh(float x) {
  const float a = std::fabs(x), x2 = a * a;
  float p = -929569.0f / 638512875;
  p = p * x2 + 21844.0f / 6081075;
  p = p * x2 - 1382.0f / 155925;
  p = p * x2 + 62.0f / 2835;
  p = p * x2 - 17.0f / 315;
  p = p * x2 + 2.0f / 15;
  p = p * x2 - 1.0f / 3;
  const float small = a + a * x2 * p;
  const float large = 1.0f - 2.0f / (exp(2.0f * a) + 1.0f);
  return std::copysign(bits_of(a) < 0x3ECCCCCD ? small : large, x);  // |x| < 0.4f by its bits
}
/// The float64 reference of tanh(float): std::tanh.
inline double tanh(double x) { return std::tanh(x); }

/// The logistic sigmoid 1 / (1 + e^-x) in float with kern::exp: within 3 ulp of the float64
/// formula (2 measured) where it is above 2e-38; below x = -87 it is 0 or under 2e-38; NaN gives
/// NaN.
inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
/// The float64 reference: 1 / (1 + std::exp(-x)).
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// y[i] = f(x[i]) for i < n, f one of exp, log, tanh, sigmoid above, compiled into the library
/// (ops/kern_math.cpp) with OpenMP SIMD: the float loops vectorise whatever flags the calling
/// code is built with (-O2, no -fopenmp, no -march), which the inline functions called in the
/// caller's own loop do not promise. The double versions call std:: per element (the float64
/// reference; glibc's are not vectorised). x and y may be the same array; no threads are started
/// (call them on kern::parallel_for's chunks).
///@{
void exp(const float* x, float* y, int64_t n);
void exp(const double* x, double* y, int64_t n);
void log(const float* x, float* y, int64_t n);
void log(const double* x, double* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
void tanh(const double* x, double* y, int64_t n);
void sigmoid(const float* x, float* y, int64_t n);
void sigmoid(const double* x, double* y, int64_t n);
///@}

// ---- parallel loops -----------------------------------------------------------------------------

/// Work (in elements) below which a loop runs on one thread: forking costs more than it saves.
constexpr int64_t kParallelGrain = 1 << 15;

/// Calls body(begin, end) on consecutive chunks of [0, n), each exactly once, over the OpenMP
/// threads when n > grain (on the calling thread otherwise, or when the caller was compiled
/// without OpenMP). Chunks are `grain / 4` long, the last one shorter; which thread runs which
/// chunk is unspecified, so body must not depend on it.
template <class F>
void parallel_for(int64_t n, F&& body, int64_t grain = kParallelGrain) {
  if (n <= 0) return;
  const int64_t chunk = std::max<int64_t>(grain / 4, 1), chunks = (n + chunk - 1) / chunk;
  // Not `omp parallel for if (n > grain)` alone: with the if false libgomp still sets up a
  // one-thread team (0.4 us, more on a loaded machine), paid by each small op of a decoding step.
  if (n <= grain) {
    for (int64_t c = 0; c < chunks; ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
    return;
  }
  GRAFT_OMP(omp parallel for schedule(static))
  for (int64_t c = 0; c < chunks; ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
}

/// Calls f(out_index, offset_in_a, offset_in_b) for every element of a contiguous output of
/// shape `out`, reading a and b through (broadcast) strides sa and sb (kern::broadcast_strides).
/// Rows (the last dim) are split across OpenMP threads; each element is written by one thread.
template <class F>
void for_each_bcast2(const Shape& out, const Shape& sa, const Shape& sb, F&& f) {
  const int64_t n = shape_numel(out);
  if (n == 0) return;
  const int64_t r = (int64_t)out.size();
  if (r == 0) {
    f(int64_t(0), int64_t(0), int64_t(0));
    return;
  }
  const int64_t inner = out[r - 1], rows = n / inner;
  const int64_t ia = sa[r - 1], ib = sb[r - 1];
  auto one_row = [&](int64_t row) {
    int64_t rem = row, oa = 0, ob = 0;
    for (int64_t d = r - 2; d >= 0; --d) {
      const int64_t id = rem % out[d];
      rem /= out[d];
      oa += id * sa[d];
      ob += id * sb[d];
    }
    const int64_t base = row * inner;
    for (int64_t i = 0; i < inner; ++i) f(base + i, oa + i * ia, ob + i * ib);
  };
  if (n <= kParallelGrain) {  // no one-thread OpenMP team (see parallel_for)
    for (int64_t row = 0; row < rows; ++row) one_row(row);
    return;
  }
  GRAFT_OMP(omp parallel for schedule(static))
  for (int64_t row = 0; row < rows; ++row) one_row(row);
}

/// Calls f(out_index, offset) for every element of a tensor of `shape` read through strides sa
/// (a contiguous output indexed by out_index, the input by offset), in parallel by rows.
template <class F>
void for_each_strided(const Shape& shape, const Shape& sa, F&& f) {
  Shape zero(shape.size(), 0);
  for_each_bcast2(shape, sa, zero, [&](int64_t i, int64_t oa, int64_t) { f(i, oa); });
}

// ---- tensors ------------------------------------------------------------------------------------

/// Result shape of broadcasting shapes a and b (NumPy rules).
/// @throws graft::Error "<op>: shapes .. and .. cannot be broadcast (dim i: x vs y)" otherwise.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
/// Strides that read t as if it had shape `out` (0 along broadcast dimensions).
/// @throws graft::Error when t is undefined.
Shape broadcast_strides(const Tensor& t, const Shape& out);
/// t itself when contiguous, else a contiguous copy (recording nothing). The copy is off the
/// tape: an op that saves it for its backward instead of t loses t's second derivative, which
/// backward under create_graph refuses (save t, or a recorded op of it, such as contiguous(t)).
/// @throws graft::Error when t is undefined.
inline Tensor contig(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = contiguous_copy(t);
  c.impl()->storage->copied_by = "kern::contig";
  return c;
}
/// The checks behind the library's error messages.
/// @throws graft::Error "<op>: expected a float tensor, got ..." when t is undefined or not
///         float; "<op>: dtype mismatch ..." when a and b differ in dtype.
///@{
void check_float(const char* op, const Tensor& t);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
///@}

/// out (B..., M, N) = alpha * a (B..., M, K) @ b (B..., K, N), or out += that with accumulate,
/// recording nothing: a matmul inside a custom op's forward or backward. a, b, out of equal
/// rank >= 2 and one float dtype (bf16 or f16 a and b may also write a float32 out); batch dims
/// of a and b equal out's or are 1; a and b any strides (transposes as views), out contiguous.
/// float32 runs oneDNN (bf16 operands under PrecisionGuard(bf16)), bf16 and f16 oneDNN's 16-bit
/// kernel with float32 sums where the CPU has one (half_kernel_available(), ops/precision.h) and
/// float32 on widened operands elsewhere, float64 a reference loop.
/// @throws graft::Error when a tensor is undefined, the dtypes differ or are not float, or the
///         shapes do not fit.
void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, double alpha = 1.0,
                 bool accumulate = false);

}  // namespace graft::kern
