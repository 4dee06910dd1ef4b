// Forward values and misuse errors of the elementwise and reduce families (their gradients are
// covered by test_gradcheck_all).
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
    Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3}, dt), b = vec({10, 20, 30}, {3}, dt), c = vec({2, 4}, {2, 1}, dt);
    BOOST_TEST(add(a, b).to_vector<double>() == (std::vector<double>{11, 22, 33, 14, 25, 36}));
    BOOST_TEST(add(b, a).to_vector<double>() == (std::vector<double>{11, 22, 33, 14, 25, 36}));
    BOOST_TEST(sub(b, a).to_vector<double>() == (std::vector<double>{9, 18, 27, 6, 15, 24}));
    BOOST_TEST(mul(a, c).to_vector<double>() == (std::vector<double>{2, 4, 6, 16, 20, 24}));
    BOOST_TEST(div(a, c).to_vector<double>() == (std::vector<double>{0.5, 1, 1.5, 1, 1.25, 1.5}));
    BOOST_TEST((2.0 - a * 0.5).to_vector<double>() == (std::vector<double>{1.5, 1, 0.5, 0, -0.5, -1}));
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

BOOST_AUTO_TEST_CASE(elementwise_misuse) {
  Tensor a = ones({2, 3}), b = ones({4});
  BOOST_CHECK_EXCEPTION(add(a, b), Error, [](const Error& e) { return names(e, {"add", "(2, 3)", "(4)", "cannot be broadcast"}); });
  BOOST_CHECK_EXCEPTION(mul(a, ones({2, 3}, DType::f64)), Error,
                        [](const Error& e) { return names(e, {"mul", "dtype mismatch", "f32 (2, 3)", "f64 (2, 3)"}); });
  BOOST_CHECK_EXCEPTION(exp(ones({2}, DType::i64)), Error, [](const Error& e) { return names(e, {"exp", "float", "i64 (2)"}); });
  BOOST_CHECK_EXCEPTION(masked_fill(ones({3}), ones({2, 3}), 0), Error,
                        [](const Error& e) { return names(e, {"masked_fill", "(2, 3)", "(3)"}); });
  BOOST_CHECK_EXCEPTION(where(ones({2}), ones({3}), ones({3})), Error, [](const Error& e) { return names(e, {"where", "(2)", "(3)"}); });
  BOOST_CHECK_EXCEPTION(argmax(ones({2, 3}), 2), Error, [](const Error& e) { return names(e, {"argmax", "axis 2", "rank 2"}); });
}

// argmax: the first maximal element along the axis; NaN counts as maximal (PyTorch).
BOOST_AUTO_TEST_CASE(argmax_values) {
  const double nan = std::nan("");
  Tensor x = from_vector(std::vector<double>{1, 3, 3, 2, 7, nan, 5, 0}, {2, 4});
  BOOST_TEST(argmax(x, 1).to_vector<int64_t>() == (std::vector<int64_t>{1, 1}));
  BOOST_TEST(argmax(x, 0).to_vector<int64_t>() == (std::vector<int64_t>{1, 1, 1, 0}));
  BOOST_TEST(argmax(x, 0).shape() == (Shape{4}));
  BOOST_CHECK_EXCEPTION(argmax(zeros({2, 0}), 1), Error, [](const Error& e) { return names(e, {"argmax", "empty"}); });
}

BOOST_AUTO_TEST_CASE(reduce_values) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = vec({1, 2, 3, 4, 5, 6}, {2, 3}, dt);
    BOOST_TEST(sum(a).item() == 21.0);
    BOOST_TEST(sum(a, {0}).to_vector<double>() == (std::vector<double>{5, 7, 9}));
    BOOST_TEST(sum(a, {-1}, true).shape() == (Shape{2, 1}));
    BOOST_TEST(mean(a, {1}).to_vector<double>() == (std::vector<double>{2, 5}));
    BOOST_TEST(max(a, 0).to_vector<double>() == (std::vector<double>{4, 5, 6}));
    BOOST_TEST(std::fabs(var(a, {1}).to_vector<double>()[0] - 1.0) < 1e-6);          // unbiased
    BOOST_TEST(std::fabs(var(a, {1}, false, 0).to_vector<double>()[0] - 2.0 / 3) < 1e-6);  // biased
    BOOST_TEST(sum(transpose(a, 0, 1), {1}).to_vector<double>() == (std::vector<double>{5, 7, 9}));
    BOOST_TEST(sum_to(ones({4, 2, 3}, dt), {2, 1}).to_vector<double>() == (std::vector<double>{12, 12}));
    Tensor big = ones({3, 1000, 7}, dt);
    BOOST_TEST(sum(big, {0, 2}).to_vector<double>() == std::vector<double>(1000, 21.0));
  }
}

BOOST_AUTO_TEST_CASE(reduce_misuse) {
  Tensor a = ones({2, 3});
  BOOST_CHECK_EXCEPTION(sum(a, {2}), Error, [](const Error& e) { return names(e, {"sum", "axis 2", "rank 2"}); });
  BOOST_CHECK_EXCEPTION(mean(a, {0, -2}), Error, [](const Error& e) { return names(e, {"mean", "repeated axis"}); });
  BOOST_CHECK_EXCEPTION(max(ones({2, 0}), 1), Error, [](const Error& e) { return names(e, {"max", "empty", "(2, 0)"}); });
  BOOST_CHECK_EXCEPTION(var(ones({2, 1}), {1}), Error, [](const Error& e) { return names(e, {"var", "correction 1", "(2, 1)"}); });
  BOOST_CHECK_EXCEPTION(sum_to(a, {4}), Error, [](const Error& e) { return names(e, {"sum_to", "(2, 3)", "(4)"}); });
  BOOST_CHECK_EXCEPTION(sum(ones({2}, DType::i64)), Error, [](const Error& e) { return names(e, {"sum", "i64 (2)"}); });
}

BOOST_AUTO_TEST_SUITE_END()
