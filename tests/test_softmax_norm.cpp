// softmax, log_softmax, layer_norm and rms_norm: hand-computed values in both dtypes, float32
// (oneDNN) vs float64 (loops) on larger inputs, and the misuse errors.
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "graft/ops/norm.h"
#include "graft/ops/softmax.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::testing;

namespace {

Tensor vec(const std::vector<double>& v, const Shape& shape, DType dt) {
  return cast_copy(from_vector(v, shape), dt);
}

const DType kFloats[] = {DType::f32, DType::f64};

}  // namespace

BOOST_AUTO_TEST_SUITE(softmax_norm)

BOOST_AUTO_TEST_CASE(softmax_values) {
  const double l3 = std::log(3.0);
  for (DType dt : kFloats) {
    Tensor x = vec({0, l3, 5, 5}, {2, 2}, dt);
    check_close(softmax(x), {0.25, 0.75, 0.5, 0.5});
    check_close(log_softmax(x), {std::log(0.25), std::log(0.75), std::log(0.5), std::log(0.5)});
    // middle axis of (1, 2, 2): columns [0, log 3] and [0, 0]
    Tensor m = vec({0, 0, l3, 0}, {1, 2, 2}, dt);
    check_close(softmax(m, 1), {0.25, 0.5, 0.75, 0.5});
    // the same numbers through a transposed view, normalised along its last axis
    Tensor t = tview(vec({0, 5, l3, 5}, {2, 2}, dt));
    BOOST_CHECK(!t.is_contiguous());
    check_close(softmax(t, -1), {0.25, 0.75, 0.5, 0.5});
    // large logits must not overflow (the max is subtracted)
    check_close(softmax(vec({1000, 1000}, {2}, dt)), {0.5, 0.5});
  }
}

BOOST_AUTO_TEST_CASE(softmax_backward_values) {
  for (DType dt : kFloats) {
    // y = (0.25, 0.75), dy = (1, 0): dx = y * (dy - sum(dy * y)) = (0.1875, -0.1875)
    Tensor x = vec({0, std::log(3.0)}, {2}, dt).requires_grad_();
    softmax(x).backward(vec({1, 0}, {2}, dt));
    check_close(x.grad(), {0.1875, -0.1875});
    // log_softmax: dx = dy - exp(y) * sum(dy) = (1 - 0.25, -0.75)
    Tensor x2 = vec({0, std::log(3.0)}, {2}, dt).requires_grad_();
    log_softmax(x2).backward(vec({1, 0}, {2}, dt));
    check_close(x2.grad(), {0.75, -0.75});
  }
}

BOOST_AUTO_TEST_CASE(softmax_f32_matches_f64) {
  Generator g(9);
  for (bool log : {false, true})
    for (int64_t axis : {0, 1, 2}) {
      Tensor x = randn({6, 33, 20}, DType::f64, g, 0, 3).requires_grad_();
      Tensor x32 = cast_copy(x, DType::f32).requires_grad_();
      auto f = [&](const Tensor& t) { return log ? log_softmax(t, axis) : softmax(t, axis); };
      Tensor y = f(x), y32 = f(x32);
      check_same(y32, y, 1e-5);
      Tensor dout = randn(y.shape(), DType::f64, g);
      y.backward(dout);
      y32.backward(cast_copy(dout, DType::f32));
      check_same(x32.grad(), x.grad(), 1e-4);
    }
}

BOOST_AUTO_TEST_CASE(layer_norm_values) {
  for (DType dt : kFloats) {
    // mean 2.5, biased var 1.25
    Tensor x = vec({1, 2, 3, 4}, {1, 4}, dt);
    const double r = 1 / std::sqrt(1.25 + 1e-5);
    check_close(layer_norm(x, Tensor(), Tensor()), {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r});
    Tensor w = vec({1, 1, 2, 2}, {4}, dt), b = vec({0, 0, 0, 1}, {4}, dt);
    check_close(layer_norm(x, w, b), {-1.5 * r, -0.5 * r, 1.0 * r, 3.0 * r + 1});
    check_close(layer_norm(x, Tensor(), b), {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r + 1});
    // rows of a transposed view are normalised independently
    Tensor t = tview(vec({1, 10, 2, 20, 3, 30, 4, 40}, {4, 2}, dt));
    const double r2 = 1 / std::sqrt(125 + 1e-5);
    check_close(layer_norm(t, Tensor(), Tensor()),
                {-1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r, -15 * r2, -5 * r2, 5 * r2, 15 * r2});
    // backward with dy = ones: dx = 0 (the mean is removed), dw = sum of normalised x, db = rows
    Tensor xg = vec({1, 2, 3, 4, 0, 2, 0, 2}, {2, 4}, dt).requires_grad_();
    Tensor wg = vec({1, 2, 3, 4}, {4}, dt).requires_grad_(),
           bg = vec({0, 0, 0, 0}, {4}, dt).requires_grad_();
    layer_norm(xg, wg, bg).backward(ones({2, 4}, dt));
    const double q = 1 / std::sqrt(1 + 1e-5);
    check_close(wg.grad(), {-1.5 * r - q, -0.5 * r + q, 0.5 * r - q, 1.5 * r + q});
    check_close(bg.grad(), {2, 2, 2, 2});
    BOOST_CHECK(xg.grad().shape() == Shape({2, 4}));
  }
}

BOOST_AUTO_TEST_CASE(layer_norm_f32_matches_f64) {
  Generator g(4);
  for (int variant = 0; variant < 3; ++variant) {
    Tensor x = randn({5, 7, 48}, DType::f64, g, 0.3, 2).requires_grad_();
    Tensor w = variant < 2 ? randn({48}, DType::f64, g, 1, 0.5).requires_grad_() : Tensor();
    Tensor b = variant < 1 ? randn({48}, DType::f64, g).requires_grad_() : Tensor();
    auto f32 = [](const Tensor& t) {
      return t.defined() ? cast_copy(t, DType::f32).requires_grad_() : Tensor();
    };
    Tensor x32 = f32(x), w32 = f32(w), b32 = f32(b);
    Tensor y = layer_norm(x, w, b), y32 = layer_norm(x32, w32, b32);
    check_same(y32, y, 1e-4);
    Tensor dout = randn(y.shape(), DType::f64, g);
    y.backward(dout);
    y32.backward(cast_copy(dout, DType::f32));
    check_same(x32.grad(), x.grad(), 1e-4);
    if (w.defined()) check_same(w32.grad(), w.grad(), 1e-3);
    if (b.defined()) check_same(b32.grad(), b.grad(), 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(rms_norm_values) {
  for (DType dt : kFloats) {
    // Row (1, 2, 3, 4): mean square 7.5, so y = x / sqrt(7.5 + eps).
    const double eps = 0.5, r = 1 / std::sqrt(7.5 + eps);
    Tensor x = vec({1, 2, 3, 4}, {1, 4}, dt), w = vec({1, 1, 2, -1}, {4}, dt);
    check_close(rms_norm(x, Tensor(), eps), {r, 2 * r, 3 * r, 4 * r});
    check_close(rms_norm(x, w, eps), {r, 2 * r, 6 * r, -4 * r});
    // A zero row stays zero (eps keeps it finite); no mean is subtracted from a constant row.
    check_close(rms_norm(vec({0, 0, 3, 3}, {2, 2}, dt), Tensor(), 1e-6), {0, 0, 1, 1});
  }
}

BOOST_AUTO_TEST_CASE(rms_norm_f32_matches_f64) {
  Generator g(5);
  for (bool weighted : {true, false}) {
    Tensor x = randn({5, 7, 48}, DType::f64, g, 0.3, 2).requires_grad_();
    Tensor w = weighted ? randn({48}, DType::f64, g, 1, 0.5).requires_grad_() : Tensor();
    auto f32 = [](const Tensor& t) {
      return t.defined() ? cast_copy(t, DType::f32).requires_grad_() : Tensor();
    };
    Tensor x32 = f32(x), w32 = f32(w);
    Tensor y = rms_norm(x, w), y32 = rms_norm(x32, w32);
    check_same(y32, y, 1e-4);
    Tensor dout = randn(y.shape(), DType::f64, g);
    y.backward(dout);
    y32.backward(cast_copy(dout, DType::f32));
    check_same(x32.grad(), x.grad(), 1e-4);
    if (w.defined()) check_same(w32.grad(), w.grad(), 1e-3);
  }
}

// The ops' bad inputs and their errors are in their records (OpRecord::error_inputs,
// testing/cases/softmax.cpp and norm.cpp) and run by test_gradcheck_all.

BOOST_AUTO_TEST_SUITE_END()
