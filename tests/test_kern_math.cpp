// The vectorisable float math of ops/custom.h (issue 48): kern::exp, log, tanh and sigmoid, as
// inline functions and as the library's array forms, against std:: in float64 over a wide range
// (tiny, denormal, large, and +-0, +-inf, NaN), in ulps of the float result.
#include <bit>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "graft/ops/custom.h"

using namespace graft;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Every float from -hi to hi whose magnitude is a power of 2 times (1 + k/64), plus the specials:
// about 30 000 values spread over all exponents (subnormals included).
std::vector<float> wide_inputs(float hi) {
  std::vector<float> v = {0.0f, -0.0f, kInf, -kInf, kNaN, 1e-45f, -1e-45f, 1.17549435e-38f};
  for (int e = -149; e < 128; ++e)
    for (int k = 0; k < 64; k += 1) {
      const float x = std::ldexp(1.0f + k / 64.0f, e);
      if (!std::isfinite(x) || x > hi) continue;
      v.push_back(x);
      v.push_back(-x);
    }
  return v;
}

// The distance between float a and the float64 value want, in units of the float spacing at
// want (1 ulp = the gap between two floats there); 0 when both are NaN or the same infinity.
double ulps(float a, double want) {
  if (std::isnan(want) || std::isnan(a)) return std::isnan(want) && std::isnan(a) ? 0 : 1e30;
  const float w = (float)want;  // inf where want overflows float
  if (std::isinf(w) || std::isinf(a)) return a == w ? 0 : 1e30;
  const double gap = std::nextafter(std::fabs(w), kInf) - std::fabs(w);
  return std::fabs((double)a - want) / gap;
}

struct Worst {
  double ulps = 0;
  float at = 0;
};

// f(x) against ref(x) for every x in xs, ignoring results below `floor` in magnitude (where the
// helpers flush or clamp, see custom.h) as long as the error stays below floor too.
Worst worst(const std::vector<float>& xs, const std::function<float(float)>& f,
            const std::function<double(double)>& ref, double floor) {
  Worst w;
  for (float x : xs) {
    const double want = ref(x);
    const float got = f(x);
    if (std::fabs(want) < floor && std::fabs((double)got - want) < floor) continue;
    const double u = ulps(got, want);
    if (u > w.ulps) w = {u, x};
  }
  return w;
}

// The inline function and the array form agree exactly, and each is within max_ulps of ref.
void check(const char* name, float (*f)(float), void (*arr)(const float*, float*, int64_t),
           const std::function<double(double)>& ref, double max_ulps, float hi, double floor) {
  const std::vector<float> xs = wide_inputs(hi);
  const Worst w = worst(xs, f, ref, floor);
  BOOST_TEST_MESSAGE(name << ": worst " << w.ulps << " ulp at " << w.at);
  BOOST_CHECK_MESSAGE(w.ulps <= max_ulps, name << ": " << w.ulps << " ulp at x = " << w.at
                                               << " (bound " << max_ulps << ")");
  std::vector<float> y(xs.size());
  arr(xs.data(), y.data(), (int64_t)xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const float one = f(xs[i]);
    BOOST_CHECK_MESSAGE(std::bit_cast<uint32_t>(y[i]) == std::bit_cast<uint32_t>(one) ||
                            (std::isnan(y[i]) && std::isnan(one)),
                        name << " array form at x = " << xs[i] << ": " << y[i] << " vs " << one);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(exp_within_2_ulp_of_std) {
  // Below -87 kern::exp gives e^-87 = 1.6e-38 instead of a subnormal (documented).
  check(
      "exp", [](float x) { return kern::exp(x); }, kern::exp, [](double x) { return std::exp(x); },
      2.0, kInf, 2e-38);
  BOOST_TEST(kern::exp(kInf) == kInf);
  BOOST_TEST(kern::exp(-kInf) < 2e-38f);
  BOOST_TEST(std::isnan(kern::exp(kNaN)));
}

BOOST_AUTO_TEST_CASE(log_within_2_ulp_of_std) {
  check(
      "log", [](float x) { return kern::log(x); }, kern::log, [](double x) { return std::log(x); },
      2.0, kInf, 0.0);
  BOOST_TEST(kern::log(0.0f) == -kInf);
  BOOST_TEST(kern::log(-0.0f) == -kInf);
  BOOST_TEST(std::isnan(kern::log(-1.0f)));
  BOOST_TEST(std::isnan(kern::log(-kInf)));
  BOOST_TEST(kern::log(kInf) == kInf);
  BOOST_TEST(std::isnan(kern::log(kNaN)));
  BOOST_TEST(kern::log(1.0f) == 0.0f);
}

BOOST_AUTO_TEST_CASE(tanh_within_3_ulp_of_std) {
  check(
      "tanh", [](float x) { return kern::tanh(x); }, kern::tanh,
      [](double x) { return std::tanh(x); }, 3.0, kInf, 0.0);
  BOOST_TEST(kern::tanh(kInf) == 1.0f);
  BOOST_TEST(kern::tanh(-kInf) == -1.0f);
  BOOST_TEST(std::isnan(kern::tanh(kNaN)));
  BOOST_TEST(std::signbit(kern::tanh(-0.0f)));
}

BOOST_AUTO_TEST_CASE(sigmoid_within_3_ulp_of_the_float64_formula) {
  check(
      "sigmoid", [](float x) { return kern::sigmoid(x); }, kern::sigmoid,
      [](double x) { return 1 / (1 + std::exp(-x)); }, 3.0, kInf, 2e-38);
  BOOST_TEST(kern::sigmoid(kInf) == 1.0f);
  BOOST_TEST(kern::sigmoid(-kInf) == 0.0f);
  BOOST_TEST(std::isnan(kern::sigmoid(kNaN)));
}

BOOST_AUTO_TEST_CASE(double_forms_are_the_std_references) {
  const std::vector<double> x = {-700, -3.5, -1e-300, 0, 1e-300, 0.25, 2, 700};
  std::vector<double> y(x.size());
  kern::exp(x.data(), y.data(), (int64_t)x.size());
  for (size_t i = 0; i < x.size(); ++i) BOOST_TEST(y[i] == std::exp(x[i]));
  kern::tanh(x.data(), y.data(), (int64_t)x.size());
  for (size_t i = 0; i < x.size(); ++i) BOOST_TEST(y[i] == std::tanh(x[i]));
  kern::sigmoid(x.data(), y.data(), (int64_t)x.size());
  for (size_t i = 0; i < x.size(); ++i) BOOST_TEST(y[i] == 1 / (1 + std::exp(-x[i])));
  const std::vector<double> p = {1e-310, 1e-5, 1, 3, 1e300};
  kern::log(p.data(), y.data(), (int64_t)p.size());
  for (size_t i = 0; i < p.size(); ++i) BOOST_TEST(y[i] == std::log(p[i]));
}
