// cross_entropy, linear_cross_entropy and dropout: hand-computed values, PyTorch semantics, mask
// determinism, misuse.
#include <omp.h>

#include <boost/test/unit_test.hpp>
#include <cmath>

#include "graft/autograd/tape.h"
#include "graft/ops/dropout.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/loss.h"
#include "graft/ops/matmul.h"
#include "tests/test_util.h"

using namespace graft;

namespace {

bool msg_has(const Error& e, const char* op, std::initializer_list<const char*> parts) {
  const std::string m = e.what();
  if (m.find(op) == std::string::npos) return false;
  for (auto p : parts)
    if (m.find(p) == std::string::npos) return false;
  return true;
}

void check_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    BOOST_TEST(std::fabs(a[i] - b[i]) <= tol, "at " << i << ": " << a[i] << " vs " << b[i]);
}

Tensor targets(std::vector<int64_t> t) {
  const int64_t n = (int64_t)t.size();
  return from_vector(t, {n});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loss)

BOOST_AUTO_TEST_CASE(uniform_logits_give_log_c) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = full({3, 7}, 0.25, dt);
    Tensor l = cross_entropy(x, targets({0, 6, 3}));
    BOOST_TEST(l.dim() == 0);
    BOOST_TEST((l.dtype() == dt));
    BOOST_TEST(std::fabs(l.item() - std::log(7.0)) < 1e-6);
    // Smoothing does not change it: every class has the same log-probability.
    BOOST_TEST(std::fabs(cross_entropy(x, targets({0, 6, 3}), 0.3).item() - std::log(7.0)) < 1e-6);
  }
}

// logits [[1, 2, 3], [1, 1, 1]], targets [2, 0]. Row 0: lse = 3 + log(1 + e^-1 + e^-2)
// = 3.40760596444438; loss_0 = lse - (1 - eps) * 3 - eps / 3 * (1 + 2 + 3). Row 1: log 3.
BOOST_AUTO_TEST_CASE(hand_computed_with_and_without_smoothing) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x =
        cast_copy(from_vector(std::vector<double>{1, 2, 3, 1, 1, 1}, {2, 3}), dt).requires_grad_();
    Tensor t = targets({2, 0});
    BOOST_TEST(std::fabs(cross_entropy(x, t).item() - 0.7531091265562452) < 1e-6);
    Tensor l = cross_entropy(x, t, 0.1);
    BOOST_TEST(std::fabs(l.item() - 0.8031091265562452) < 1e-6);
    // dlogits = (softmax - q) / 2 with q = 0.9 onehot + 0.1 / 3.
    autograd::clear_tape();
    l = cross_entropy(x, t, 0.1);
    l.backward();
    const double s0 = 0.09003057317038043, s1 = 0.24472847105479759, s2 = 0.6652409557748217;
    const double o = 0.1 / 3, on = 0.9 + 0.1 / 3;
    check_close(x.grad().to_vector<double>(),
                {(s0 - o) / 2, (s1 - o) / 2, (s2 - on) / 2, (1.0 / 3 - on) / 2, (1.0 / 3 - o) / 2,
                 (1.0 / 3 - o) / 2},
                1e-6);
  }
}

// Ignored rows count neither in the sum nor in the mean, and get zero gradient.
BOOST_AUTO_TEST_CASE(ignored_targets) {
  Tensor x =
      from_vector(std::vector<double>{1, 2, 3, 5, -4, 0.5, 1, 1, 1}, {3, 3}).requires_grad_();
  Tensor l = cross_entropy(x, targets({2, -100, 0}));
  BOOST_TEST(std::fabs(l.item() - 0.7531091265562452) < 1e-12);
  l.backward();
  auto g = x.grad().to_vector<double>();
  for (int c = 3; c < 6; ++c) BOOST_TEST(g[c] == 0.0);
  BOOST_TEST(std::fabs(g[8] - (1.0 / 3) / 2) < 1e-12);
  // A custom ignore_index that is a real class id.
  BOOST_TEST(std::fabs(cross_entropy(x.detach(), targets({2, 1, 0}), 0.0, 1).item() -
                       0.7531091265562452) < 1e-12);
}

BOOST_AUTO_TEST_CASE(all_ignored_is_zero_not_nan) {
  Tensor x = rand({2, 4}, DType::f64).requires_grad_();
  Tensor l = cross_entropy(x, targets({-100, -100}), 0.1);
  BOOST_TEST(l.item() == 0.0);
  l.backward();
  for (double v : x.grad().to_vector<double>()) BOOST_TEST(v == 0.0);
}

// Large logits do not overflow (log-sum-exp is shifted by the row max).
BOOST_AUTO_TEST_CASE(large_logits_are_stable) {
  Tensor x = from_vector(std::vector<float>{1000, 0, -1000, 1000}, {2, 2});
  Tensor l = cross_entropy(x, targets({0, 0}));
  BOOST_TEST(std::fabs(l.item() - 1000.0) < 1e-3);  // row 0: 0, row 1: 2000
}

BOOST_AUTO_TEST_CASE(float32_matches_float64_many_rows) {
  Generator g(8);
  Tensor x64 = randn({300, 257}, DType::f64, g, 0, 3);
  std::vector<int64_t> t(300);
  for (auto& v : t) v = (int64_t)g.below(257);
  t[5] = -100;
  Tensor x32 = cast_copy(x64, DType::f32);
  x64.requires_grad_();
  x32.requires_grad_();
  Tensor l64 = cross_entropy(x64, targets(t), 0.1), l32 = cross_entropy(x32, targets(t), 0.1);
  BOOST_TEST(std::fabs(l64.item() - l32.item()) < 1e-5);
  l64.backward();
  l32.backward();
  check_close(x32.grad().to_vector<double>(), x64.grad().to_vector<double>(), 1e-7);
}

// When nothing else holds the logits, backward writes the gradient into their buffer; the
// gradient is the same as when they are held (a fresh buffer) or kept for a second backward.
BOOST_AUTO_TEST_CASE(gradient_in_the_logits_buffer_is_the_same) {
  Generator g(21);
  Tensor x0 = rand({6, 7}, DType::f32, g, -2, 2);
  Tensor t = from_vector(std::vector<int64_t>{1, 0, 6, 2, 0, 3}, {6});
  auto grad_of = [&](int mode) {
    Tensor x = x0.detach().requires_grad_();
    Tensor held = mul(x, scalar(2.0));  // mode 1 keeps a handle on the logits
    Tensor loss = cross_entropy(mode == 1 ? held : mul(x, scalar(2.0)), t, 0.1, 0);
    held = mode == 1 ? held : Tensor();
    if (mode == 2) {
      loss.backward(Tensor(), /*retain_graph=*/true);
      x.impl()->grad.reset();
    }
    loss.backward();
    return x.grad().to_vector<float>();
  };
  const auto fresh = grad_of(1), in_place = grad_of(0), retained = grad_of(2);
  BOOST_TEST(in_place == fresh, boost::test_tools::per_element());
  BOOST_TEST(retained == fresh, boost::test_tools::per_element());
}

// linear_cross_entropy == cross_entropy(linear(x, w)): loss and both gradients, for several
// chunk sizes, an upstream gradient other than 1 (scaled in place, or copied under
// retain_graph), and x or w alone requiring grad.
BOOST_AUTO_TEST_CASE(linear_cross_entropy_matches_linear_then_cross_entropy) {
  Generator g(31);
  Tensor x0 = rand({9, 4}, DType::f64, g, -1, 1), w0 = rand({7, 4}, DType::f64, g, -1, 1);
  Tensor t = from_vector(std::vector<int64_t>{3, 0, 6, 2, 0, 5, 1, 0, 4}, {9});
  Tensor xr = x0.detach().requires_grad_(), wr = w0.detach().requires_grad_();
  Tensor ref = mul(cross_entropy(linear(xr, wr), t, 0.1, 0), scalar(3.0, DType::f64));
  ref.backward();
  for (int64_t chunk : {0, 1, 4, 9, 20}) {
    for (bool retain : {false, true}) {
      Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
      Tensor loss = mul(linear_cross_entropy(x, w, t, 0.1, 0, chunk), scalar(3.0, DType::f64));
      BOOST_TEST(std::fabs(loss.item() - ref.item()) < 1e-12);
      loss.backward(Tensor(), retain);
      autograd::clear_tape();
      BOOST_TEST(x.grad().to_vector<double>() == xr.grad().to_vector<double>(),
                 boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());
      BOOST_TEST(w.grad().to_vector<double>() == wr.grad().to_vector<double>(),
                 boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());
    }
  }
  // Every target ignored: loss 0 and zero gradients (as cross_entropy), nothing multiplied.
  Tensor xi = x0.detach().requires_grad_(), wi = w0.detach().requires_grad_();
  Tensor none = linear_cross_entropy(xi, wi, from_vector(std::vector<int64_t>(9, 0), {9}), 0.1, 0);
  BOOST_TEST(none.item() == 0.0);
  none.backward();
  for (double v : xi.grad().to_vector<double>()) BOOST_TEST(v == 0.0);
  for (double v : wi.grad().to_vector<double>()) BOOST_TEST(v == 0.0);
  Tensor w_only = w0.detach().requires_grad_();
  linear_cross_entropy(x0, w_only, t, 0.1, 0, 4).backward();
  BOOST_TEST(w_only.grad().defined());
  // float32 (oneDNN matmuls) against the float64 result.
  Tensor x32 = cast_copy(x0, DType::f32).requires_grad_(), w32 = cast_copy(w0, DType::f32);
  Tensor l32 = linear_cross_entropy(x32, w32, t, 0.1, 0, 4);
  BOOST_TEST(std::fabs(l32.item() * 3 - ref.item()) < 1e-5);
  l32.backward(scalar(3.0));
  const auto gx32 = x32.grad().to_vector<float>();
  const auto gx = xr.grad().to_vector<double>();
  for (size_t i = 0; i < gx.size(); ++i) BOOST_TEST(std::fabs(gx32[i] - gx[i]) < 1e-5);
}

// float32 with 300 rows of 256 features (rows 1 KiB apart: x goes through a padded copy for the
// dw matmul) and some ignored targets, against float64.
BOOST_AUTO_TEST_CASE(linear_cross_entropy_f32_wide_rows_matches_f64) {
  Generator g(41);
  Tensor x0 = rand({300, 256}, DType::f64, g, -1, 1),
         w0 = rand({50, 256}, DType::f64, g, -0.2, 0.2);
  std::vector<int64_t> tv(300);
  for (int64_t i = 0; i < 300; ++i) tv[i] = i % 7 == 0 ? -100 : (i * 13) % 50;
  Tensor t = from_vector(tv, {300});
  Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  Tensor l64 = linear_cross_entropy(x, w, t, 0.1, -100, 64);
  l64.backward();
  Tensor x32 = cast_copy(x0, DType::f32).requires_grad_(),
         w32 = cast_copy(w0, DType::f32).requires_grad_();
  Tensor l32 = linear_cross_entropy(x32, w32, t, 0.1, -100, 64);
  l32.backward();
  BOOST_TEST(std::fabs(l32.item() - l64.item()) < 1e-4);
  testing::check_same(x32.grad(), x.grad(), 1e-5);
  testing::check_same(w32.grad(), w.grad(), 1e-5);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dropout_op)

// The mask is exactly "gen.uniform() >= p" drawn in element order, and the generator ends where
// n sequential draws would leave it.
BOOST_AUTO_TEST_CASE(mask_matches_sequential_draws) {
  const double p = 0.3;
  Generator g(77), ref(77);
  Tensor out = dropout(ones({40, 25}, DType::f64), p, true, g);
  auto o = out.to_vector<double>();
  for (double v : o) {
    const double want = ref.uniform() >= p ? 1 / (1 - p) : 0.0;
    BOOST_TEST(v == want);
  }
  BOOST_TEST(g.next_u64() == ref.next_u64());
}

BOOST_AUTO_TEST_CASE(same_mask_for_f32_f64_and_any_thread_count) {
  const int64_t n = 100000;  // above the parallel grain
  Generator g1(3), g2(3), g3(3);
  const int prev = omp_get_max_threads();
  omp_set_num_threads(1);
  auto a = dropout(ones({n}, DType::f32), 0.5, true, g1).to_vector<double>();
  omp_set_num_threads(std::max(2, prev));
  auto b = dropout(ones({n}, DType::f32), 0.5, true, g2).to_vector<double>();
  auto c = dropout(ones({n}, DType::f64), 0.5, true, g3).to_vector<double>();
  omp_set_num_threads(prev);
  BOOST_TEST(a == b);
  BOOST_TEST(a == c);
  int64_t kept = 0;
  for (double v : a) kept += v != 0;
  BOOST_TEST(std::fabs((double)kept / n - 0.5) < 0.01);
}

BOOST_AUTO_TEST_CASE(kept_values_are_scaled_and_backward_uses_the_mask) {
  Generator g(11);
  Tensor x = rand({8, 9}, DType::f64, g, 1, 2).requires_grad_();
  Tensor y = dropout(x, 0.25, true, g);
  auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  int64_t kept = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    BOOST_TEST((yv[i] == 0.0 || std::fabs(yv[i] - xv[i] / 0.75) < 1e-12));
    kept += yv[i] != 0;
  }
  BOOST_TEST(kept > 0);
  BOOST_TEST(kept < 72);
  Tensor dout = rand({8, 9}, DType::f64, g);
  y.backward(dout);
  auto gx = x.grad().to_vector<double>(), dv = dout.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i)
    BOOST_TEST(std::fabs(gx[i] - (yv[i] == 0.0 ? 0.0 : dv[i] / 0.75)) < 1e-12);
}

// The mask is recomputed in backward, not stored: the tape keeps nothing for dropout, and a
// later draw from the same generator does not disturb the recomputation.
BOOST_AUTO_TEST_CASE(backward_recomputes_the_mask_without_storing_it) {
  Generator g(12);
  Tensor x = rand({64, 64}, DType::f32, g, 1, 2).requires_grad_();
  Tensor y = dropout(x, 0.5, true, g);
  auto report = autograd::saved_bytes_by_op();
  BOOST_TEST_REQUIRE(report.size() == 1u);
  BOOST_TEST(report[0].op == "dropout");
  BOOST_TEST(report[0].bytes == 0u);
  Tensor z = dropout(x, 0.5, true, g);  // advances g between forward and backward
  autograd::clear_tape();
  Tensor y2 = dropout(x, 0.5, true, g);
  auto yv = y2.to_vector<float>();
  y2.backward(ones({64, 64}));
  auto gx = x.grad().to_vector<float>();
  for (size_t i = 0; i < yv.size(); ++i) BOOST_TEST(gx[i] == (yv[i] == 0.0f ? 0.0f : 2.0f));
}

// relu_dropout(x) = dropout(relu(x)) with the same draws; backward from its output alone.
BOOST_AUTO_TEST_CASE(relu_dropout_matches_relu_then_dropout) {
  Generator gx(13);
  Tensor x0 = rand({16, 33}, DType::f64, gx, -1, 1);
  Tensor a = x0.detach().requires_grad_(), b = x0.detach().requires_grad_();
  Generator g1(3), g2(3);
  Tensor ya = relu_dropout(a, 0.3, true, g1);
  Tensor yb = dropout(relu(b), 0.3, true, g2);
  BOOST_TEST(ya.to_vector<double>() == yb.to_vector<double>());
  BOOST_TEST(g1.state() == g2.state());
  Tensor dout = rand({16, 33}, DType::f64, gx);
  ya.backward(dout);
  yb.backward(dout);
  BOOST_TEST(a.grad().to_vector<double>() == b.grad().to_vector<double>());
  // Off (eval or p = 0): plain relu, the generator untouched.
  const uint64_t st = g1.state();
  BOOST_TEST(relu_dropout(x0, 0.3, false, g1).to_vector<double>() == relu(x0).to_vector<double>());
  BOOST_TEST(relu_dropout(x0, 0.0, true, g1).to_vector<double>() == relu(x0).to_vector<double>());
  BOOST_TEST(g1.state() == st);
  BOOST_CHECK_EXCEPTION(relu_dropout(x0, 2.0, true), Error, [](const Error& e) {
    return msg_has(e, "relu_dropout", {"p = 2", "(16, 33)"});
  });
}

// A transposed view gets the mask of its logical (row-major) element order.
BOOST_AUTO_TEST_CASE(noncontiguous_input) {
  Tensor base = rand({5, 3});
  Tensor xt = Tensor::view_of(base, {3, 5}, {1, 3}, 0);
  Generator g1(2), g2(2);
  BOOST_TEST(dropout(xt, 0.5, true, g1).to_vector<float>() ==
             dropout(contiguous_copy(xt), 0.5, true, g2).to_vector<float>());
}

BOOST_AUTO_TEST_CASE(identity_and_edge_probabilities) {
  Tensor x = rand({4, 4});
  Generator g(1);
  const uint64_t s = g.state();
  BOOST_TEST(dropout(x, 0.5, false, g).to_vector<float>() == x.to_vector<float>());
  BOOST_TEST(dropout(x, 0.0, true, g).to_vector<float>() == x.to_vector<float>());
  BOOST_TEST(g.state() == s);  // identity draws nothing
  for (float v : dropout(x, 1.0, true, g).to_vector<float>()) BOOST_TEST(v == 0.0f);
}

BOOST_AUTO_TEST_SUITE_END()
