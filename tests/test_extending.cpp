// Extending graft safely (issue 48): an op written outside the library that saves an untracked
// copy or view of its input (kern::contig of a transposed input) would lose its second derivative
// under create_graph; backward refuses it, naming the op and the saved slot. gradgradcheck says
// why when an analytic second derivative is exactly 0. Every test leaves the tape empty.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <vector>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/custom.h"
#include "graft/ops/ops.h"
#include "test_util.h"

using namespace graft;

namespace {

struct TapeEmptyAfter {
  ~TapeEmptyAfter() {
    BOOST_CHECK_EQUAL(autograd::tape_size(), 0u);
    autograd::clear_tape();
  }
};

// What softplus saves for its backward: the input (right), kern::contig of it (the old docs
// example: an untracked copy when the input is not contiguous), a copy of that copy (the copy
// between is gone by the backward), or an untracked view of it.
enum class SoftplusSaves { input, contig_copy, copy_of_copy, detached_view };

GRAFT_DECLARE_OP("test_softplus", "test_extending");

// softplus: y = log(1 + exp(x)), dx = dout * sigmoid(x) with x what the forward saved.
Tensor softplus(const Tensor& x, SoftplusSaves saves) {
  kern::check_float("test_softplus", x);
  const Tensor xc = kern::contig(x);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  GRAFT_DISPATCH_FLOAT(x.dtype(), "test_softplus", [&] {
    const T* px = xc.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i)
      py[i] = std::log1p(std::exp(-std::fabs(px[i]))) + std::max(px[i], T(0));
  });
  const Tensor saved = saves == SoftplusSaves::input          ? x
                       : saves == SoftplusSaves::contig_copy  ? xc
                       : saves == SoftplusSaves::copy_of_copy ? cast_copy(xc, DType::f64)
                                                              : x.detach();
  if (autograd::needs_record({x}))
    autograd::record("test_softplus", {x}, {y}, {saved},
                     [](const autograd::Ctx& c, const Tensors& dout) {
                       return Tensors{mul(dout[0], sigmoid(c.saved[0]))};
                     });
  return y;
}

// The Hessian-vector product H v of L(w) = sum(softplus(w^T)) + sum(w * w) at w, v = ones: each
// element is 2 + sigmoid(w)(1 - sigmoid(w)) (the Hessian is diagonal).
std::vector<double> hvp_through_softplus(const std::vector<double>& w0, SoftplusSaves saves) {
  Tensor w = from_vector(w0, {2, 2}).requires_grad_();
  Tensor loss = add(sum(softplus(transpose(w, 0, 1), saves)), sum(mul(w, w)));
  Tensor g = autograd::grad({loss}, {w}, {}, {.create_graph = true})[0];
  Tensor hv = autograd::grad({sum(g)}, {w})[0];
  return hv.to_vector<double>();
}

}  // namespace

BOOST_AUTO_TEST_CASE(hvp_through_an_op_saving_its_input_is_exact) {
  TapeEmptyAfter after;
  const std::vector<double> w = {0.003, -1.0, 0.5, 2.0};
  const std::vector<double> hv = hvp_through_softplus(w, SoftplusSaves::input);
  for (size_t i = 0; i < w.size(); ++i) {
    const double s = 1 / (1 + std::exp(-w[i]));
    BOOST_CHECK_CLOSE(hv[i], 2 + s * (1 - s), 1e-9);
  }
  BOOST_CHECK_CLOSE(hv[0], 2.249998, 1e-4);  // the value (2.000000 before)
}

BOOST_AUTO_TEST_CASE(an_untracked_copy_saved_under_create_graph_is_an_error) {
  TapeEmptyAfter after;
  BOOST_CHECK_EXCEPTION(
      hvp_through_softplus({0.003, -1.0, 0.5, 2.0}, SoftplusSaves::contig_copy), Error,
      [](const Error& e) {
        return testing::names_all(
            e, {"backward of 'test_softplus'", "saved tensor 0",
                "untracked copy of input 0 (kern::contig)", "second derivative", "save the input"});
      });
  autograd::clear_tape();
}

// A copy of the copy (cast_copy(kern::contig(x))) names x through the copy between.
BOOST_AUTO_TEST_CASE(a_copy_of_an_untracked_copy_saved_under_create_graph_is_an_error) {
  TapeEmptyAfter after;
  BOOST_CHECK_EXCEPTION(hvp_through_softplus({0.003, -1.0, 0.5, 2.0}, SoftplusSaves::copy_of_copy),
                        Error, [](const Error& e) {
                          return testing::names_all(
                              e, {"backward of 'test_softplus'", "saved tensor 0",
                                  "untracked copy of input 0 (cast_copy)"});
                        });
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(an_untracked_view_saved_under_create_graph_is_an_error) {
  TapeEmptyAfter after;
  BOOST_CHECK_EXCEPTION(
      hvp_through_softplus({0.003, -1.0, 0.5, 2.0}, SoftplusSaves::detached_view), Error,
      [](const Error& e) {
        return testing::names_all(
            e, {"backward of 'test_softplus'", "saved tensor 0", "untracked view of input 0"});
      });
  autograd::clear_tape();
}

// The copy costs nothing at the first order: an ordinary backward through it is right, and a
// contiguous input is saved as it is (kern::contig returns it).
BOOST_AUTO_TEST_CASE(an_untracked_copy_is_fine_without_create_graph_and_for_contiguous_inputs) {
  TapeEmptyAfter after;
  Tensor w = from_vector(std::vector<double>{0.5, -1.0, 2.0, 0.0}, {2, 2}).requires_grad_();
  sum(softplus(transpose(w, 0, 1), SoftplusSaves::contig_copy)).backward();
  const std::vector<double> g = w.grad().to_vector<double>();
  BOOST_CHECK_CLOSE(g[0], 1 / (1 + std::exp(-0.5)), 1e-9);
  auto f = [](const Tensors& x) { return softplus(x[0], SoftplusSaves::contig_copy); };
  Tensor x = from_vector(std::vector<double>{0.5, -1.0, 2.0}, {3}).requires_grad_();
  const GradcheckResult r = gradgradcheck(f, {x});
  BOOST_CHECK_MESSAGE(r.ok, r.message);
}

GRAFT_DECLARE_OP("test_cube_raw", "test_extending");

// y = x^3 whose backward 3 x^2 dout runs a raw loop even under create_graph: its gradient is off
// the tape, so every second derivative comes out 0.
Tensor cube_raw(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  const Tensor xc = kern::contig(x);
  for (int64_t i = 0; i < x.numel(); ++i) y.data<double>()[i] = std::pow(xc.data<double>()[i], 3);
  if (autograd::needs_record({x}))
    autograd::record("test_cube_raw", {x}, {y}, {x}, [](const autograd::Ctx& c, const Tensors& d) {
      const Tensor xs = kern::contig(c.saved[0]), g = kern::contig(d[0]);
      Tensor dx = Tensor::empty(xs.shape(), DType::f64);
      for (int64_t i = 0; i < xs.numel(); ++i) {
        const double v = xs.data<double>()[i];
        dx.data<double>()[i] = 3 * v * v * g.data<double>()[i];
      }
      return Tensors{dx};
    });
  return y;
}

BOOST_AUTO_TEST_CASE(gradgradcheck_says_why_a_second_derivative_is_exactly_zero) {
  TapeEmptyAfter after;
  Tensor x = from_vector(std::vector<double>{0.5, -1.0, 2.0}, {3}).requires_grad_();
  auto f = [](const Tensors& in) { return cube_raw(in[0]); };
  BOOST_CHECK(gradcheck(f, {x}).ok);
  const GradcheckResult r = gradgradcheck(f, {x});
  BOOST_TEST_MESSAGE("gradgradcheck: " << r.message);
  BOOST_CHECK(!r.ok);
  BOOST_CHECK(r.message.find("analytic 0") != std::string::npos);
  BOOST_CHECK(r.message.find("backward may not be differentiable") != std::string::npos);
  BOOST_CHECK(r.message.find("GRAFT_DECLARE_OP_ONCE_DIFFERENTIABLE") != std::string::npos);
}
