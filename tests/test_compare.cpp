// Comparisons and logical ops on 0/1 masks (ops/compare.h, issue 48): values against the C++
// operators with broadcasting, dtype promotion, NaN, exact int64, no gradient, and the errors;
// accuracy and masking without a loop over to_vector.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/ops/ops.h"

using namespace graft;

namespace {

bool says(const Error& e, const char* part) {
  BOOST_TEST_MESSAGE("message: " << e.what());
  return std::string(e.what()).find(part) != std::string::npos;
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// The 0/1 mask t as a string of digits in row-major order, such as "1100" (a string, not a
// vector of doubles: GCC 12.2 at -O3 -march=native built {1, 1, 0, 0} as four ones here).
std::string digits(const Tensor& t) {
  std::string s;
  for (double v : values(t)) s += v == 0 ? '0' : v == 1 ? '1' : '?';
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(comparisons_broadcast_like_pytorch) {
  // a (2, 3) against b (3): every row of a against b.
  const Tensor a = from_vector(std::vector<float>{1, 2, 3, 3, 2, 1}, {2, 3});
  const Tensor b = from_vector(std::vector<float>{1, 2, 2}, {3});
  BOOST_CHECK_EQUAL(digits(eq(a, b)), "110010");
  BOOST_CHECK_EQUAL(digits(ne(a, b)), "001101");
  BOOST_CHECK_EQUAL(digits(lt(a, b)), "000001");
  BOOST_CHECK_EQUAL(digits(le(a, b)), "110011");
  BOOST_CHECK_EQUAL(digits(gt(a, b)), "001100");
  BOOST_CHECK_EQUAL(digits(ge(a, b)), "111110");
  // (2, 1) against (1, 3) gives (2, 3); a transposed view reads through its strides.
  const Tensor col = from_vector(std::vector<double>{1, 2}, {2, 1});
  const Tensor row = from_vector(std::vector<double>{0, 1, 2}, {1, 3});
  const Tensor g = gt(col, row);
  BOOST_TEST(g.shape() == Shape({2, 3}));
  BOOST_CHECK_EQUAL(digits(g), "100110");
  BOOST_CHECK_EQUAL(digits(eq(transpose(a, 0, 1), transpose(a, 0, 1))), std::string(6, '1'));
}

BOOST_AUTO_TEST_CASE(comparisons_against_a_scalar) {
  const Tensor a = from_vector(std::vector<double>{-1, 0, 0.5, 2}, {4});
  BOOST_CHECK_EQUAL(digits(ne(a, 0.0)), "1011");
  BOOST_CHECK_EQUAL(digits(lt(a, 0.5)), "1100");
  BOOST_CHECK_EQUAL(digits(le(a, 0.5)), "1110");
  BOOST_CHECK_EQUAL(digits(gt(a, 0.5)), "0001");
  BOOST_CHECK_EQUAL(digits(ge(a, 0.5)), "0011");
  BOOST_TEST((ge(a, 0.5).dtype() == DType::f64));
  // An int64 tensor against a fraction compares in float64, and stays int64.
  const Tensor ids = from_vector(std::vector<int64_t>{2, 3, 4}, {3});
  const Tensor m = lt(ids, 3.5);
  BOOST_TEST((m.dtype() == DType::i64));
  BOOST_CHECK_EQUAL(digits(m), "110");
}

// An int8 tensor against a scalar compares exactly, as int64 does: 0.5 is not truncated to 0,
// and 200 (beyond int8) compares instead of failing to fit.
BOOST_AUTO_TEST_CASE(int8_against_a_scalar) {
  const Tensor a = cast_copy(from_vector(std::vector<int64_t>{-3, 0, 1, 127}, {4}), DType::i8);
  BOOST_TEST(digits(lt(a, 0.5)) == "1100");
  BOOST_TEST(digits(eq(a, 0.5)) == "0000");
  BOOST_TEST(digits(gt(a, 200)) == "0000");
  BOOST_TEST(digits(ge(a, -3)) == "1111");
  BOOST_TEST((lt(a, 0.5).dtype() == DType::i8));
}

BOOST_AUTO_TEST_CASE(the_result_dtype_is_the_promoted_one) {
  const Tensor i = from_vector(std::vector<int64_t>{1, 2}, {2});
  const Tensor f = from_vector(std::vector<float>{1, 3}, {2});
  const Tensor d = from_vector(std::vector<double>{1, 3}, {2});
  BOOST_TEST((eq(i, i).dtype() == DType::i64));
  BOOST_TEST((eq(i, f).dtype() == DType::f32));
  BOOST_TEST((eq(f, d).dtype() == DType::f64));
  BOOST_CHECK_EQUAL(digits(eq(i, f)), "10");
}

BOOST_AUTO_TEST_CASE(int64_compares_exactly_beyond_2_to_the_53) {
  const int64_t big = (int64_t(1) << 53) + 1;  // big and big - 1 are one double apart: equal there
  const Tensor a = from_vector(std::vector<int64_t>{big}, {1});
  const Tensor b = from_vector(std::vector<int64_t>{big - 1}, {1});
  BOOST_CHECK_EQUAL(digits(eq(a, b)), "0");
  BOOST_CHECK_EQUAL(digits(gt(a, b)), "1");
  BOOST_CHECK_EQUAL(digits(eq(a, (double)big)), "0");  // the double rounds to 2^53
}

BOOST_AUTO_TEST_CASE(nan_compares_unequal_to_everything) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor a = from_vector(std::vector<double>{nan, nan, 1}, {3});
  const Tensor b = from_vector(std::vector<double>{nan, 1, nan}, {3});
  BOOST_CHECK_EQUAL(digits(eq(a, b)), "000");
  BOOST_CHECK_EQUAL(digits(ne(a, b)), "111");
  using Cmp = Tensor (*)(const Tensor&, const Tensor&);
  for (Cmp op : {Cmp(lt), Cmp(le), Cmp(gt), Cmp(ge)}) BOOST_CHECK_EQUAL(digits(op(a, b)), "000");
  BOOST_CHECK_EQUAL(digits(logical_not(a)), "000");  // NaN is non-zero
}

BOOST_AUTO_TEST_CASE(logical_ops_on_masks) {
  const Tensor a = from_vector(std::vector<float>{0, 1, 0, 2}, {4});
  const Tensor b = from_vector(std::vector<float>{0, 0, 1, -1}, {4});
  BOOST_CHECK_EQUAL(digits(logical_not(a)), "1010");
  BOOST_CHECK_EQUAL(digits(logical_and(a, b)), "0001");
  BOOST_CHECK_EQUAL(digits(logical_or(a, b)), "0111");
  const Tensor one = from_vector(std::vector<int64_t>{1}, {1});
  BOOST_CHECK_EQUAL(digits(logical_and(a, one)), "0101");
}

BOOST_AUTO_TEST_CASE(comparisons_are_not_differentiable) {
  const Tensor x = from_vector(std::vector<double>{1, 2}, {2}).requires_grad_();
  const Tensor y = from_vector(std::vector<double>{2, 2}, {2}).requires_grad_();
  BOOST_TEST(!lt(x, y).requires_grad());
  BOOST_TEST(!gt(x, 1.0).requires_grad());
  BOOST_TEST(!logical_or(x, y).requires_grad());
  BOOST_TEST(autograd::tape_size() == 0u);
}

// Accuracy and a masked loss without a loop over to_vector.
BOOST_AUTO_TEST_CASE(accuracy_and_masking_compose_with_ops) {
  const Tensor logits =
      from_vector(std::vector<float>{0.1f, 2, -1, 3, 0, 0, -2, -1, 5, 1, 1.5f, 0}, {4, 3});
  const Tensor target =
      from_vector(std::vector<int64_t>{1, 0, 1, 1}, {4});  // right, right, wrong, right
  const Tensor acc = mean(to_dtype(eq(argmax(logits, -1), target), DType::f32));
  BOOST_CHECK_CLOSE(acc.item(), 0.75, 1e-5);
  // Zero the negative logits through a mask, and count them.
  const Tensor neg = lt(logits, 0.0);
  const Tensor kept = masked_fill(logits, neg, 0.0);
  BOOST_TEST(sum(neg).item() == 3.0);
  BOOST_CHECK_EQUAL(digits(lt(kept, 0.0)), std::string(12, '0'));
  const Tensor picked = where(logical_not(neg), logits, zeros({4, 3}));
  BOOST_TEST(values(picked) == values(kept));
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_shapes) {
  const Tensor a = zeros({2, 3}), b = zeros({4});
  BOOST_CHECK_EXCEPTION(lt(a, b), Error, [](const Error& e) {
    return says(e, "lt: shapes (2, 3) and (4) cannot be broadcast");
  });
  BOOST_CHECK_EXCEPTION(logical_and(a, b), Error, [](const Error& e) {
    return says(e, "logical_and: shapes (2, 3) and (4)");
  });
  BOOST_CHECK_EXCEPTION(eq(Tensor(), a), Error,
                        [](const Error& e) { return says(e, "eq: a is an undefined tensor"); });
  BOOST_CHECK_EXCEPTION(ge(a, Tensor()), Error,
                        [](const Error& e) { return says(e, "ge: b is an undefined tensor"); });
  BOOST_CHECK_EXCEPTION(gt(Tensor(), 1.0), Error,
                        [](const Error& e) { return says(e, "gt: a is an undefined tensor"); });
  BOOST_CHECK_EXCEPTION(logical_not(Tensor()), Error, [](const Error& e) {
    return says(e, "logical_not: a is an undefined tensor");
  });
}
