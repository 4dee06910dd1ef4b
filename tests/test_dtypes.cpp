// The 16-bit storage dtypes (issue 49): bfloat16 and float16 conversions against an independent
// reference (the nearest of all 65536 bit patterns, found by search over their exact values, ties
// to the even pattern), over NaN, +-inf, +-0, subnormals, ties and overflow; from double with no
// double rounding; and the Tensor side: creation, cast_copy in every direction, item, to_vector,
// str, views and copies, accumulate_into and sum_axes.
#include <algorithm>
#include <bit>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "graft/autograd/tensor.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/shape.h"

using namespace graft;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Every finite non-negative value of a 16-bit format, with its bit pattern, sorted by value.
struct Finite {
  double value;
  uint16_t bits;
};
std::vector<Finite> finite_values(float (*to_float)(uint16_t)) {
  std::vector<Finite> v;
  for (uint32_t b = 0; b < 0x8000u; ++b) {
    const float f = to_float((uint16_t)b);
    if (std::isfinite(f)) v.push_back({(double)f, (uint16_t)b});
  }
  std::sort(v.begin(), v.end(), [](const Finite& a, const Finite& b) { return a.value < b.value; });
  return v;
}

// The reference rounding of x (finite or inf, not NaN): the nearest finite value by search, ties
// to the even bit pattern; beyond the largest finite value plus half its gap, inf (IEEE).
uint16_t reference_bits(double x, const std::vector<Finite>& fin, uint16_t inf_bits) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const Finite& top = fin.back();
  const double gap = top.value - fin[fin.size() - 2].value;
  if (a >= top.value + gap / 2) return sign | inf_bits;  // a tie there rounds to the even inf
  auto hi = std::lower_bound(fin.begin(), fin.end(), a,
                             [](const Finite& f, double v) { return f.value < v; });
  if (hi == fin.end()) return sign | top.bits;
  if (hi->value == a) return sign | hi->bits;
  auto lo = hi - 1;
  const double dl = a - lo->value, dh = hi->value - a;
  if (dl < dh) return sign | lo->bits;
  if (dh < dl) return sign | hi->bits;
  return sign | ((lo->bits & 1) ? hi->bits : lo->bits);
}

// Floats over every binade of both formats: powers of two times (1 + k/256), the exact midpoints
// between neighbouring 16-bit values and one float either side of each, and the specials.
std::vector<double> probe_values(const std::vector<Finite>& fin) {
  std::vector<double> v = {0.0,      1e-45, 1e-40, 5.9604644775390625e-8, 2.98e-8, 65504,
                           65519.99, 65520, 65536, 3.3895313892515355e38, 3.4e38};
  for (int e = -149; e < 128; ++e)
    for (int k = 0; k < 256; k += 3) v.push_back(std::ldexp(1.0 + k / 256.0, e));
  for (size_t i = 1; i < fin.size(); i += 7) {
    const float mid = (float)((fin[i - 1].value + fin[i].value) / 2);
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    v.push_back(std::nextafter(mid, kInf));
  }
  std::vector<double> out;
  for (double x : v)
    if (std::isfinite((float)x)) {
      out.push_back((float)x);
      out.push_back(-(float)x);
    }
  return out;
}

template <class H>
void check_float_rounding(float (*to_float)(uint16_t), uint16_t inf_bits) {
  const auto fin = finite_values(to_float);
  int bad = 0;
  for (double x : probe_values(fin)) {
    const uint16_t got = H((float)x).bits, want = reference_bits(x, fin, inf_bits);
    if (got != want && ++bad < 5) BOOST_ERROR("float " << x << ": got " << got << " want " << want);
  }
  BOOST_TEST(bad == 0);
  BOOST_TEST(H(kInf).bits == inf_bits);
  BOOST_TEST(H(-kInf).bits == (0x8000 | inf_bits));
  BOOST_TEST(std::isnan((float)H(std::numeric_limits<float>::quiet_NaN())));
  BOOST_TEST(std::isnan((float)H(-std::numeric_limits<float>::signaling_NaN())));
  BOOST_TEST(H(-0.0f).bits == 0x8000);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_pattern_round_trips) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bf = bfloat16::from_bits((uint16_t)b);
    const auto h = float16::from_bits((uint16_t)b);
    if (!std::isnan((float)bf)) BOOST_TEST_REQUIRE(bfloat16((float)bf).bits == b);
    else BOOST_TEST_REQUIRE(std::isnan((float)bfloat16((float)bf)));
    if (!std::isnan((float)h)) BOOST_TEST_REQUIRE(float16((float)h).bits == b);
    else BOOST_TEST_REQUIRE(std::isnan((float)float16((float)h)));
  }
}

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even) {
  check_float_rounding<bfloat16>(bf16_bits_to_float, 0x7F80);
  BOOST_TEST(bfloat16(1.00390625f).bits == 0x3F80);  // tie between 1 and 1 + 2^-7: even (1)
  BOOST_TEST(bfloat16(1.01171875f).bits == 0x3F82);  // tie between 1 + 2^-7 and 1 + 2^-6: even
}

BOOST_AUTO_TEST_CASE(f16_rounds_to_nearest_even) {
  check_float_rounding<float16>(f16_bits_to_float, 0x7C00);
  BOOST_TEST(float16(65504.0f).bits == 0x7BFF);
  BOOST_TEST(float16(65519.0f).bits == 0x7BFF);
  BOOST_TEST(float16(65520.0f).bits == 0x7C00);                 // the tie above max: inf
  BOOST_TEST(float16(5.9604644775390625e-8f).bits == 0x0001);   // 2^-24, the least subnormal
  BOOST_TEST(float16(2.98023223876953125e-8f).bits == 0x0000);  // 2^-25: tie, even is 0
  BOOST_TEST(float16(2.98023259e-8f).bits == 0x0001);           // just above the tie
  BOOST_TEST(float16(6.103515625e-05f).bits == 0x0400);         // 2^-14, the least normal
}

BOOST_AUTO_TEST_CASE(from_double_rounds_once) {
  // 1 + 2^-8 + 2^-40: above bf16's tie at 1 + 2^-8, but a float rounds it down to the tie, which
  // then rounds to even (1): a double rounding. One rounding gives 1 + 2^-7.
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  BOOST_TEST(bfloat16(x).bits == 0x3F81);
  BOOST_TEST(bfloat16((float)x).bits == 0x3F80);
  const double y = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);  // f16's tie, likewise
  BOOST_TEST(float16(y).bits == 0x3C01);
  BOOST_TEST(float16(1e300).bits == 0x7C00);
  BOOST_TEST(bfloat16(-1e300).bits == 0xFF80);
  BOOST_TEST(bfloat16(1e-300).bits == 0x0000);
  BOOST_TEST(std::isnan((float)bfloat16(std::nan(""))));
}

BOOST_AUTO_TEST_CASE(tensors_of_every_dtype_convert) {
  const std::vector<double> vals = {1.0, -2.5, 0.1, 65504.0, 1e-6, -0.0};
  for (DType a : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (DType b : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      if (is_half(a) && is_half(b) && a != b) continue;  // neither holds the other's values
      const Tensor x = from_vector(vals, {2, 3}, a);
      const Tensor y = cast_copy(cast_copy(x, b), a);
      BOOST_TEST((y.dtype() == a));
      // Through a narrower dtype the values are those of the narrower one.
      const DType narrow = dtype_size(b) < dtype_size(a) ? b : a;
      const auto want = from_vector(vals, {2, 3}, narrow).to_vector<double>();
      BOOST_TEST(y.to_vector<double>() == want,
                 "cast " << dtype_name(a) << " -> " << dtype_name(b));
    }
}

BOOST_AUTO_TEST_CASE(half_tensors_behave_as_tensors) {
  const Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::bf16);
  BOOST_TEST(dtype_size(DType::bf16) == 2u);
  BOOST_TEST(x.raw() != nullptr);
  BOOST_TEST(x.str() == "Tensor bf16 (2, 3) [1, 2, 3, 4, 5, 6]");
  const Tensor t = Tensor::view_of(x, {3, 2}, {1, 3}, 0);  // the transpose
  BOOST_TEST(contiguous_copy(t).to_vector<float>() == (std::vector<float>{1, 4, 2, 5, 3, 6}));
  BOOST_TEST(Tensor::view_of(x, {1}, {1}, 5).item() == 6.0);
  BOOST_TEST(sum_axes(x, {1}).to_vector<double>() == (std::vector<double>{6, 15}));
  BOOST_TEST((sum_axes(x, {1}).dtype() == DType::bf16));
  const Tensor acc = full({2}, 256.0, DType::bf16);
  accumulate_into(acc, full({2}, 1.0, DType::bf16));  // 257 is a tie: even gives 256
  BOOST_TEST(acc.to_vector<double>() == (std::vector<double>{256, 256}));
  accumulate_into(acc, full({2}, 3.0, DType::bf16));
  BOOST_TEST(acc.to_vector<double>() == (std::vector<double>{260, 260}));
  BOOST_TEST(full({1}, 70000.0, DType::f16).item() == std::numeric_limits<double>::infinity());
  BOOST_TEST((parse_dtype("bf16", "--dtype") == DType::bf16));
  BOOST_TEST((parse_dtype("float16", "--dtype") == DType::f16));
  BOOST_CHECK_EXCEPTION(parse_dtype("half", "--dtype"), Error, [](const Error& e) {
    return std::string(e.what()).find("--dtype: unknown dtype 'half'") == 0;
  });
  Tensor p = zeros({3}, DType::f16);
  p.requires_grad_();
  BOOST_TEST(p.requires_grad());
}

// int8 (issue 49, safetensors I8): a 1-byte storage type that holds -128..127 exactly, converts
// to and from every dtype, prints, and never requires grad; values outside its range (and NaN)
// are errors, never a wrap or undefined behaviour.
BOOST_AUTO_TEST_CASE(int8_stores_converts_and_refuses_what_it_cannot_hold) {
  BOOST_TEST(dtype_size(DType::i8) == 1u);
  BOOST_TEST(std::string(dtype_name(DType::i8)) == "int8");
  BOOST_TEST(!is_floating(DType::i8));
  BOOST_TEST(!is_half(DType::i8));
  BOOST_TEST((parse_dtype("i8", "--dtype") == DType::i8));
  BOOST_TEST((parse_dtype("int8", "--dtype") == DType::i8));
  const std::vector<int64_t> vals = {-128, -1, 0, 1, 127, 42};
  const Tensor x = from_vector(vals, {2, 3}, DType::i8);
  BOOST_TEST(x.data<int8_t>()[0] == -128);
  BOOST_TEST(x.to_vector<int64_t>() == vals);
  BOOST_TEST(x.str() == "Tensor i8 (2, 3) [-128, -1, 0, 1, 127, 42]");
  BOOST_TEST(Tensor::view_of(x, {1}, {1}, 4).item() == 127.0);
  for (DType d : {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16}) {
    const Tensor y = cast_copy(x, d);  // every int8 value is exact in every other dtype
    BOOST_TEST(y.to_vector<int64_t>() == vals, "int8 -> " << dtype_name(d));
    BOOST_TEST(cast_copy(y, DType::i8).to_vector<int64_t>() == vals, dtype_name(d) << " -> int8");
  }
  const Tensor t = Tensor::view_of(x, {3, 2}, {1, 3}, 0);  // the transpose
  BOOST_TEST(contiguous_copy(t).to_vector<int64_t>() ==
             (std::vector<int64_t>{-128, 1, -1, 127, 0, 42}));
  BOOST_TEST(cast_copy(full({1}, -2.75), DType::i8).item() == -2.0);  // truncates, as C++ and torch
  auto refused = [](const std::function<void()>& f, const std::string& part) {
    BOOST_CHECK_EXCEPTION(f(), Error, [&](const Error& e) {
      return std::string(e.what()).find(part) != std::string::npos;
    });
  };
  refused([] { cast_copy(full({2}, 128.0), DType::i8); }, "128.000000 does not fit an int8 tensor");
  refused([] { cast_copy(full({1}, -129.0, DType::f64), DType::i8); }, "does not fit an int8");
  refused([] { cast_copy(full({1}, std::nan(""), DType::bf16), DType::i8); },
          "does not fit an int8");
  refused([] { cast_copy(full({1}, 300.0, DType::i64), DType::i8); }, "copy_into (to int8): 300");
  refused([] { full({1}, 200.0, DType::i8); }, "fill_: 200");
  refused([] { arange(0.0, 200.0, 1.0, DType::i8); }, "fill: 128");
  refused([] { Tensor::empty({2}, DType::i8).requires_grad_(); }, "only float tensors");
  refused([] { (void)Tensor::empty({2}, DType::i8).data<int64_t>(); }, "tensor is int8");
  BOOST_TEST(zeros({3}, DType::i8).to_vector<int64_t>() == (std::vector<int64_t>{0, 0, 0}));
}

// The shape ops move int8 elements as they move any other; an int8 mask selects as any other (it
// once fell through the mask's dtype switch to all zeros).
BOOST_AUTO_TEST_CASE(int8_masks_select_and_shape_ops_move_int8) {
  const Tensor mask = from_vector(std::vector<int64_t>{1, 0, -3}, {3}, DType::i8);
  const Tensor a = full({3}, 1.0), b = full({3}, 2.0);
  BOOST_TEST(where(mask, a, b).to_vector<double>() == (std::vector<double>{1, 2, 1}));
  BOOST_TEST(masked_fill(b, mask, 5.0).to_vector<double>() == (std::vector<double>{5, 2, 5}));
  const Tensor x = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::i8);
  const Tensor t = contiguous(transpose(x, 0, 1));
  BOOST_TEST((t.dtype() == DType::i8));
  BOOST_TEST(t.to_vector<int64_t>() == (std::vector<int64_t>{1, 4, 2, 5, 3, 6}));
  BOOST_TEST(concat({x, x}, 0).to_vector<int64_t>()[7] == 2);
}
