// Higher-order gradients (issue 34): autograd::grad() (create_graph, retain_graph, allow_unused)
// as torch.autograd.grad, backward(create_graph), second and third derivatives of small
// polynomials and rational functions against closed forms, a Hessian-vector product, and the
// rules that hold through the second order: anomaly mode, the in-place version check,
// retain_graph, and ops declared without a double backward. Every test leaves the tape empty.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <vector>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/ops.h"
#include "graft/testing/op_cases.h"
#include "test_util.h"

using namespace graft;

namespace {

// A float64 leaf that requires grad, and a constant.
Tensor leaf(const std::vector<double>& v) {
  return from_vector(v, {(int64_t)v.size()}).requires_grad_();
}
Tensor constant(const std::vector<double>& v) { return from_vector(v, {(int64_t)v.size()}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }

std::vector<double> values(const Tensor& t) {
  BOOST_REQUIRE(t.defined());
  return t.to_vector<double>();
}

// Elementwise |got - want| <= 1e-12 (1 + |want|).
void check_values(const Tensor& t, const std::vector<double>& want) {
  const std::vector<double> got = values(t);
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    BOOST_CHECK_MESSAGE(std::fabs(got[i] - want[i]) <= 1e-12 * (1 + std::fabs(want[i])),
                        "element " << i << ": got " << got[i] << ", want " << want[i]);
}

// Every test ends with nothing on the tape; one that failed half-way must not leak its graph into
// the next.
struct TapeEmptyAfter {
  ~TapeEmptyAfter() {
    BOOST_CHECK_EQUAL(autograd::tape_size(), 0u);
    autograd::clear_tape();
  }
};

// A custom op declared without a double backward: y = x^3 computed without the tape, whose
// backward 3 x^2 dout is built from ops (so it would be differentiable, but the declaration says
// not: the engine runs it without recording and refuses a second derivative through it).
GRAFT_DECLARE_OP_ONCE_DIFFERENTIABLE("test_cube_once", "test_higher_order");
Tensor cube_once(const Tensor& x) {
  Tensor y;
  {
    autograd::NoGrad ng;
    y = mul(mul(x, x), x);
  }
  if (autograd::needs_record({x}))
    autograd::record("test_cube_once", {x}, {y}, {x},
                     [](const autograd::Ctx& c, const Tensors& dout) {
                       return Tensors{mul(dout[0], mul(mul(c.saved[0], c.saved[0]), 3.0))};
                     });
  return y;
}

// A custom op y = 2 x whose backward is itself (built from graft ops, so differentiable for free);
// it writes down the Ctx each backward sees.
GRAFT_DECLARE_OP("test_twice", "test_higher_order");
struct SeenCtx {
  bool create_graph;
  int order;
};
std::vector<SeenCtx> g_seen;
Tensor twice(const Tensor& x) {
  Tensor y;
  {
    autograd::NoGrad ng;
    y = mul(x, 2.0);
  }
  if (autograd::needs_record({x}))
    autograd::record("test_twice", {x}, {y}, {}, [](const autograd::Ctx& c, const Tensors& dout) {
      g_seen.push_back({c.create_graph, c.order});
      return Tensors{twice(dout[0])};
    });
  return y;
}

// A "fused" op y = x^2 w: a raw loop forward, a raw first-order backward, and under create_graph
// the composed path through autograd::differentiate().
GRAFT_DECLARE_OP("test_fused_sq_mul", "test_higher_order");
int g_composed_calls = 0;
Tensor fused_sq_mul(const Tensor& x, const Tensor& w) {
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) y.data<double>()[i] = xv[i] * xv[i] * wv[i];
  if (autograd::needs_record({x, w}))
    autograd::record(
        "test_fused_sq_mul", {x, w}, {y}, {x, w}, [](const autograd::Ctx& c, const Tensors& dout) {
          if (c.create_graph) {
            ++g_composed_calls;
            return autograd::differentiate(
                [](const Tensors& in) { return Tensors{mul(mul(in[0], in[0]), in[1])}; }, c.saved,
                dout, c.needs);
          }
          const std::vector<double> xv = c.saved[0].to_vector<double>(),
                                    wv = c.saved[1].to_vector<double>(),
                                    d = dout[0].to_vector<double>();
          Tensor dx = Tensor::empty(c.saved[0].shape(), DType::f64),
                 dw = Tensor::empty(c.saved[1].shape(), DType::f64);
          for (size_t i = 0; i < xv.size(); ++i) {
            dx.data<double>()[i] = 2 * xv[i] * wv[i] * d[i];
            dw.data<double>()[i] = xv[i] * xv[i] * d[i];
          }
          return Tensors{c.needs[0] ? dx : Tensor(), c.needs[1] ? dw : Tensor()};
        });
  return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(higher_order_tests)

// ---- grad() -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(grad_returns_gradients_and_leaves_dot_grad_untouched) {
  TapeEmptyAfter tape;
  Tensor x = leaf({1, -2, 3}), w = leaf({0.5, 4, -1});
  w.set_grad(constant({7, 7, 7}));  // a .grad from before: grad() must not add to it
  Tensor y = mul(mul(x, x), w);     // dy/dx = 2 x w, dy/dw = x^2
  const Tensors g = autograd::grad({y}, {x, w}, {ones_like(y)});
  BOOST_REQUIRE_EQUAL(g.size(), 2u);
  check_values(g[0], {1, -16, -6});
  check_values(g[1], {1, 4, 9});
  BOOST_TEST(!g[0].requires_grad());  // without create_graph the gradients are constants
  BOOST_TEST(!x.grad().defined());
  check_values(w.grad(), {7, 7, 7});
}

BOOST_AUTO_TEST_CASE(grad_of_non_leaf_inputs) {
  TapeEmptyAfter tape;
  Tensor x = leaf({1, 2, -3});
  Tensor h = mul(x, x);          // h = x^2
  Tensor z = mul(mul(h, h), x);  // z = h^2 x = x^5
  const Tensors g = autograd::grad({z}, {h, x}, {ones_like(z)});
  // dz/dh = 2 h x (x held fixed); dz/dx = 5 x^4 (through h and directly).
  check_values(g[0], {2, 16, -54});
  check_values(g[1], {5, 80, 405});
  BOOST_TEST(!h.grad().defined());
  BOOST_TEST(!x.grad().defined());
}

BOOST_AUTO_TEST_CASE(grad_of_several_outputs_weighted_by_grad_outputs) {
  TapeEmptyAfter tape;
  Tensor x = leaf({1, 2}), y = leaf({3, -1});
  Tensor a = mul(x, y);  // da/dx = y, da/dy = x
  Tensor b = div(x, y);  // db/dx = 1/y, db/dy = -x/y^2
  Tensor ga = constant({2, -1}), gb = constant({3, 0.5});
  const Tensors g = autograd::grad({a, b}, {x, y}, {ga, gb});
  check_values(g[0], {2 * 3 + 3.0 / 3, -1 * -1 + 0.5 / -1});
  check_values(g[1], {2 * 1 - 3 * 1.0 / 9, -1 * 2 - 0.5 * 2.0 / 1});
  // An output that is itself an input (a leaf) contributes its grad_output.
  const Tensors h = autograd::grad({x}, {x}, {constant({4, 5})});
  check_values(h[0], {4, 5});
}

BOOST_AUTO_TEST_CASE(grad_with_an_input_given_twice) {
  TapeEmptyAfter tape;
  Tensor x = leaf({2, -1});
  Tensor y = mul(mul(x, x), x);  // 3 x^2
  const Tensors g = autograd::grad({y}, {x, x}, {ones_like(y)});
  BOOST_REQUIRE_EQUAL(g.size(), 2u);
  check_values(g[0], {12, 3});
  check_values(g[1], {12, 3});
}

BOOST_AUTO_TEST_CASE(grad_allow_unused_gives_undefined_otherwise_an_error_naming_the_input) {
  TapeEmptyAfter tape;
  Tensor x = leaf({1, 2}), unused = leaf({5, 6, 7});
  {
    Tensor y = mul(x, x);
    const Tensors g = autograd::grad({y}, {x, unused}, {ones_like(y)}, {.allow_unused = true});
    check_values(g[0], {2, 4});
    BOOST_TEST(!g[1].defined());
  }
  Tensor y = mul(x, x);
  BOOST_CHECK_EXCEPTION(
      autograd::grad({y}, {x, unused}, {ones_like(y)}), Error, [](const Error& e) {
        return testing::names_all(e, {"grad: input 1", "f64 (3)", "not reached", "allow_unused"});
      });
  // A non-leaf no gradient reaches: y does not lead to h.
  Tensor h = mul(unused, unused), z = mul(x, x);
  const Tensors g = autograd::grad({z}, {h}, {ones_like(z)}, {.allow_unused = true});
  BOOST_TEST(!g[0].defined());
  autograd::clear_tape();  // h's entry: no pass ran through it
}

BOOST_AUTO_TEST_CASE(grad_argument_errors) {
  TapeEmptyAfter tape;
  Tensor x = leaf({1, 2, 3});
  Tensor y = mul(x, x);
  Tensor c = constant({1, 2, 3});
  auto g1 = ones_like(y);
  BOOST_CHECK_EXCEPTION(autograd::grad({}, {x}), Error,
                        [](const Error& e) { return testing::names_all(e, {"grad: no outputs"}); });
  BOOST_CHECK_EXCEPTION(autograd::grad({y}, {}, {g1}), Error,
                        [](const Error& e) { return testing::names_all(e, {"grad: no inputs"}); });
  BOOST_CHECK_EXCEPTION(autograd::grad({Tensor()}, {x}), Error, [](const Error& e) {
    return testing::names_all(e, {"grad: output 0", "undefined"});
  });
  BOOST_CHECK_EXCEPTION(autograd::grad({y, c}, {x}, {g1, g1}), Error, [](const Error& e) {
    return testing::names_all(e, {"grad: output 1", "f64 (3)", "does not require grad"});
  });
  BOOST_CHECK_EXCEPTION(autograd::grad({y}, {x, Tensor()}, {g1}), Error, [](const Error& e) {
    return testing::names_all(e, {"grad: input 1", "undefined"});
  });
  BOOST_CHECK_EXCEPTION(autograd::grad({y}, {c}, {g1}), Error, [](const Error& e) {
    return testing::names_all(e, {"grad: input 0", "f64 (3)", "does not require grad"});
  });
  BOOST_CHECK_EXCEPTION(autograd::grad({y}, {x}, {g1, g1}), Error, [](const Error& e) {
    return testing::names_all(e, {"grad", "2 grad_outputs for 1 outputs"});
  });
  BOOST_CHECK_EXCEPTION(autograd::grad({y}, {x}, {constant({1, 1})}), Error, [](const Error& e) {
    return testing::names_all(e, {"grad", "f64 (2)", "does not match output 0", "f64 (3)"});
  });
  BOOST_CHECK_EXCEPTION(
      autograd::grad({y}, {x}, {ones({3}, DType::f32)}), Error, [](const Error& e) {
        return testing::names_all(e, {"grad", "f32 (3)", "does not match output 0"});
      });
  BOOST_CHECK_EXCEPTION(autograd::grad({y}, {x}), Error, [](const Error& e) {
    return testing::names_all(e, {"grad: output 0", "not a scalar"});
  });
  // None of these ran a pass: the graph is still whole, and a correct call works.
  check_values(autograd::grad({y}, {x}, {g1})[0], {2, 4, 6});
}

BOOST_AUTO_TEST_CASE(grad_without_retain_graph_frees_the_graph_with_it_keeps_it) {
  TapeEmptyAfter tape;
  Tensor x = leaf({3});
  Tensor y = mul(mul(x, x), x);
  check_values(autograd::grad({y}, {x})[0], {27});
  BOOST_TEST(autograd::tape_size() == 0u);
  BOOST_CHECK_EXCEPTION(autograd::grad({y}, {x}), Error, [](const Error& e) {
    return testing::names_all(e, {"already freed", "retain_graph"});
  });

  Tensor z = mul(mul(x, x), x);
  check_values(autograd::grad({z}, {x}, {}, {.retain_graph = true})[0], {27});
  BOOST_TEST(autograd::tape_size() == 2u);
  check_values(autograd::grad({z}, {x}, {}, {.retain_graph = true})[0], {27});
  z.backward();  // the kept graph serves backward() too, which then frees it
  check_values(x.grad(), {27});
  BOOST_TEST(autograd::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(create_graph_implies_retain_graph) {
  TapeEmptyAfter tape;
  Tensor x = leaf({2});
  Tensor y = mul(mul(x, x), x);
  const size_t forward_entries = autograd::tape_size();
  const Tensor g = autograd::grad({y}, {x}, {}, {.create_graph = true})[0];  // 3 x^2, recorded
  BOOST_TEST(g.requires_grad());
  BOOST_TEST(autograd::tape_size() > forward_entries);  // the forward's entries and g's
  // The first graph is still there: a plain grad() through it works, and frees it.
  check_values(autograd::grad({y}, {x})[0], {12});
  // g's own entries are still on the tape, but part of g's graph was the forward's (g = 3 x^2 reads
  // x * x): differentiating g now is the 'already freed' error, as in PyTorch, and that failed pass
  // drops what is left.
  BOOST_TEST(autograd::tape_size() > 0u);
  BOOST_CHECK_EXCEPTION(autograd::grad({g}, {x}), Error, [](const Error& e) {
    return testing::names_all(e, {"already freed", "retain_graph"});
  });
}

// ---- create_graph: derivatives of every order ---------------------------------------------------

BOOST_AUTO_TEST_CASE(second_and_third_derivative_of_a_cube) {
  TapeEmptyAfter tape;
  Tensor x = leaf({2, -1.5, 0.25});
  Tensor y = mul(mul(x, x), x);  // elementwise, so grad_outputs of ones give each d/dx_i
  const Tensor g1 = autograd::grad({y}, {x}, {ones_like(y)}, {.create_graph = true})[0];
  check_values(g1, {12, 6.75, 0.1875});  // 3 x^2
  BOOST_TEST(g1.requires_grad());
  const Tensor g2 = autograd::grad({g1}, {x}, {ones_like(g1)}, {.create_graph = true})[0];
  check_values(g2, {12, -9, 1.5});  // 6 x
  BOOST_TEST(g2.requires_grad());
  const Tensor g3 = autograd::grad({g2}, {x}, {ones_like(g2)})[0];
  check_values(g3, {6, 6, 6});
  BOOST_TEST(!g3.requires_grad());
}

BOOST_AUTO_TEST_CASE(fourth_order_of_x_to_the_fifth) {
  TapeEmptyAfter tape;
  Tensor x = leaf({1.5, -0.5});
  Tensor x2 = mul(x, x);
  Tensor y = mul(mul(x2, x2), x);  // x^5
  Tensor g = y;
  for (int k = 0; k < 3; ++k)
    g = autograd::grad({g}, {x}, {ones_like(g)}, {.create_graph = true})[0];
  check_values(g, {60 * 1.5 * 1.5, 60 * 0.25});  // 60 x^2
  g = autograd::grad({g}, {x}, {ones_like(g)})[0];
  check_values(g, {180, -60});  // 120 x
}

BOOST_AUTO_TEST_CASE(second_derivative_of_a_rational_function) {
  TapeEmptyAfter tape;
  // f = x / (1 + x^2): f' = (1 - x^2) / (1 + x^2)^2, f'' = 2 x (x^2 - 3) / (1 + x^2)^3.
  // The denominator is built with the binary add of a constant tensor and with add(x, double).
  const std::vector<double> xs{0.5, -2, 3};
  Tensor x = leaf(xs);
  Tensor f = div(x, add(mul(x, x), constant({1, 1, 1})));
  Tensor f2 = div(mul(x, 2.0), add(mul(x, x), 1.0));  // 2 x / (1 + x^2), through affine
  const Tensors g1 =
      autograd::grad({f, f2}, {x}, {ones_like(f), constant({0, 0, 0})}, {.create_graph = true});
  const Tensor g2 = autograd::grad({g1[0]}, {x}, {ones_like(x)}, {.create_graph = true})[0];
  std::vector<double> d1, d2;
  for (double v : xs) {
    const double q = 1 + v * v;
    d1.push_back((1 - v * v) / (q * q));
    d2.push_back(2 * v * (v * v - 3) / (q * q * q));
  }
  check_values(g1[0], d1);
  check_values(g2, d2);
  // The same through f2 = 2 f, weighted 0.5, with a shared upstream gradient.
  const Tensors h1 = autograd::grad({f2}, {x}, {constant({0.5, 0.5, 0.5})}, {.create_graph = true});
  check_values(h1[0], d1);
  check_values(autograd::grad({h1[0]}, {x}, {ones_like(x)})[0], d2);
}

BOOST_AUTO_TEST_CASE(mixed_partials_of_x_y_squared) {
  TapeEmptyAfter tape;
  // f = x y^2: fx = y^2, fy = 2 x y, fxy = fyx = 2 y, fyy = 2 x, fxx = 0 (x does not reach fx).
  Tensor x = leaf({1.5, -2}), y = leaf({3, 0.5});
  Tensor f = mul(mul(x, y), y);
  const Tensors g = autograd::grad({f}, {x, y}, {ones_like(f)}, {.create_graph = true});
  check_values(g[0], {9, 0.25});
  check_values(g[1], {9, -2});
  const Tensors from_fx =
      autograd::grad({g[0]}, {x, y}, {ones_like(x)}, {.retain_graph = true, .allow_unused = true});
  BOOST_TEST(!from_fx[0].defined());  // fxx: no path, as torch's None
  check_values(from_fx[1], {6, 1});   // fxy = 2 y
  const Tensors from_fy = autograd::grad({g[1]}, {x, y}, {ones_like(y)});
  check_values(from_fy[0], {6, 1});   // fyx = 2 y
  check_values(from_fy[1], {3, -4});  // fyy = 2 x
}

BOOST_AUTO_TEST_CASE(third_order_mixed_partial) {
  TapeEmptyAfter tape;
  // f = x^3 y^2: d3f/dx2dy = 12 x y, d3f/dxdy2 = 6 x^2.
  Tensor x = leaf({2}), y = leaf({-1.5});
  Tensor f = mul(mul(mul(x, x), x), mul(y, y));
  const Tensor fx = autograd::grad({f}, {x}, {}, {.create_graph = true})[0];
  const Tensor fxx = autograd::grad({fx}, {x}, {}, {.create_graph = true})[0];
  const Tensor fxy = autograd::grad({fx}, {y}, {}, {.create_graph = true})[0];
  check_values(fx, {3 * 4 * 2.25});
  check_values(fxx, {6 * 2 * 2.25});
  check_values(fxy, {3 * 4 * 2 * -1.5});
  const Tensors third = autograd::grad({fxx, fxy}, {y}, {ones({1}, DType::f64), constant({2})});
  check_values(third[0], {12 * 2 * -1.5 + 2 * 6 * 4});
}

BOOST_AUTO_TEST_CASE(broadcast_gradients_are_summed_by_recorded_ops) {
  TapeEmptyAfter tape;
  // x (3) broadcast against A (2, 3): y = x^2 A, so dL/dx = 2 x colsum(A) for L = sum(y), summed
  // down by the engine's reduce_grad; its second derivative goes back through expand_grad.
  Tensor x = leaf({1, -2, 0.5});
  Tensor A = from_vector(std::vector<double>{1, 2, 3, -4, 0.5, 1}, {2, 3});
  Tensor y = mul(mul(x, x), A);
  const Tensor g = autograd::grad({y}, {x}, {ones({2, 3}, DType::f64)}, {.create_graph = true})[0];
  BOOST_TEST(g.shape() == (Shape{3}));
  check_values(g, {2 * 1 * -3, 2 * -2 * 2.5, 2 * 0.5 * 4});
  const Tensor v = constant({1, 2, -1});
  check_values(autograd::grad({g}, {x}, {v})[0], {2 * -3 * 1, 2 * 2.5 * 2, 2 * 4 * -1});
  // And the other way round: a gradient of A's shape flowing to a (2, 1) column, twice.
  Tensor c = from_vector(std::vector<double>{2, -1}, {2, 1}).requires_grad_();
  Tensor z = mul(mul(c, c), A);  // dz/dc = 2 c rowsum(A), d2 = 2 rowsum(A)
  const Tensor gc = autograd::grad({z}, {c}, {ones({2, 3}, DType::f64)}, {.create_graph = true})[0];
  BOOST_TEST(gc.shape() == (Shape{2, 1}));
  check_values(gc, {2 * 2 * 6, 2 * -1 * -2.5});
  check_values(autograd::grad({gc}, {c}, {ones({2, 1}, DType::f64)})[0], {12, -5});
}

BOOST_AUTO_TEST_CASE(backward_with_create_graph_leaves_a_differentiable_grad) {
  TapeEmptyAfter tape;
  Tensor x = leaf({2, -1});
  Tensor y = mul(mul(x, x), x);
  y.backward(ones_like(y), false, /*create_graph=*/true);
  const Tensor gx = x.grad();
  check_values(gx, {12, 3});
  BOOST_TEST(gx.requires_grad());
  BOOST_TEST(!gx.is_leaf());
  // A second backward(create_graph) accumulates through the recorded accumulate_grad: .grad is
  // then 2 * 3 x^2 and still differentiable, to 12 x.
  Tensor y2 = mul(mul(x, x), x);
  y2.backward(ones_like(y2), false, true);
  check_values(x.grad(), {24, 6});
  const Tensor h = autograd::grad({x.grad()}, {x}, {ones_like(x)})[0];
  check_values(h, {24, -12});
  // grad() did not add to the .grad it differentiated.
  check_values(x.grad(), {24, 6});
  x.zero_grad();
  autograd::clear_tape();  // y's first graph: the pass above went through its entries but kept none
}

// add hands one dout to both inputs: under create_graph each leaf's .grad is a buffer of its own,
// and a later plain backward adds to a .grad on a graph out of place, so neither changes the other.
BOOST_AUTO_TEST_CASE(create_graph_grads_of_two_leaves_do_not_share_a_buffer) {
  TapeEmptyAfter tape;
  Tensor a = leaf({1, 2}), b = leaf({3, 4});
  Tensor y = add(a, b);
  y.backward(ones_like(y), false, /*create_graph=*/true);
  const Tensor gb = b.grad();
  BOOST_TEST(!a.grad().same_storage(b.grad()));
  Tensor z = mul(a, a);
  z.backward(ones_like(z));  // plain: a.grad = 1 + 2a
  check_values(a.grad(), {3, 5});
  check_values(b.grad(), {1, 1});
  check_values(gb, {1, 1});
  a.zero_grad();
  b.zero_grad();
  autograd::clear_tape();  // y's graph, kept by create_graph
}

// The engine's own ops refuse what they cannot sum or broadcast, naming themselves.
BOOST_AUTO_TEST_CASE(engine_ops_refuse_bad_shapes) {
  const Tensor a = constant({1, 2, 3}), b = constant({1, 2});
  BOOST_CHECK_EXCEPTION(autograd::accumulate_grad(a, b), Error, [](const Error& e) {
    return testing::names_all(e, {"accumulate_grad", "(3)", "(2)"});
  });
  BOOST_CHECK_EXCEPTION(autograd::reduce_grad(a, {2}), Error, [](const Error& e) {
    return testing::names_all(e, {"reduce_grad", "cannot reduce", "(2)"});
  });
  BOOST_CHECK_EXCEPTION(autograd::expand_grad(a, {4, 2}), Error, [](const Error& e) {
    return testing::names_all(e, {"expand_grad", "cannot broadcast", "(4, 2)"});
  });
  BOOST_CHECK_EXCEPTION(autograd::accumulate_grad(from_vector(std::vector<int64_t>{1}, {1}), b),
                        Error, [](const Error& e) {
                          return testing::names_all(e, {"accumulate_grad", "float"});
                        });
}

BOOST_AUTO_TEST_CASE(hessian_vector_product_of_a_quadratic_form) {
  TapeEmptyAfter tape;
  // f(x) = x^T A x + b^T x for a non-symmetric A: grad = (A + A^T) x + b, H = A + A^T.
  const double A[3][3] = {{1, 2, 0}, {0.5, 3, -1}, {1, 0, 2}};
  const double b[3] = {1, -2, 0.5}, xv[3] = {0.5, -1, 2}, v[3] = {1, 0.5, -2};
  Tensors x;
  for (double e : xv) x.push_back(leaf({e}));
  Tensor f = mul(x[0], constant({b[0]}));
  for (int i = 1; i < 3; ++i) f = add(f, mul(x[i], constant({b[i]})));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      if (A[i][j] != 0) f = add(f, mul(mul(x[i], x[j]), constant({A[i][j]})));
  const Tensors g = autograd::grad({f}, x, {}, {.create_graph = true});
  // g . v, then its gradient: H v.
  Tensor gv = mul(g[0], constant({v[0]}));
  for (int i = 1; i < 3; ++i) gv = add(gv, mul(g[i], constant({v[i]})));
  const Tensors hv = autograd::grad({gv}, x);
  for (int i = 0; i < 3; ++i) {
    double gi = b[i], hvi = 0;
    for (int j = 0; j < 3; ++j) {
      gi += (A[i][j] + A[j][i]) * xv[j];
      hvi += (A[i][j] + A[j][i]) * v[j];
    }
    check_values(g[i], {gi});
    check_values(hv[i], {hvi});
  }
}

BOOST_AUTO_TEST_CASE(hessian_vector_product_through_matmul_and_sum) {
  TapeEmptyAfter tape;
  // The same form on a (3, 1) column: f = sum(x * (A x)) + sum(b * x), through matmul's and sum's
  // composed backwards under create_graph.
  const std::vector<double> Av{1, 2, 0, 0.5, 3, -1, 1, 0, 2};
  Tensor A = from_vector(Av, {3, 3});
  Tensor b = from_vector(std::vector<double>{1, -2, 0.5}, {3, 1});
  Tensor x = from_vector(std::vector<double>{0.5, -1, 2}, {3, 1}).requires_grad_();
  Tensor v = from_vector(std::vector<double>{1, 0.5, -2}, {3, 1});
  Tensor f = add(sum(mul(x, matmul(A, x))), sum(mul(b, x)));
  const Tensor g = autograd::grad({f}, {x}, {}, {.create_graph = true})[0];
  BOOST_TEST(g.shape() == (Shape{3, 1}));
  const Tensor hv = autograd::grad({sum(mul(g, v))}, {x})[0];
  const std::vector<double> xv = x.to_vector<double>(), vv = v.to_vector<double>(),
                            bv = b.to_vector<double>();
  std::vector<double> want_g(3), want_hv(3);
  for (int i = 0; i < 3; ++i) {
    want_g[i] = bv[i];
    for (int j = 0; j < 3; ++j) {
      want_g[i] += (Av[i * 3 + j] + Av[j * 3 + i]) * xv[j];
      want_hv[i] += (Av[i * 3 + j] + Av[j * 3 + i]) * vv[j];
    }
  }
  check_values(g, want_g);
  check_values(hv, want_hv);
}

BOOST_AUTO_TEST_CASE(gradient_penalty) {
  TapeEmptyAfter tape;
  // L = w . x^2, dL/dx = 2 w x, penalty P = |dL/dx|^2 = 4 w^2 x^2: dP/dw = 8 w x^2, dP/dx = 8 w^2
  // x.
  Tensor x = leaf({1, -2, 0.5}), w = leaf({0.5, 1, -3});
  Tensor L = mul(w, mul(x, x));
  const Tensor gx = autograd::grad({L}, {x}, {ones_like(L)}, {.create_graph = true})[0];
  Tensor P = mul(gx, gx);
  P.backward(ones_like(P));
  check_values(w.grad(), {8 * 0.5 * 1, 8 * 1 * 4, 8 * -3 * 0.25});
  check_values(x.grad(), {8 * 0.25 * 1, 8 * 1 * -2, 8 * 9 * 0.5});
}

BOOST_AUTO_TEST_CASE(gradgradcheck_of_small_compositions) {
  TapeEmptyAfter tape;
  Generator gen(7);
  const Tensors in{case_input({2, 3}, DType::f64, gen, 0.5, 1.5),
                   case_input({3}, DType::f64, gen, 0.5, 1.5)};
  const auto r = gradgradcheck(
      [](const Tensors& t) { return div(mul(mul(t[0], t[1]), t[0]), add(sub(t[1], t[0]), 3.0)); },
      in);
  BOOST_TEST(r.ok, r.message);
}

// ---- the rules through the second order ---------------------------------------------------------

BOOST_AUTO_TEST_CASE(anomaly_mode_names_a_nan_of_the_second_backward) {
  TapeEmptyAfter tape;
  // f = x / y at y = 0: the forward and the first gradient 1 / y are Inf (anomaly mode is off for
  // them); the second backward of the recorded div(dout, y), seeded with 0, computes 0 / 0.
  Tensor x = leaf({1}), y = leaf({0});
  Tensor f = div(x, y);
  const Tensor fx = autograd::grad({f}, {x}, {}, {.create_graph = true})[0];
  BOOST_TEST(std::isinf(values(fx)[0]));
  {
    autograd::AnomalyMode on;
    BOOST_CHECK_EXCEPTION(autograd::grad({fx}, {y}, {constant({0})}), Error, [](const Error& e) {
      return testing::names_all(e,
                                {"anomaly: second backward of 'div'", "f64 (1)", "produced NaN"});
    });
  }
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(anomaly_mode_names_an_overflow_of_the_second_backward) {
  TapeEmptyAfter tape;
  autograd::AnomalyMode on;  // on throughout: the forward and the first order are finite
  // f = x / y with x = y = 1e-160: f = 1, df/dy = -x / y^2 = -1e160, d2f/dy2 = 2 x / y^3 overflows.
  Tensor x = leaf({1e-160}), y = leaf({1e-160});
  Tensor f = div(x, y);
  const Tensor fy = autograd::grad({f}, {y}, {}, {.create_graph = true})[0];
  check_values(fy, {-1e160});
  BOOST_CHECK_EXCEPTION(autograd::grad({fy}, {y}), Error, [](const Error& e) {
    return testing::names_all(e, {"anomaly: second backward of '", "produced Inf"});
  });
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(in_place_change_caught_by_the_second_backward) {
  TapeEmptyAfter tape;
  // f = h^2 with h = x c: the first backward records dx = dh * c (dh = 2 h requires grad), an entry
  // of the second order that saved c, so writing c before differentiating dx is caught there (it
  // runs before the forward's own mul(x, c), which saved c as well).
  Tensor x = leaf({1, 2}), c = constant({3, 4});
  Tensor h = mul(x, c);
  Tensor f = mul(h, h);
  const Tensor g = autograd::grad({f}, {x}, {ones_like(f)}, {.create_graph = true})[0];  // 2 x c^2
  check_values(g, {18, 64});
  fill_(c, 5.0);
  BOOST_CHECK_EXCEPTION(autograd::grad({g}, {x}, {ones_like(g)}), Error, [](const Error& e) {
    return testing::names_all(e, {"second backward of 'mul'", "saved tensor 1", "f64 (2)",
                                  "modified in place", "version 0 -> 1"});
  });
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_constant_read_by_the_first_backward_may_change_after_it) {
  TapeEmptyAfter tape;
  // f = x^2 c: dx = (dout c) x2 where dout c needs no grad (neither requires it), so it is
  // computed, not recorded, and no entry keeps c: writing c afterwards changes nothing (as in
  // PyTorch). d2f/dx2 = 2 c with the old c.
  Tensor x = leaf({1, 2}), c = constant({3, 4});
  Tensor f = mul(mul(x, x), c);
  const Tensor g = autograd::grad({f}, {x}, {ones_like(f)}, {.create_graph = true})[0];
  check_values(g, {6, 16});
  fill_(c, 5.0);
  check_values(autograd::grad({g}, {x}, {ones_like(g)})[0], {6, 8});
}

BOOST_AUTO_TEST_CASE(in_place_change_caught_in_a_first_order_entry_during_the_second_pass) {
  TapeEmptyAfter tape;
  // dz/dh = 2 h for z = h^2, h = x c: the gradient with respect to the non-leaf h never passes
  // through h's entry, but the second derivative d(2h)/dx does, and that forward entry saved c.
  Tensor x = leaf({1, 2}), c = constant({3, 4});
  Tensor h = mul(x, c);
  Tensor z = mul(h, h);
  const Tensor gh = autograd::grad({z}, {h}, {ones_like(z)}, {.create_graph = true})[0];
  check_values(gh, {6, 16});
  fill_(c, 5.0);
  // Under create_graph the message names the order of the entry that failed: the first.
  BOOST_CHECK_EXCEPTION(autograd::grad({gh}, {x}, {ones_like(gh)}, {.create_graph = true}), Error,
                        [](const Error& e) {
                          return testing::names_all(e, {"first backward of 'mul'", "saved tensor 1",
                                                        "modified in place", "version 0 -> 1"});
                        });
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(retain_graph_at_the_second_order) {
  TapeEmptyAfter tape;
  Tensor x = leaf({2, 3});
  Tensor y = mul(mul(x, x), x);
  const Tensor g = autograd::grad({y}, {x}, {ones_like(y)}, {.create_graph = true})[0];
  // Twice through the second-order graph with retain_graph, then once more without.
  check_values(autograd::grad({g}, {x}, {ones_like(g)}, {.retain_graph = true})[0], {12, 18});
  check_values(autograd::grad({g}, {x}, {constant({1, -1})}, {.retain_graph = true})[0], {12, -18});
  g.backward(ones_like(g));  // backward() through it too: .grad gets 6 x
  check_values(x.grad(), {12, 18});
  BOOST_TEST(autograd::tape_size() == 0u);
  BOOST_CHECK_EXCEPTION(autograd::grad({g}, {x}, {ones_like(g)}), Error, [](const Error& e) {
    return testing::names_all(e, {"already freed", "retain_graph"});
  });
}

BOOST_AUTO_TEST_CASE(an_op_declared_without_a_double_backward) {
  TapeEmptyAfter tape;
  bool declared = false;
  for (const auto& d : autograd::declared_ops())
    if (d.name == "test_cube_once")
      declared = !d.double_backward && d.family == "test_higher_order";
  BOOST_TEST(declared);
  Tensor x = leaf({2, -1});
  {  // first order, plain
    Tensor y = cube_once(x);
    check_values(autograd::grad({y}, {x}, {ones_like(y)})[0], {12, 3});
  }
  // First order under create_graph works; the second derivative is an error naming the op.
  Tensor y = cube_once(x);
  const Tensor g = autograd::grad({y}, {x}, {ones_like(y)}, {.create_graph = true})[0];
  check_values(g, {12, 3});
  BOOST_TEST(g.requires_grad());
  BOOST_CHECK_EXCEPTION(autograd::grad({g}, {x}, {ones_like(g)}), Error, [](const Error& e) {
    return testing::names_all(
        e, {"second backward of 'test_cube_once'", "declared without a double backward"});
  });
  // Through a composition too, and by backward().
  Tensor z = mul(cube_once(x), x);  // z = x^4, z' = 4 x^3 (partly through the op)
  z.backward(ones_like(z), false, true);
  check_values(x.grad(), {32, -4});
  BOOST_CHECK_EXCEPTION(x.grad().backward(ones_like(x)), Error, [](const Error& e) {
    return testing::names_all(
        e, {"second backward of 'test_cube_once'", "declared without a double backward"});
  });
  x.zero_grad();
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(ctx_tells_a_backward_create_graph_and_its_order) {
  TapeEmptyAfter tape;
  Tensor x = leaf({1.5, -1});
  g_seen.clear();
  {
    Tensor y = twice(x);
    y.backward(ones_like(y));  // plain: not under create_graph, first order
  }
  BOOST_REQUIRE_EQUAL(g_seen.size(), 1u);
  BOOST_TEST(!g_seen[0].create_graph);
  BOOST_TEST(g_seen[0].order == 1);
  check_values(x.grad(), {2, 2});
  x.zero_grad();
  // Under create_graph with an upstream gradient v that requires grad, the backward's own
  // twice(v) is recorded as a second-order entry; differentiating it runs that entry at order 2.
  g_seen.clear();
  Tensor v = leaf({1, 3});
  Tensor y = twice(x);
  const Tensor g = autograd::grad({y}, {x}, {v}, {.create_graph = true})[0];  // 2 v
  check_values(g, {2, 6});
  BOOST_TEST(g.requires_grad());
  const Tensor gv = autograd::grad({g}, {v}, {constant({1, -1})}, {.create_graph = true})[0];
  check_values(gv, {2, -2});
  BOOST_REQUIRE_EQUAL(g_seen.size(), 2u);
  BOOST_TEST(g_seen[0].create_graph);
  BOOST_TEST(g_seen[0].order == 1);
  BOOST_TEST(g_seen[1].create_graph);
  BOOST_TEST(g_seen[1].order == 2);
  autograd::clear_tape();  // y's entry: the second pass stopped at v and kept the rest
}

BOOST_AUTO_TEST_CASE(a_fused_op_differentiable_through_differentiate) {
  TapeEmptyAfter tape;
  Tensor x = leaf({2, -1}), w = leaf({0.5, 3});
  g_composed_calls = 0;
  {  // first order: the raw path
    Tensor y = fused_sq_mul(x, w);
    const Tensors g = autograd::grad({y}, {x, w}, {ones_like(y)});
    check_values(g[0], {2, -6});
    check_values(g[1], {4, 1});
    BOOST_TEST(g_composed_calls == 0);
  }
  Tensor y = fused_sq_mul(x, w);
  const Tensors g = autograd::grad({y}, {x, w}, {ones_like(y)}, {.create_graph = true});
  BOOST_TEST(g_composed_calls == 1);
  check_values(g[0], {2, -6});  // 2 x w
  check_values(g[1], {4, 1});   // x^2
  BOOST_TEST(g[0].requires_grad());
  // d(2 x w)/dx = 2 w, d(2 x w)/dw = 2 x; d(x^2)/dx = 2 x.
  const Tensors h = autograd::grad({g[0], g[1]}, {x, w}, {ones_like(x), constant({1, 2})});
  check_values(h[0], {2 * 0.5 + 2 * 2, 2 * 3 + 2 * -1 * 2});
  check_values(h[1], {4, -2});
  // The check against finite differences, at second order.
  const auto r = gradgradcheck([](const Tensors& t) { return fused_sq_mul(t[0], t[1]); },
                               {leaf({0.3, -0.7, 1.1}), leaf({1.5, 0.2, -0.4})});
  BOOST_TEST(r.ok, r.message);
  // Outside a backward under create_graph (grad mode off) differentiate() refuses to run.
  autograd::NoGrad ng;
  BOOST_CHECK_EXCEPTION(
      autograd::differentiate([](const Tensors& in) { return Tensors{mul(in[0], in[0])}; }, {x},
                              {ones_like(x)}, {true}),
      Error, [](const Error& e) {
        return testing::names_all(e, {"differentiate", "grad mode off"});
      });
}

BOOST_AUTO_TEST_SUITE_END()
