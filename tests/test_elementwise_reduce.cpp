// Forward values and misuse errors of the elementwise and reduce families (their gradients, and
// the bad inputs of the ops that have gradcheck cases, are covered by test_gradcheck_all).
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "graft/ops/ops.h"

using namespace graft;

namespace {
bool names(const Error& e, std::initializer_list<const char*> parts) {
  const std::string m = e.what();
  for (auto p : parts)
    if (m.find(p) == std::string::npos) {
      BOOST_TEST_MESSAGE("message: " << m);
      return false;
    }
  return true;
}
Tensor vec(std::vector<double> v, Shape s, DType dt = DType::f32) { return from_vector(v, s, dt); }
}  // namespace

BOOST_AUTO_TEST_SUITE(elementwise_reduce)

BOOST_AUTO_TEST_CASE(broadcast_values_in_both_precisions) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3}, dt), b = vec({10, 20, 30}, {3}, dt),
           c = vec({2, 4}, {2, 1}, dt);
    BOOST_TEST(add(a, b).to_vector<double>() == (std::vector<double>{11, 22, 33, 14, 25, 36}));
    BOOST_TEST(add(b, a).to_vector<double>() == (std::vector<double>{11, 22, 33, 14, 25, 36}));
    BOOST_TEST(sub(b, a).to_vector<double>() == (std::vector<double>{9, 18, 27, 6, 15, 24}));
    BOOST_TEST(mul(a, c).to_vector<double>() == (std::vector<double>{2, 4, 6, 16, 20, 24}));
    BOOST_TEST(div(a, c).to_vector<double>() == (std::vector<double>{0.5, 1, 1.5, 1, 1.25, 1.5}));
    BOOST_TEST((2.0 - a * 0.5).to_vector<double>() ==
               (std::vector<double>{1.5, 1, 0.5, 0, -0.5, -1}));
    BOOST_TEST(relu(a - 3.5).to_vector<double>() == (std::vector<double>{0, 0, 0, 0.5, 1.5, 2.5}));
    auto g = gelu(vec({1.0}, {1}, dt)).item();
    BOOST_TEST(std::fabs(g - 0.8413447460685429) < 1e-6);
    auto gt = gelu(vec({1.0}, {1}, dt), true).item();
    BOOST_TEST(std::fabs(gt - 0.8411919906082768) < 1e-6);
    BOOST_TEST(std::fabs(pow(vec({4.0}, {1}, dt), 1.5).item() - 8.0) < 1e-5);
    Tensor w = where(vec({1, 0, 1}, {3}), a, vec({-1}, {1}, dt));
    BOOST_TEST(w.to_vector<double>() == (std::vector<double>{1, -1, 3, 4, -1, 6}));
    Tensor m = masked_fill(a, from_vector(std::vector<int64_t>{0, 1}, {2, 1}, DType::i64), -9);
    BOOST_TEST(m.to_vector<double>() == (std::vector<double>{1, 2, 3, -9, -9, -9}));
  }
}

// argmax: the first maximal element along the axis; NaN counts as maximal (PyTorch). argmax has
// no gradient, hence no gradcheck case to carry its error inputs: its misuse is checked here.
BOOST_AUTO_TEST_CASE(argmax_values) {
  const double nan = std::nan("");
  Tensor x = from_vector(std::vector<double>{1, 3, 3, 2, 7, nan, 5, 0}, {2, 4});
  BOOST_TEST(argmax(x, 1).to_vector<int64_t>() == (std::vector<int64_t>{1, 1}));
  BOOST_TEST(argmax(x, 0).to_vector<int64_t>() == (std::vector<int64_t>{1, 1, 1, 0}));
  BOOST_TEST(argmax(x, 0).shape() == (Shape{4}));
  BOOST_CHECK_EXCEPTION(argmax(zeros({2, 0}), 1), Error, [](const Error& e) {
    return names(e, {"argmax", "empty"});
  });
  BOOST_CHECK_EXCEPTION(argmax(ones({2, 3}), 2), Error, [](const Error& e) {
    return names(e, {"argmax", "axis 2", "rank 2"});
  });
}

BOOST_AUTO_TEST_CASE(reduce_values) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3}, dt);
    BOOST_TEST(sum(a).item() == 21.0);
    BOOST_TEST(sum(a, {0}).to_vector<double>() == (std::vector<double>{5, 7, 9}));
    BOOST_TEST(sum(a, {-1}, true).shape() == (Shape{2, 1}));
    BOOST_TEST(mean(a, {1}).to_vector<double>() == (std::vector<double>{2, 5}));
    BOOST_TEST(max(a, 0).to_vector<double>() == (std::vector<double>{4, 5, 6}));
    BOOST_TEST(std::fabs(var(a, {1}).to_vector<double>()[0] - 1.0) < 1e-6);  // unbiased
    BOOST_TEST(std::fabs(var(a, {1}, false, 0).to_vector<double>()[0] - 2.0 / 3) < 1e-6);  // biased
    BOOST_TEST(sum(transpose(a, 0, 1), {1}).to_vector<double>() == (std::vector<double>{5, 7, 9}));
    BOOST_TEST(sum_to(ones({4, 2, 3}, dt), {2, 1}).to_vector<double>() ==
               (std::vector<double>{12, 12}));
    Tensor big = ones({3, 1000, 7}, dt);
    BOOST_TEST(sum(big, {0, 2}).to_vector<double>() == std::vector<double>(1000, 21.0));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(elementwise_rows)

// silu, abs, clamp, sin, cos, maximum, minimum and the scalar overloads: values in both
// precisions (float32 through oneDNN swish and abs, the rows' vectorised loops for the rest).
BOOST_AUTO_TEST_CASE(new_op_values_in_both_precisions) {
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f32 ? 1e-6 : 1e-12;
    const std::vector<double> xs{-3.5, -1, -0.25, 0, 0.5, 2, 7};
    Tensor x = vec(xs, {7}, dt);
    const auto si = silu(x).to_vector<double>(), ab = abs(x).to_vector<double>(),
               cl = clamp(x, -1, 0.5).to_vector<double>(), s = sin(x).to_vector<double>(),
               c = cos(x).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      BOOST_TEST(std::fabs(si[i] - xs[i] / (1 + std::exp(-xs[i]))) < tol * 8);
      BOOST_TEST(ab[i] == std::fabs(xs[i]));
      BOOST_TEST(cl[i] == std::min(std::max(xs[i], -1.0), 0.5));
      BOOST_TEST(std::fabs(s[i] - std::sin(xs[i])) < tol);
      BOOST_TEST(std::fabs(c[i] - std::cos(xs[i])) < tol);
    }
    Tensor a = vec({1, 5, -2, 3}, {2, 2}, dt), b = vec({2, -1}, {2}, dt);
    BOOST_TEST(maximum(a, b).to_vector<double>() == (std::vector<double>{2, 5, 2, 3}));
    BOOST_TEST(minimum(b, a).to_vector<double>() == (std::vector<double>{1, -1, -2, -1}));
    BOOST_TEST(mul(a, 2.0).to_vector<double>() == (std::vector<double>{2, 10, -4, 6}));
    BOOST_TEST(mul(2, a).to_vector<double>() == (std::vector<double>{2, 10, -4, 6}));
    BOOST_TEST(add(a, 1).to_vector<double>() == (std::vector<double>{2, 6, -1, 4}));
    BOOST_TEST(sub(1.0, a).to_vector<double>() == (std::vector<double>{0, -4, 3, -2}));
    BOOST_TEST(div(a, 4).to_vector<double>() == (std::vector<double>{0.25, 1.25, -0.5, 0.75}));
    BOOST_TEST(amax(a).item() == 5.0);
    BOOST_TEST(amax(a, {0}).to_vector<double>() == (std::vector<double>{1, 5}));
    BOOST_TEST(amax(a, {-1}, true).shape() == (Shape{2, 1}));
  }
}

// The float32 polynomials against libm over a wide range (sin, cos up to 10^4; exp over its
// whole float range), and NaN through clamp and maximum, as PyTorch.
BOOST_AUTO_TEST_CASE(float_math_matches_libm) {
  double worst_trig = 0, worst_exp = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const float x = (float)i * 0.05f;
    worst_trig = std::max({worst_trig, std::fabs(kern::sin(x) - std::sin((double)x)),
                           std::fabs(kern::cos(x) - std::cos((double)x))});
    const float e = (float)i * 0.0004f;  // [-80, 80]
    worst_exp = std::max(worst_exp, std::fabs(kern::exp(e) / std::exp((double)e) - 1));
  }
  BOOST_TEST(worst_trig < 2e-6);
  BOOST_TEST(worst_exp < 4e-7);
  BOOST_TEST(std::isinf(kern::exp(100.0f)));
  BOOST_TEST(std::fabs(kern::sin(1e30f)) <= 1.0f);  // meaningless there, but bounded
  BOOST_TEST(std::isnan(kern::cos(INFINITY)));
  BOOST_TEST(kern::exp(-1000.0f) < 1e-37f);
  const double nan = std::nan("");
  for (DType dt : {DType::f32, DType::f64}) {
    BOOST_TEST(std::isnan(clamp(vec({nan}, {1}, dt), 0, 1).item()));
    BOOST_TEST(
        std::isnan(maximum(vec({nan, 1}, {2}, dt), vec({0}, {1}, dt)).to_vector<double>()[0]));
    BOOST_TEST(std::isnan(minimum(vec({0}, {1}, dt), vec({nan}, {1}, dt)).item()));
    BOOST_TEST(std::isnan(amax(vec({1, nan, 3}, {3}, dt)).item()));
  }
}

// Gradients at the kinks and ties, PyTorch's: clamp passes at both bounds, abs gives 0 at 0,
// maximum splits a tie in half, amax shares among equal maxima.
BOOST_AUTO_TEST_CASE(gradients_at_kinks_and_ties) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = vec({-1, -0.5, 0, 0.5, 1}, {5}, dt).requires_grad_();
    sum(clamp(x, -0.5, 0.5)).backward();
    BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{0, 1, 1, 1, 0}));
    Tensor y = vec({-2, 0, 3}, {3}, dt).requires_grad_();
    sum(abs(y)).backward();
    BOOST_TEST(y.grad().to_vector<double>() == (std::vector<double>{-1, 0, 1}));
    Tensor a = vec({1, 2, 3}, {3}, dt).requires_grad_(), b = vec({2}, {1}, dt).requires_grad_();
    sum(maximum(a, b)).backward();
    BOOST_TEST(a.grad().to_vector<double>() == (std::vector<double>{0, 0.5, 1}));
    BOOST_TEST(b.grad().to_vector<double>() == (std::vector<double>{1.5}));
    Tensor m = vec({4, 1, 4, 2}, {2, 2}, dt).requires_grad_();
    amax(m).backward();
    BOOST_TEST(m.grad().to_vector<double>() == (std::vector<double>{0.5, 0, 0.5, 0}));
  }
}

// A row written with unary_row runs its vectorised float32 loop (not the float64 functions):
// the same values as float64 within float rounding, on a strided input too, forward and
// backward, also above the parallel grain.
BOOST_AUTO_TEST_CASE(unary_row_float32_loop_matches_float64) {
  static constexpr auto f = [](auto x, auto a, auto) { return x / (1 + kern::exp(-a * x)); };
  static constexpr auto df = [](auto x, auto, auto a, auto) {
    const auto s = 1 / (1 + kern::exp(-a * x));
    return s * (1 + a * x * (1 - s));
  };
  const UnaryOp row = unary_row<f, df>({.name = "test_swish", .family = "test"});
  BOOST_TEST(row.f32 != nullptr);
  Generator g(5);
  for (int64_t n : {7, 100003}) {
    Tensor base64 = randn({3, n}, DType::f64, g);
    Tensor base32 = to_dtype(base64, DType::f32).requires_grad_();
    Tensor y64 = unary(row, transpose(base64, 0, 1), 1.5),
           y32 = unary(row, transpose(base32, 0, 1), 1.5);
    sum(y32).backward();
    const auto v64 = y64.to_vector<double>(), v32 = y32.to_vector<double>(),
               d32 = base32.grad().to_vector<double>(), xv = base64.to_vector<double>();
    double worst = 0, worst_d = 0;
    for (size_t i = 0; i < v64.size(); ++i) {
      worst = std::max(worst, std::fabs(v32[i] - v64[i]) / (1 + std::fabs(v64[i])));
      worst_d = std::max(worst_d, std::fabs(d32[i] - df(xv[i], 0.0, 1.5, 0.0)));
    }
    BOOST_TEST(d32.size() == v64.size());
    BOOST_TEST(worst < 1e-6);
    BOOST_TEST(worst_d < 1e-6);
  }
}

// clamp with lo > hi gives hi (PyTorch), and matmul_into's shape check (a kernel, no case of its
// own); the ops' error inputs are in their gradcheck cases (ops/elementwise.cpp, ops/reduce.cpp).
BOOST_AUTO_TEST_CASE(new_op_misuse) {
  BOOST_TEST(clamp(vec({-1, 3}, {2}), 2, 1).to_vector<double>() ==
             (std::vector<double>{1, 1}));  // lo > hi: hi
  BOOST_CHECK_EXCEPTION(kern::matmul_into(ones({2, 3}), ones({4, 5}), zeros({2, 5})), Error,
                        [](const Error& e) {
                          return names(e, {"matmul_into", "(2, 3)", "(4, 5)"});
                        });
}

BOOST_AUTO_TEST_CASE(matmul_into_values) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = vec({1, 2, 3, 4}, {2, 2}, dt), b = vec({1, 0, 1, 1}, {2, 2}, dt),
           out = zeros({2, 2}, dt);
    kern::matmul_into(a, b, out);
    BOOST_TEST(out.to_vector<double>() == (std::vector<double>{3, 2, 7, 4}));
    kern::matmul_into(a, transpose(b, 0, 1), out, 2.0, true);
    BOOST_TEST(out.to_vector<double>() == (std::vector<double>{5, 8, 13, 18}));
  }
}

BOOST_AUTO_TEST_SUITE_END()
