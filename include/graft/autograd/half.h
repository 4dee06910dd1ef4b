/// @file
/// The two 16-bit float storage types: bfloat16 (8 exponent bits, 7 mantissa bits: float32's
/// range at 3 significant digits) and float16 (IEEE binary16: 5 exponent bits, 10 mantissa bits,
/// largest finite 65504). Both hold only the bits; arithmetic happens in float32. Every
/// conversion into them rounds to nearest, ties to even (from double too: double -> float by
/// round-to-odd first, so no double rounding); a NaN stays a quiet NaN, overflow gives inf, and
/// float16's subnormals (down to 2^-24) are kept.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace graft {

/// float -> bfloat16 bits, round to nearest even; NaN stays (quiet) NaN, overflow gives inf.
inline uint16_t bf16_bits_of(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
/// bfloat16 bits -> float (exact).
inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>((uint32_t)b << 16); }

/// float -> float16 bits, round to nearest even; NaN stays (quiet) NaN, |f| >= 65520 gives inf,
/// values below 2^-14 become float16 subnormals (or a signed zero).
inline uint16_t f16_bits_of(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // 65520 and up round to inf
  if (a >= 0x38800000u) {                                   // normal: rebias 127 -> 15
    const uint32_t r = a - (112u << 23);
    return (uint16_t)(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal: |f| in units of 2^-24 (exact: a power-of-two scaling), rounded to nearest even.
  const float units = std::bit_cast<float>(a) * 16777216.0f;
  return (uint16_t)(sign | (uint16_t)std::nearbyint(units));
}
/// float16 bits -> float (exact).
inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    const float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

/// double -> float rounded to odd (truncate, then set the last bit when inexact): rounding that
/// float to a narrower format (bf16, f16) then equals rounding the double directly.
inline float round_to_odd_float(double d) {
  float f = (float)d;
  if (std::isnan(d) || (double)f == d) return f;
  if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

/// A bfloat16 value: the top 16 bits of a float32. Converts to and from float and double.
struct bfloat16 {
  uint16_t bits = 0;  ///< the stored bit pattern
  bfloat16() = default;
  /// f rounded to nearest even.
  bfloat16(float f) : bits(bf16_bits_of(f)) {}  // NOLINT: converts like a float
  /// d rounded to nearest even (one rounding).
  bfloat16(double d) : bits(bf16_bits_of(round_to_odd_float(d))) {}  // NOLINT
  /// The value of an integer (ids, counts), rounded once.
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  bfloat16(I v) : bfloat16((double)v) {}  // NOLINT
  /// The value as a float (exact).
  operator float() const { return bf16_bits_to_float(bits); }  // NOLINT: exact
  /// A value from its bit pattern.
  static bfloat16 from_bits(uint16_t b) {
    bfloat16 v;
    v.bits = b;
    return v;
  }
};

/// An IEEE binary16 value. Converts to and from float and double.
struct float16 {
  uint16_t bits = 0;  ///< the stored bit pattern
  float16() = default;
  /// f rounded to nearest even.
  float16(float f) : bits(f16_bits_of(f)) {}  // NOLINT: converts like a float
  /// d rounded to nearest even (one rounding).
  float16(double d) : bits(f16_bits_of(round_to_odd_float(d))) {}  // NOLINT
  /// The value of an integer (ids, counts), rounded once.
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  float16(I v) : float16((double)v) {}  // NOLINT
  /// The value as a float (exact).
  operator float() const { return f16_bits_to_float(bits); }  // NOLINT: exact
  /// A value from its bit pattern.
  static float16 from_bits(uint16_t b) {
    float16 v;
    v.bits = b;
    return v;
  }
};

/// Converts n bfloat16 values to float (a loop the compiler vectorises).
void to_float(const bfloat16* x, float* y, int64_t n);
/// Converts n float16 values to float.
void to_float(const float16* x, float* y, int64_t n);
/// Converts n floats to bfloat16, round to nearest even.
void from_float(const float* x, bfloat16* y, int64_t n);
/// Converts n floats to float16, round to nearest even.
void from_float(const float* x, float16* y, int64_t n);

}  // namespace graft
