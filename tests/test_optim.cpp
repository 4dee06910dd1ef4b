#include <boost/test/unit_test.hpp>

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/tensor.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/optim.h"
#include "tests/test_util.h"

using namespace graft;
using namespace graft::train;

namespace {

Tensor param(const std::vector<double>& v, const Shape& shape, DType dt = DType::f64) {
  Tensor t = cast_copy(from_vector(v, shape), dt);
  t.requires_grad_();
  return t;
}
void give_grad(const Tensor& p, const std::vector<double>& g) {
  Tensor(p).set_grad(cast_copy(from_vector(g, p.shape()), p.dtype()));
}
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    BOOST_CHECK_MESSAGE(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])),
                        "element " << i << ": got " << got[i] << ", want " << want[i]);
}

// Runs f and checks it throws a graft::Error whose message contains `needle`.
void check_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    BOOST_CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos,
                        "message '" << e.what() << "' lacks '" << needle << "'");
    return;
  }
  BOOST_ERROR("no graft::Error thrown; expected one containing '" << needle << "'");
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.numel() * dtype_size(a.dtype())) == 0;
}

// Gradient of f(x) = sum_i 0.5 * a_i * (x_i - c_i)^2 + 0.1 * cos(x_i), with a_i in [1, 4] and
// c_i spread over [-1, 1]: smooth, well conditioned, and not linear in x (so every step differs).
template <class T>
void quad_grad_t(const Tensor& p, bool cosine) {
  Tensor g = p.grad();
  if (!g.defined()) {
    g = zeros(p.shape(), p.dtype());
    Tensor(p).set_grad(g);
  }
  const T* x = p.data<T>();
  T* d = g.data<T>();
  for (int64_t i = 0; i < p.numel(); ++i) {
    const double a = 1 + 3.0 * (i % 7) / 6, c = -1 + 2.0 * (i % 11) / 10;
    d[i] = (T)(a * (x[i] - c) - (cosine ? 0.1 * std::sin((double)x[i]) : 0));
  }
}
void quad_grad(const Tensor& p, bool cosine = true) {
  if (p.dtype() == DType::f32) quad_grad_t<float>(p, cosine);
  else quad_grad_t<double>(p, cosine);
}
double quad_dist(const Tensor& p) {
  const auto x = vals(p);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - (-1 + 2.0 * (i % 11) / 10)));
  return worst;
}

using graft::testing::TempDir;

}  // namespace

BOOST_AUTO_TEST_SUITE(optim)

// ---- single steps, worked by hand ----

BOOST_AUTO_TEST_CASE(sgd_plain_and_weight_decay) {
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    Tensor p = param({1, 2}, {2}, dt);
    SGD opt({{"p", p}}, 0.1);
    give_grad(p, {0.5, -1});
    const uint64_t v0 = p.version();
    opt.step();
    check_close(vals(p), {0.95, 2.1}, tol);  // p - lr*g
    BOOST_CHECK_GT(p.version(), v0);
    BOOST_CHECK_EQUAL(opt.step_count(), 1);

    // d = g + wd*p = 1 + 0.1*2 = 1.2; p = 2 - 0.5*1.2
    Tensor q = param({2}, {1}, dt);
    SGD wd({{"q", q}}, 0.5, 0, 0.1);
    give_grad(q, {1});
    wd.step();
    check_close(vals(q), {1.4}, tol);
  }
}

BOOST_AUTO_TEST_CASE(sgd_momentum_and_nesterov) {
  // lr 0.1, momentum 0.9, grads 1 then 2.
  // momentum: buf = 1, p = 0.9; buf = 0.9 + 2 = 2.9, p = 0.9 - 0.29 = 0.61
  // nesterov: buf = 1, d = 1 + 0.9 = 1.9, p = 0.81; buf = 2.9, d = 2 + 2.61 = 4.61, p = 0.349
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    Tensor a = param({1}, {1}, dt), b = param({1}, {1}, dt);
    SGD mom({{"a", a}}, 0.1, 0.9), nes({{"b", b}}, 0.1, 0.9, 0, true);
    give_grad(a, {1});
    give_grad(b, {1});
    mom.step();
    nes.step();
    check_close(vals(a), {0.9}, tol);
    check_close(vals(b), {0.81}, tol);
    give_grad(a, {2});
    give_grad(b, {2});
    mom.step();
    nes.step();
    check_close(vals(a), {0.61}, tol);
    check_close(vals(b), {0.349}, tol);
    check_close(vals(mom.state_tensors().at(0).second), {2.9}, tol);
    BOOST_CHECK_EQUAL(mom.state_tensors().at(0).first, "a.momentum_buffer");
  }
  // Weight decay goes into the momentum buffer: d = 1 + 0.5*2 = 2, buf = 2, p = 2 - 0.2
  Tensor c = param({2}, {1});
  SGD wd({{"c", c}}, 0.1, 0.9, 0.5);
  give_grad(c, {1});
  wd.step();
  check_close(vals(c), {1.8}, 1e-14);
  // second step: d = 1 + 0.5*1.8 = 1.9, buf = 0.9*2 + 1.9 = 3.7, p = 1.8 - 0.37
  wd.step();
  check_close(vals(c), {1.43}, 1e-14);
}

BOOST_AUTO_TEST_CASE(adam_bias_correction) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8; g = 0.5 then -1.
  // step 1: m = 0.05, v = 2.5e-4, m^ = 0.5, v^ = 0.25, p = 1 - 0.1*0.5/(0.5 + 1e-8)
  // step 2: m = -0.055, v = 1.24975e-3, m^ = -0.055/0.19, v^ = 1.24975e-3/1.999e-3
  const double p1 = 1 - 0.1 * 0.5 / (0.5 + 1e-8);
  const double p2 = p1 - 0.1 * (-0.055 / 0.19) / (std::sqrt(1.24975e-3 / 1.999e-3) + 1e-8);
  BOOST_CHECK_CLOSE(p1, 0.900000002, 1e-9);
  BOOST_CHECK_CLOSE(p2, 0.9366103542405654, 1e-9);
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-13 : 1e-6;
    Tensor p = param({1}, {1}, dt);
    Adam opt({{"p", p}}, 0.1);
    give_grad(p, {0.5});
    opt.step();
    check_close(vals(p), {p1}, tol);
    auto st = opt.state_tensors();
    BOOST_REQUIRE_EQUAL(st.size(), 2u);
    BOOST_CHECK_EQUAL(st[0].first, "p.exp_avg");
    BOOST_CHECK_EQUAL(st[1].first, "p.exp_avg_sq");
    check_close(vals(st[0].second), {0.05}, tol);
    check_close(vals(st[1].second), {2.5e-4}, tol);
    give_grad(p, {-1});
    opt.step();
    check_close(vals(p), {p2}, tol);
    check_close(vals(st[0].second), {-0.055}, tol);
    check_close(vals(st[1].second), {1.24975e-3}, tol);
  }
  // L2: Adam adds wd*p to the grad: g = 0.5 + 0.1*2 = 0.7, so step 1 still moves by ~lr, and
  // the moments see 0.7.
  Tensor q = param({2}, {1});
  Adam l2({{"q", q}}, 0.1, 0.9, 0.999, 1e-8, 0.1);
  give_grad(q, {0.5});
  l2.step();
  check_close(vals(q), {2 - 0.1 * 0.7 / (0.7 + 1e-8)}, 1e-14);
  check_close(vals(l2.state_tensors()[0].second), {0.07}, 1e-14);
}

BOOST_AUTO_TEST_CASE(adamw_decoupled_decay) {
  // p = 2 * (1 - 0.1*0.1) = 1.98, then the plain Adam step on g = 0.5 (moments see 0.5 only).
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    Tensor p = param({2, -4}, {2}, dt);
    AdamW opt({{"p", p}}, 0.1, 0.9, 0.999, 1e-8, 0.1);
    BOOST_CHECK_EQUAL(std::string(opt.name()), "AdamW");
    give_grad(p, {0.5, 0.5});
    opt.step();
    check_close(vals(p), {1.98 - 0.1 * 0.5 / (0.5 + 1e-8), -3.96 - 0.1 * 0.5 / (0.5 + 1e-8)}, tol);
    check_close(vals(opt.state_tensors()[0].second), {0.05, 0.05}, tol);
  }
  // The default weight decay is 1e-2 and a zero grad still decays: p = 1 * (1 - 1e-3*1e-2)
  // (m = v = 0 so the Adam term is 0 / (0 + eps) = 0).
  Tensor q = param({1}, {1});
  AdamW dflt({{"q", q}});
  BOOST_CHECK_EQUAL(dflt.weight_decay(), 1e-2);
  give_grad(q, {0});
  dflt.step();
  check_close(vals(q), {1 - 1e-5}, 1e-15);
}

// torch.optim.AdamW's update worked by hand for two steps (lr 0.1, betas 0.9/0.999, eps 1e-8,
// weight decay 0.1): p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Step 1: m = 0.05, v = 2.5e-4, so
// p = 1 * 0.99 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.890000002 (the numbers below are the formula in
// double).
BOOST_AUTO_TEST_CASE(adamw_two_steps_match_torch_formula) {
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    Tensor p = param({1, -2}, {2}, dt);
    AdamW opt({{"p", p}}, 0.1, 0.9, 0.999, 1e-8, 0.1);
    give_grad(p, {0.5, 0.3});
    opt.step();
    check_close(vals(p), {0.890000002, -2.079999996666667}, tol);
    give_grad(p, {-0.2, 0.3});
    opt.step();
    check_close(vals(p), {0.8465394180965108, -2.1591999933666663}, tol);
  }
}

// nanoGPT's split: matrices decay; vectors (biases, norm gains) and embeddings do not.
BOOST_AUTO_TEST_CASE(decay_groups_split_by_shape_and_name) {
  const NamedParams ps = {{"embedding.weight", param(std::vector<double>(6, 1), {3, 2})},
                          {"layer.weight", param(std::vector<double>(4, 1), {2, 2})},
                          {"layer.bias", param({1, 1}, {2})},
                          {"norm.weight", param({1, 1}, {2})},
                          {"out.weight", param(std::vector<double>(4, 1), {2, 2})}};
  const ParamGroups g = decay_groups(ps, 0.1);
  BOOST_REQUIRE_EQUAL(g.size(), 2u);
  BOOST_REQUIRE_EQUAL(g[0].params.size(), 2u);
  BOOST_CHECK_EQUAL(g[0].params[0].first, "layer.weight");
  BOOST_CHECK_EQUAL(g[0].params[1].first, "out.weight");
  BOOST_CHECK_EQUAL(g[0].weight_decay, 0.1);
  BOOST_REQUIRE_EQUAL(g[1].params.size(), 3u);
  BOOST_CHECK_EQUAL(g[1].params[0].first, "embedding.weight");
  BOOST_CHECK_EQUAL(g[1].weight_decay, 0.0);
  check_error([&] { decay_groups(ps, -1); }, "decay_groups: weight_decay must be >= 0, got -1");

  // With a zero gradient AdamW only decays: the decay group by 1 - lr*wd, the others not at all.
  AdamW opt(g, 0.5);
  BOOST_CHECK_EQUAL(opt.group_count(), 2u);
  for (auto& [n, t] : ps) give_grad(t, std::vector<double>(t.numel(), 0));
  opt.step();
  for (auto& [n, t] : ps) {
    const double want = decays_by_default(n, t.dim()) ? 1 - 0.5 * 0.1 : 1;
    for (double x : vals(t)) BOOST_CHECK_MESSAGE(x == want, n << ": " << x << ", want " << want);
  }
}

BOOST_AUTO_TEST_CASE(groups_scale_lr_and_decay_alone) {
  // Same grads, two groups: lr_scale 0.5 halves the first Adam step (~lr), weight decay as L2
  // in Adam enters the grad of its group only.
  Tensor a = param({1}, {1}), b = param({1}, {1}), c = param({1}, {1});
  Adam opt(ParamGroups{{{{"a", a}}, 0.0, 1.0}, {{{"b", b}}, 0.0, 0.5}, {{{"c", c}}, 1.0, 1.0}},
           0.1);
  for (const Tensor& t : {a, b, c}) give_grad(t, {0.5});
  opt.step();
  check_close(vals(a), {1 - 0.1 * 0.5 / (0.5 + 1e-8)}, 1e-14);
  check_close(vals(b), {1 - 0.05 * 0.5 / (0.5 + 1e-8)}, 1e-14);
  check_close(vals(c), {1 - 0.1 * 1.5 / (1.5 + 1e-8)}, 1e-14);  // g = 0.5 + 1.0 * 1
  BOOST_CHECK_EQUAL(opt.group_of(2), 2u);
  check_error(
      [&] {
        Adam(ParamGroups{{{{"a", param({1}, {1})}}, -0.5}}, 0.1);
      },
      "Adam: weight_decay must be >= 0, got -0.5");
  check_error(
      [&] {
        SGD(ParamGroups{{{{"a", param({1}, {1})}}}, {{{"b", param({1}, {1})}}, 0, NAN}}, 0.1);
      },
      "SGD: group 1 lr_scale must be a finite number >= 0, got nan");
  // SGD with groups: wd as L2 per group.
  Tensor x = param({2}, {1}), y = param({2}, {1});
  SGD sgd(ParamGroups{{{{"x", x}}, 0.5}, {{{"y", y}}, 0.0, 2.0}}, 0.1);
  give_grad(x, {1});
  give_grad(y, {1});
  sgd.step();
  check_close(vals(x), {2 - 0.1 * (1 + 0.5 * 2)}, 1e-15);
  check_close(vals(y), {2 - 0.2 * 1}, 1e-15);
}

BOOST_AUTO_TEST_CASE(groups_save_and_load) {
  auto make = [] {
    return NamedParams{{"w", param({1, 2, 3, 4}, {2, 2})}, {"b", param({1, 2}, {2})}};
  };
  NamedParams ps = make();
  AdamW opt(decay_groups(ps, 0.2), 0.1);
  for (auto& [n, t] : ps) give_grad(t, std::vector<double>(t.numel(), 0.3));
  opt.step();
  const auto j = opt.state_json();
  BOOST_REQUIRE(j.contains("param_groups"));
  BOOST_CHECK_EQUAL(j["param_groups"][0]["params"], nlohmann::json({"w"}));
  BOOST_CHECK_EQUAL(j["param_groups"][0]["weight_decay"], 0.2);

  // Another optimizer over the same split takes the saved decays (torch's load_state_dict).
  NamedParams qs = make();
  AdamW back(decay_groups(qs, 0.7), 0.1);
  back.load_state(opt.state_tensors(), j);
  BOOST_CHECK_EQUAL(back.group_weight_decay(0), 0.2);
  BOOST_CHECK_EQUAL(back.group_weight_decay(1), 0.0);
  BOOST_CHECK_EXCEPTION(back.group_lr_scale(2), Error, [](const Error& e) {
    return std::string(e.what()) == "AdamW: group 2 out of range (2 parameter groups)";
  });
  BOOST_CHECK_EXCEPTION(back.param_step(9), Error, [](const Error& e) {
    return std::string(e.what()) == "AdamW::param_step: parameter 9 out of range (2 parameters)";
  });
  for (auto& [n, t] : ps) give_grad(t, std::vector<double>(t.numel(), -0.1));
  for (auto& [n, t] : qs)
    copy_into(t, ps[n == "w" ? 0 : 1].second), give_grad(t, std::vector<double>(t.numel(), -0.1));
  opt.step();
  back.step();
  for (size_t i = 0; i < ps.size(); ++i) BOOST_CHECK(bit_equal(ps[i].second, qs[i].second));

  // Another grouping is refused, naming the parameter; so is one group for a grouped state.
  NamedParams rs = make();
  AdamW swapped(ParamGroups{{{rs[1]}, 0.2}, {{rs[0]}, 0.0}}, 0.1);
  check_error(
      [&] { swapped.load_state(opt.state_tensors(), j); },
      "load_state: parameter 'b' is in group 0 of this optimizer but in group 1 of the state");
  AdamW single(make(), 0.1);
  check_error([&] { single.load_state(opt.state_tensors(), j); },
              "load_state: 'param_groups' must be an array of 1 groups");
  // A state from before groups (no "param_groups") is one group with its weight_decay.
  auto old = single.state_json();
  old.erase("param_groups");
  old["weight_decay"] = 0.05;
  single.load_state(single.state_tensors(), old);
  BOOST_CHECK_EQUAL(single.weight_decay(), 0.05);
  check_error([&] { back.load_state(back.state_tensors(), old); },
              "load_state: the state has one parameter group but this optimizer has 2");
}

BOOST_AUTO_TEST_CASE(cosine_and_constant_schedules) {
  const Schedule cos = Schedule::cosine(1.0, 0.1, 10, 110);
  BOOST_CHECK_CLOSE(cos.lr(1), 0.1, 1e-12);  // linear warmup
  BOOST_CHECK_CLOSE(cos.lr(5), 0.5, 1e-12);
  BOOST_CHECK_EQUAL(cos.lr(10), 1.0);          // the peak at the end of warmup
  BOOST_CHECK_CLOSE(cos.lr(60), 0.55, 1e-12);  // half way: the mean of peak and floor
  BOOST_CHECK_EQUAL(cos.lr(110), 0.1);         // the floor at the last step...
  BOOST_CHECK_EQUAL(cos.lr(500), 0.1);         // ...and after it
  for (int64_t s = 11; s <= 110; ++s) BOOST_CHECK_LE(cos.lr(s), cos.lr(s - 1));
  const Schedule flat = Schedule::constant(0.3, 4);
  BOOST_CHECK_CLOSE(flat.lr(2), 0.15, 1e-12);
  BOOST_CHECK_EQUAL(flat.lr(4), 0.3);
  BOOST_CHECK_EQUAL(flat.lr(1000), 0.3);
  BOOST_CHECK_EQUAL(Schedule::constant(0.3).lr(1), 0.3);
  const Schedule noam = Schedule::noam(2.0, 512, 4000);
  for (int64_t s : {1, 100, 4000, 9000})
    BOOST_CHECK_EQUAL(noam.lr(s), (NoamSchedule{2.0, 512, 4000}.lr(s)));
  BOOST_CHECK_EQUAL(cos.to_json()["schedule"], "cosine");
  BOOST_CHECK_EQUAL(cos.to_json()["total"], 110);

  check_error([&] { cos.lr(0); }, "Schedule: step must be >= 1, got 0");
  check_error([] { Schedule::cosine(1.0, 2.0, 0, 10); },
              "Schedule: min_lr must be in [0, lr = 1], got 2");
  check_error([] { Schedule::cosine(1.0, 0.0, 10, 10); },
              "Schedule: the cosine decay needs more steps (10) than warmup steps (10)");
  check_error([] { Schedule::constant(-1); }, "Schedule: lr must be >= 0, got -1");
  check_error([] { Schedule::constant(1, -2); }, "Schedule: warmup must be >= 0, got -2");
  check_error([] { Schedule::noam(1, 0, 10); }, "Schedule: d_model must be >= 1, got 0");
}

BOOST_AUTO_TEST_CASE(params_without_grad_are_skipped) {
  Tensor a = param({1, 2}, {2}), b = param({3}, {1});
  Adam opt({{"a", a}, {"b", b}}, 0.1);
  give_grad(a, {1, 1});
  const uint64_t vb = b.version();
  opt.step();
  check_close(vals(b), {3}, 0);
  BOOST_CHECK_EQUAL(b.version(), vb);
  BOOST_CHECK_EQUAL(opt.param_step(0), 1);
  BOOST_CHECK_EQUAL(opt.param_step(1), 0);
  // b's first real step is its own step 1: bias correction makes it move by ~lr.
  give_grad(b, {0.3});
  opt.step();
  check_close(vals(b), {3 - 0.1 * 0.3 / (0.3 + 1e-8)}, 1e-13);
  BOOST_CHECK_EQUAL(opt.param_step(0), 2);
  BOOST_CHECK_EQUAL(opt.param_step(1), 1);
  BOOST_CHECK_EQUAL(opt.step_count(), 2);

  opt.zero_grad();
  BOOST_CHECK(!a.grad().defined());
  BOOST_CHECK(!b.grad().defined());
}

// The fused parallel loops over a large tensor agree with a plain scalar reference.
BOOST_AUTO_TEST_CASE(large_tensor_matches_reference) {
  const int64_t n = 100003;  // not a multiple of any chunk or vector width
  std::vector<double> x0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    x0[i] = std::sin(0.37 * i);
    g[i] = std::cos(0.11 * i) * (1 + i % 5);
  }
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
    Tensor p = param(x0, {n}, dt);
    AdamW opt({{"p", p}}, 0.01, 0.8, 0.99, 1e-6, 0.05);
    std::vector<double> x = x0, m(n, 0), v(n, 0);
    for (int t = 1; t <= 3; ++t) {
      give_grad(p, g);
      opt.step();
      for (int64_t i = 0; i < n; ++i) {
        x[i] *= 1 - 0.01 * 0.05;
        m[i] = 0.8 * m[i] + 0.2 * g[i];
        v[i] = 0.99 * v[i] + 0.01 * g[i] * g[i];
        const double mh = m[i] / (1 - std::pow(0.8, t)), vh = v[i] / (1 - std::pow(0.99, t));
        x[i] -= 0.01 * mh / (std::sqrt(vh) + 1e-6);
      }
    }
    check_close(vals(p), x, tol);

    Tensor q = param(x0, {n}, dt);
    SGD sgd({{"q", q}}, 0.01, 0.9, 0.1, true);
    std::vector<double> y = x0, buf(n, 0);
    for (int t = 1; t <= 3; ++t) {
      give_grad(q, g);
      sgd.step();
      for (int64_t i = 0; i < n; ++i) {
        const double d = g[i] + 0.1 * y[i];
        buf[i] = 0.9 * buf[i] + d;
        y[i] -= 0.01 * (d + 0.9 * buf[i]);
      }
    }
    check_close(vals(q), y, tol);
  }
}

// ---- convergence on a quadratic ----

BOOST_AUTO_TEST_CASE(minimise_quadratic) {
  struct Case {
    const char* what;
    std::function<std::unique_ptr<Optimizer>(NamedParams)> make;
    int steps;
  };
  const std::vector<Case> cases = {
      {"SGD", [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.2); }, 200},
      {"SGD momentum", [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.05, 0.9); },
       300},
      {"SGD nesterov",
       [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.05, 0.9, 0, true); }, 300},
      {"Adam", [](NamedParams p) { return std::make_unique<Adam>(std::move(p), 0.05); }, 1500},
      {"AdamW",
       [](NamedParams p) {
         return std::make_unique<AdamW>(std::move(p), 0.05, 0.9, 0.999, 1e-8, 0.0);
       },
       1500},
  };
  for (const auto& c : cases) {
    for (DType dt : {DType::f32, DType::f64}) {
      BOOST_TEST_CONTEXT(c.what << " " << dtype_name(dt)) {
        // Below the parallel threshold: large_tensor_matches_reference covers the OpenMP path,
        // and a thousand-odd forks per case would only measure the scheduler on a loaded box.
        Tensor big = param(std::vector<double>(5000, 3.0), {50, 100}, dt);
        Tensor small = param({-2, 2, 0.5}, {3}, dt);
        auto opt = c.make({{"big", big}, {"small", small}});
        for (int s = 0; s < c.steps; ++s) {
          opt->zero_grad();
          quad_grad(big, false);
          quad_grad(small, false);
          opt->step();
        }
        BOOST_CHECK_LT(quad_dist(big), 1e-3);
        BOOST_CHECK_LT(quad_dist(small), 1e-3);
      }
    }
  }
  // With its default decay, AdamW settles slightly inside the optimum (towards 0), never past it.
  Tensor p = param({3, -3}, {2});
  AdamW opt({{"p", p}}, 0.01, 0.9, 0.999, 1e-8, 0.5);
  for (int s = 0; s < 3000; ++s) {
    give_grad(p, {vals(p)[0] - 1, vals(p)[1] + 1});
    opt.step();
  }
  const auto x = vals(p);
  BOOST_CHECK(x[0] > 0.5 && x[0] < 1.0);
  BOOST_CHECK(x[1] < -0.5 && x[1] > -1.0);
}

// ---- Noam ----

BOOST_AUTO_TEST_CASE(noam_schedule) {
  const NoamSchedule noam{2.0, 512, 4000};
  const double peak = 2.0 / std::sqrt(512.0) / std::sqrt(4000.0);
  BOOST_CHECK_CLOSE(noam.lr(4000), peak, 1e-12);
  BOOST_CHECK_CLOSE(noam.lr(1), 2.0 / std::sqrt(512.0) * std::pow(4000.0, -1.5), 1e-12);
  BOOST_CHECK_CLOSE(noam.lr(2000), peak / 2, 1e-12);   // linear warm-up
  BOOST_CHECK_CLOSE(noam.lr(16000), peak / 2, 1e-12);  // inverse square root decay
  BOOST_CHECK_CLOSE(noam.lr(100), 100 * noam.lr(1), 1e-12);
  int64_t best = 1;
  for (int64_t s = 1; s <= 20000; ++s)
    if (noam.lr(s) > noam.lr(best)) best = s;
  BOOST_CHECK_EQUAL(best, 4000);
  // The Vaswani et al. numbers: d_model 512, warmup 4000, factor 1 peaks near 7e-4.
  const NoamSchedule paper{1.0, 512, 4000};
  BOOST_CHECK_CLOSE(paper.lr(4000), 6.987712429686844e-4, 1e-9);

  check_error([&] { noam.lr(0); }, "NoamSchedule: step must be >= 1, got 0");
  check_error([] { NoamSchedule{1.0, 0, 10}.lr(1); }, "NoamSchedule: d_model must be >= 1");
  check_error([] { NoamSchedule{1.0, 8, 0}.lr(1); }, "NoamSchedule: warmup must be >= 1");

  // Driving an optimizer: set the lr for the coming step before stepping.
  Tensor p = param({1}, {1});
  SGD opt({{"p", p}}, 0);
  for (int s = 0; s < 3; ++s) {
    opt.set_lr(noam.lr(opt.step_count() + 1));
    give_grad(p, {1});
    opt.step();
  }
  BOOST_CHECK_CLOSE(opt.lr(), noam.lr(3), 1e-12);
  check_close(vals(p), {1 - noam.lr(1) - noam.lr(2) - noam.lr(3)}, 1e-14);
}

// ---- gradient clipping ----

BOOST_AUTO_TEST_CASE(clip_grad_norm_values) {
  Tensor a = param({0, 0}, {2}), b = param({0}, {1}, DType::f32), c = param({5}, {1});
  NamedParams ps = {{"a", a}, {"b", b}, {"c", c}};  // c has no grad and is skipped
  give_grad(a, {3, 4});
  give_grad(b, {12});
  // norm 13 <= 26: untouched
  BOOST_CHECK_CLOSE(clip_grad_norm(ps, 26), 13.0, 1e-12);
  check_close(vals(a.grad()), {3, 4}, 0);
  check_close(vals(b.grad()), {12}, 0);
  // norm 13 > 6.5: scaled by 6.5 / (13 + 1e-6)
  const double coef = 6.5 / (13 + 1e-6);
  BOOST_CHECK_CLOSE(clip_grad_norm(ps, 6.5), 13.0, 1e-12);
  check_close(vals(a.grad()), {3 * coef, 4 * coef}, 1e-15);
  check_close(vals(b.grad()), {12 * coef}, 1e-7);
  BOOST_CHECK_CLOSE(clip_grad_norm(ps, 100), 6.5, 1e-5);
  // No grads at all: norm 0.
  BOOST_CHECK_EQUAL(clip_grad_norm({{"c", c}}, 1), 0.0);
  // A non-finite norm is returned and the grads are left alone.
  give_grad(a, {INFINITY, 1});
  BOOST_CHECK(std::isinf(clip_grad_norm(ps, 1)));
  BOOST_CHECK_EQUAL(vals(a.grad())[1], 1.0);
  check_error([&] { clip_grad_norm(ps, -1); }, "clip_grad_norm: max_norm must be >= 0, got -1");
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_independent_of_threads) {
  const int64_t n = 1 << 20;
  std::vector<double> g(n);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.001 * i) * 1e-3 + 1e-4;
    want += (double)(float)g[i] * (double)(float)g[i];
  }
  Tensor p = param(std::vector<double>(n, 0), {n}, DType::f32);
  Tensor q = param(std::vector<double>(777, 0), {777});
  std::vector<double> results;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 5}) {
    omp_set_num_threads(threads);
    give_grad(p, g);
    give_grad(q, std::vector<double>(777, 0));
    results.push_back(clip_grad_norm({{"p", p}, {"q", q}}, 1e9));
  }
  omp_set_num_threads(saved);
  BOOST_CHECK_CLOSE(results[0], std::sqrt(want), 1e-10);
  for (double r : results) BOOST_CHECK_EQUAL(r, results[0]);  // bit-identical
}

// ---- exact resume ----

namespace {

using MakeOpt = std::function<std::unique_ptr<Optimizer>(NamedParams)>;

NamedParams fresh_params() {
  std::vector<double> w(37 * 29), b(13);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(1.3 * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.7 * i);
  return {{"w", param(w, {37, 29}, DType::f32)}, {"b", param(b, {13})}};
}

// One training step; on step 3 (and 8) "b" gets no grad, so Adam's per-param steps diverge.
void train_step(Optimizer& opt) {
  opt.zero_grad();
  const int64_t s = opt.step_count() + 1;
  for (const auto& [name, p] : opt.params())
    if (!(name == "b" && s % 5 == 3)) quad_grad(p);
  clip_grad_norm(opt.params(), 5.0);
  opt.step();
}

NamedParams copy_params(const NamedParams& ps) {
  NamedParams out;
  for (const auto& [n, p] : ps) {
    Tensor c = contiguous_copy(p);
    c.requires_grad_();
    out.emplace_back(n, c);
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(exact_resume) {
  TempDir dir;
  const std::vector<std::pair<const char*, MakeOpt>> makers = {
      {"sgd",
       [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.05, 0.9, 1e-3, true); }},
      {"sgd_plain", [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.05); }},
      {"adam",
       [](NamedParams p) {
         return std::make_unique<Adam>(std::move(p), 0.03, 0.8, 0.99, 1e-6, 1e-2);
       }},
      {"adamw", [](NamedParams p) { return std::make_unique<AdamW>(std::move(p), 0.03); }},
  };
  for (const auto& [what, make] : makers) {
    BOOST_TEST_CONTEXT(what) {
      auto a = make(fresh_params());
      for (int s = 0; s < 5; ++s) train_step(*a);
      // One file, as the trainer's train state keeps it: the tensors, and the JSON in the metadata.
      const std::string path = dir / (std::string(what) + ".safetensors");
      save_safetensors(path, a->state_tensors(), {{"optimizer", a->state_json().dump()}});
      BOOST_CHECK(std::filesystem::exists(path));
      NamedParams snapshot = copy_params(a->params());
      for (int s = 0; s < 5; ++s) train_step(*a);

      // A fresh optimizer with another lr: load_state brings back the saved lr too.
      auto b = make(snapshot);
      b->set_lr(123);
      const SafetensorsFile f = load_safetensors(path);
      b->load_state(f.tensors, nlohmann::json::parse(f.metadata.at("optimizer")));
      BOOST_CHECK_EQUAL(b->step_count(), 5);
      BOOST_CHECK_EQUAL(b->lr(), a->lr());
      for (int s = 0; s < 5; ++s) train_step(*b);
      BOOST_CHECK_EQUAL(b->step_count(), 10);
      for (size_t i = 0; i < snapshot.size(); ++i)
        BOOST_CHECK_MESSAGE(bit_equal(a->params()[i].second, b->params()[i].second),
                            "param " << snapshot[i].first << " differs after resume");
      const auto sa = a->state_tensors(), sb = b->state_tensors();
      BOOST_REQUIRE_EQUAL(sa.size(), sb.size());
      for (size_t i = 0; i < sa.size(); ++i) {
        BOOST_CHECK_EQUAL(sa[i].first, sb[i].first);
        BOOST_CHECK(bit_equal(sa[i].second, sb[i].second));
      }
      BOOST_CHECK_EQUAL(a->state_json().dump(), b->state_json().dump());
    }
  }
  // In-memory round trip too, and the loaded state does not alias the source tensors.
  Adam src(fresh_params(), 0.01);
  for (int s = 0; s < 4; ++s) train_step(src);
  Adam dst(copy_params(src.params()), 0.5, 0.5, 0.5, 0.5, 0.5);
  dst.load_state(src.state_tensors(), src.state_json());
  BOOST_CHECK_EQUAL(dst.beta1(), src.beta1());
  BOOST_CHECK_EQUAL(dst.param_step(1), src.param_step(1));
  BOOST_CHECK_EQUAL(src.param_step(1), 3);
  BOOST_CHECK(!dst.state_tensors()[0].second.same_storage(src.state_tensors()[0].second));
}

// ---- errors ----

BOOST_AUTO_TEST_CASE(constructor_errors) {
  auto ps = [] { return NamedParams{{"w", param({1, 2}, {2})}}; };
  check_error([&] { Adam(ps(), -1); }, "Adam: lr must be >= 0, got -1");
  check_error([&] { AdamW(ps(), 1e-3, 1.0); }, "AdamW: beta1 must be in [0, 1), got 1");
  check_error([&] { Adam(ps(), 1e-3, 0.9, -0.1); }, "Adam: beta2 must be in [0, 1), got -0.1");
  check_error([&] { Adam(ps(), 1e-3, 0.9, 0.999, NAN); }, "Adam: eps must be >= 0, got nan");
  check_error([&] { SGD(ps(), 0.1, -0.5); }, "SGD: momentum must be >= 0, got -0.5");
  check_error([&] { SGD(ps(), 0.1, 0, -1); }, "SGD: weight_decay must be >= 0, got -1");
  check_error([&] { SGD(ps(), 0.1, 0, 0, true); }, "SGD: nesterov momentum requires momentum > 0");
  check_error([] { SGD(NamedParams{}, 0.1); }, "Optimizer: got an empty parameter list");
  Tensor w = param({1}, {1});
  check_error(
      [&] {
        SGD({{"w", w}, {"w", param({1}, {1})}}, 0.1);
      },
      "Optimizer: parameter name 'w' appears twice");
  check_error(
      [&] {
        SGD({{"w", w}, {"v", w}}, 0.1);
      },
      "Optimizer: parameter 'v' is the same tensor as an earlier parameter");
  check_error([] { SGD({{"i", arange(4)}}, 0.1); }, "Optimizer: parameter 'i' is i64 (4)");
  check_error(
      [] {
        SGD({{"u", Tensor()}}, 0.1);
      },
      "Optimizer: parameter 'u' is an undefined tensor");
  SGD ok(ps(), 0.1);
  check_error([&] { ok.set_lr(-2); }, "SGD: lr must be >= 0, got -2");
  // A grad whose shape does not match the parameter is caught before anything is written.
  Tensor x = param({1, 2, 3, 4, 5, 6}, {2, 3});
  SGD sx({{"x", x}}, 0.1);
  x.impl()->grad = cast_copy(from_vector(std::vector<double>(6, 1), {3, 2}), DType::f64).impl_ptr();
  check_error([&] { sx.step(); },
              "SGD::step: grad of 'x' is f64 (3, 2) but the parameter is f64 (2, 3)");
  BOOST_CHECK_EQUAL(sx.step_count(), 0);
}

namespace {

// Each damaged field of a saved Adam state's JSON (`good`, of one parameter 'w' after one step)
// is refused by name through `load`.
void check_state_json_errors(const std::function<void(const nlohmann::json&)>& load,
                             const nlohmann::json& good) {
  auto refused = [&](const std::function<void(nlohmann::json&)>& damage, const std::string& why) {
    nlohmann::json j = good;
    damage(j);
    check_error([&] { load(j); }, why);
  };
  refused([](nlohmann::json& j) { j["type"] = "SGD"; },
          "load_state: the state is for optimizer \"SGD\" but this one is Adam");
  refused([](nlohmann::json& j) { j.erase("beta2"); }, "load_state: 'beta2' is missing");
  refused([](nlohmann::json& j) { j["lr"] = "fast"; }, "load_state: 'lr' must be a number");
  refused(
      [](nlohmann::json& j) {
        j["params"] = {"w", "extra"};
      },
      "load_state: the state has parameter 'extra', which this optimizer does not");
  refused([](nlohmann::json& j) { j["params"] = nlohmann::json::array(); },
          "load_state: parameter 'w' has no saved state");
  refused([](nlohmann::json& j) { j["param_steps"]["w"] = 7; },
          "load_state: 'param_steps' of 'w' must be an integer in [0, 1], got 7");
  refused([](nlohmann::json& j) { j["step"] = -3; }, "load_state: 'step' must be an integer >= 0");
}

}  // namespace

BOOST_AUTO_TEST_CASE(load_state_errors) {
  Tensor w = param(std::vector<double>(6, 1), {3, 2});
  Adam opt({{"w", w}}, 0.1);
  give_grad(w, std::vector<double>(6, 0.5));
  opt.step();
  const auto good_t = opt.state_tensors();
  const auto good_j = opt.state_json();
  const auto before = vals(good_t[0].second);

  auto with = [&](const std::string& name, const Tensor& t) {
    auto ts = good_t;
    for (auto& [n, x] : ts)
      if (n == name) x = t;
    return ts;
  };
  Adam other({{"w", param(std::vector<double>(6, 0), {3, 2})}});
  auto try_load = [&](const std::vector<std::pair<std::string, Tensor>>& ts,
                      const nlohmann::json& j) { other.load_state(ts, j); };

  check_error(
      [&] {
        try_load(with("w.exp_avg", zeros({2, 3}, DType::f64)), good_j);
      },
      "load_state: tensor 'w.exp_avg' has shape (2, 3) but parameter 'w' is (3, 2)");
  check_error(
      [&] {
        try_load(with("w.exp_avg_sq", zeros({3, 2}, DType::f32)), good_j);
      },
      "load_state: tensor 'w.exp_avg_sq' is float32 but parameter 'w' is float64");
  check_error([&] { try_load({good_t[0]}, good_j); }, "load_state: missing tensor 'w.exp_avg_sq'");
  {
    auto ts = good_t;
    ts.emplace_back("v.exp_avg", zeros({1}, DType::f64));
    check_error([&] { try_load(ts, good_j); }, "load_state: unexpected tensor 'v.exp_avg'");
  }
  check_state_json_errors([&](const nlohmann::json& j) { try_load(good_t, j); }, good_j);
  // Nothing was applied by any failed load.
  BOOST_CHECK_EQUAL(other.step_count(), 0);
  BOOST_CHECK_EQUAL(other.lr(), 1e-3);
  for (double x : vals(other.state_tensors()[0].second)) BOOST_CHECK_EQUAL(x, 0.0);
  // ...and the good state still loads.
  other.load_state(good_t, good_j);
  check_close(vals(other.state_tensors()[0].second), before, 0);
}

// SGD with and without momentum buffers do not mix.
BOOST_AUTO_TEST_CASE(load_state_momentum_mismatch) {
  SGD plain({{"w", param({1}, {1})}}, 0.1), mom({{"w", param({1}, {1})}}, 0.1, 0.9);
  check_error([&] { mom.load_state(plain.state_tensors(), plain.state_json()); },
              "load_state: the state has SGD momentum 0 but this SGD has 0.9");
}

BOOST_AUTO_TEST_CASE(load_state_mismatches) {
  Tensor w = param({1, 2}, {2});
  SGD opt({{"w", w}}, 0.1, 0.9);
  give_grad(w, {1, 1});
  opt.step();
  opt.step();
  // Parameters that do not match the state.
  SGD wrong({{"w", param({1, 2, 3}, {3})}}, 0.1, 0.9);
  check_error([&] { wrong.load_state(opt.state_tensors(), opt.state_json()); },
              "load_state: tensor 'w.momentum_buffer' has shape (2) but parameter 'w' is (3)");
  Adam adam({{"w", param({1, 2}, {2})}});
  check_error([&] { adam.load_state(opt.state_tensors(), opt.state_json()); },
              "load_state: the state is for optimizer \"SGD\" but this one is Adam");
  SGD fresh({{"w", param({1, 2}, {2})}}, 0.1, 0.9);
  fresh.load_state(opt.state_tensors(), opt.state_json());
  BOOST_CHECK_EQUAL(fresh.step_count(), 2);
}

// ---- bf16 and f16 parameters: float32 masters ----

namespace {

// Step s's gradient for n elements: both signs, magnitudes from 2^-10 to 2^1.
std::vector<double> step_grad(int64_t n, int s) {
  std::vector<double> g((size_t)n);
  for (int64_t i = 0; i < n; ++i)
    g[(size_t)i] =
        std::sin(0.37 * (double)i + 1.1 * s) * std::ldexp(1.0, (int)((i * 7 + s) % 12) - 10);
  return g;
}

// The tensor `name` of opt.state_tensors().
Tensor state_of(const Optimizer& opt, const std::string& name) {
  for (const auto& [n, t] : opt.state_tensors())
    if (n == name) return t;
  BOOST_FAIL("no state tensor '" << name << "'");
  return {};
}

// Gives p (of dtype dt, or its float32 twin) step s's gradient rounded to dt, so both get the
// same values.
void give_step_grad(const Tensor& p, DType dt, int s) {
  const Tensor g = cast_copy(from_vector(step_grad(p.numel(), s), p.shape()), dt);
  Tensor(p).set_grad(cast_copy(g, p.dtype()));
}

// `steps` steps of `make` over a dt parameter and a float32 one with the same start and the same
// gradients: after every step the master is the float32 parameter bit for bit, the parameter is
// it rounded to dt, and the moments are the float32 ones.
void check_follows_f32(const MakeOpt& make, DType dt, int64_t n, int steps) {
  std::vector<double> start((size_t)n);
  for (int64_t i = 0; i < n; ++i) start[(size_t)i] = std::cos(0.1 * (double)i) * 3;
  const Tensor half = param(start, {n}, dt);
  const Tensor f32 = param(half.to_vector<double>(), {n}, DType::f32);  // the same values
  auto opt_h = make({{"w", half}});
  auto opt_f = make({{"w", f32}});
  for (int s = 0; s < steps; ++s) {
    give_step_grad(half, dt, s);
    give_step_grad(f32, dt, s);
    opt_h->step();
    opt_f->step();
    BOOST_REQUIRE_MESSAGE(bit_equal(state_of(*opt_h, "w.master"), f32),
                          "step " << s << ": the master left the float32 trajectory");
    BOOST_REQUIRE_MESSAGE(bit_equal(half, cast_copy(f32, dt)),
                          "step " << s << ": the parameter is not its master rounded");
  }
  for (const auto& [name, t] : opt_f->state_tensors())
    BOOST_CHECK_MESSAGE(bit_equal(state_of(*opt_h, name), t), name << " differs");
}

const std::vector<std::pair<const char*, MakeOpt>>& master_makers() {
  static const std::vector<std::pair<const char*, MakeOpt>> makers = {
      {"sgd", [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.05); }},
      {"sgd_momentum",
       [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.05, 0.9, 1e-2); }},
      {"sgd_nesterov",
       [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.05, 0.9, 0, true); }},
      {"adam",
       [](NamedParams p) {
         return std::make_unique<Adam>(std::move(p), 0.03, 0.8, 0.99, 1e-6, 1e-2);
       }},
      {"adamw",
       [](NamedParams p) {
         return std::make_unique<AdamW>(std::move(p), 0.03, 0.9, 0.999, 1e-8, 0.1);
       }},
  };
  return makers;
}

}  // namespace

// 37 elements run serially (with a vector tail); 40000 in the parallel region.
BOOST_AUTO_TEST_CASE(half_master_follows_the_float32_trajectory) {
  for (const auto& [what, make] : master_makers())
    for (DType dt : {DType::bf16, DType::f16})
      for (int64_t n : {37, 40000})
        BOOST_TEST_CONTEXT(what << " " << dtype_short_name(dt) << " n=" << n) {
          check_follows_f32(make, dt, n, n > 1000 ? 6 : 25);
        }
}

// lr * grad = 1e-3 is under half a bf16 ulp at 1 (2^-8): added to the bf16 value itself each
// update rounds away, while the master accumulates them.
BOOST_AUTO_TEST_CASE(bf16_small_updates_accumulate_in_the_master) {
  const std::vector<std::pair<const char*, MakeOpt>> makers = {
      {"sgd_momentum",
       [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 1e-4, 0.9); }},
      {"adamw",
       [](NamedParams p) {
         return std::make_unique<AdamW>(std::move(p), 1e-3, 0.9, 0.999, 1e-8, 0);
       }},
  };
  for (const auto& [what, make] : makers) BOOST_TEST_CONTEXT(what) {
      const Tensor w = param(std::vector<double>(8, 1.0), {8}, DType::bf16);
      // Naive: the same optimizer on a float32 copy rounded to bf16 after every step (no master).
      const Tensor naive = param(std::vector<double>(8, 1.0), {8}, DType::f32);
      const Tensor f32 = param(std::vector<double>(8, 1.0), {8}, DType::f32);
      auto opt = make({{"w", w}}), opt_naive = make({{"w", naive}}), opt_f32 = make({{"w", f32}});
      for (int s = 0; s < 100; ++s) {
        give_grad(w, std::vector<double>(8, 1.0));
        give_grad(naive, std::vector<double>(8, 1.0));
        give_grad(f32, std::vector<double>(8, 1.0));
        opt->step();
        opt_naive->step();
        opt_f32->step();
        copy_into(naive, cast_copy(naive, DType::bf16));
      }
      for (double x : vals(naive)) BOOST_CHECK_EQUAL(x, 1.0);  // stalled
      BOOST_CHECK(bit_equal(w, cast_copy(f32, DType::bf16)));
      for (double x : vals(w))
        BOOST_CHECK_LT(x, 0.95);  // moved by about 0.1 (0.09 momentum warm-up)
      for (double x : vals(w)) BOOST_CHECK_GT(x, 0.85);
    }
}

// 10 steps straight equal 5, save, load into a fresh optimizer over the saved parameters, 5.
BOOST_AUTO_TEST_CASE(half_exact_resume_keeps_the_masters) {
  TempDir dir;
  for (const auto& [what, make] : master_makers()) BOOST_TEST_CONTEXT(what) {
      auto fresh = [] {
        std::vector<double> w(37 * 29), b(13);
        for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(1.3 * (double)i);
        for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.7 * (double)i);
        return NamedParams{{"w", param(w, {37, 29}, DType::bf16)},
                           {"b", param(b, {13}, DType::f32)}};
      };
      auto step = [](Optimizer& o) {
        for (const auto& [n, p] : o.params()) give_step_grad(p, p.dtype(), (int)o.step_count());
        clip_grad_norm(o.params(), 5.0);
        o.step();
      };
      auto a = make(fresh());
      for (int s = 0; s < 5; ++s) step(*a);
      const std::string path = dir / (std::string(what) + ".safetensors");
      save_safetensors(path, a->state_tensors(), {{"optimizer", a->state_json().dump()}});
      NamedParams snapshot = copy_params(a->params());
      for (int s = 0; s < 5; ++s) step(*a);

      auto b = make(snapshot);
      const SafetensorsFile f = load_safetensors(path);
      b->load_state(f.tensors, nlohmann::json::parse(f.metadata.at("optimizer")));
      for (int s = 0; s < 5; ++s) step(*b);
      for (size_t i = 0; i < snapshot.size(); ++i)
        BOOST_CHECK_MESSAGE(bit_equal(a->params()[i].second, b->params()[i].second),
                            "param " << snapshot[i].first << " differs after resume");
      const auto sa = a->state_tensors(), sb = b->state_tensors();
      BOOST_REQUIRE_EQUAL(sa.size(), sb.size());
      for (size_t i = 0; i < sa.size(); ++i) {
        BOOST_CHECK_EQUAL(sa[i].first, sb[i].first);
        BOOST_CHECK_MESSAGE(bit_equal(sa[i].second, sb[i].second), sa[i].first << " differs");
      }
    }
}

// A parameter written by someone else (load_state_dict, a broadcast, fill_) restarts its master.
BOOST_AUTO_TEST_CASE(half_master_restarts_from_an_outside_write) {
  const Tensor w = param({1.0, -2.0, 3.0}, {3}, DType::bf16);
  SGD opt({{"w", w}}, 0.25);
  for (int s = 0; s < 3; ++s) {
    give_grad(w, {0.001, 0.001, 0.001});  // updates far under a bf16 ulp: the masters drift
    opt.step();
  }
  fill_(w, 0.5);
  give_grad(w, {1, 1, 1});
  opt.step();
  for (double x : vals(state_of(opt, "w.master"))) BOOST_CHECK_EQUAL(x, 0.25);
  for (double x : vals(w)) BOOST_CHECK_EQUAL(x, 0.25);
}

// Other memory given to a parameter (Module::to, adopt_state_dict swap its storage) restarts
// its master even when the new storage's version equals the old one's.
BOOST_AUTO_TEST_CASE(half_master_restarts_from_new_memory) {
  const Tensor w = param({1.0, -2.0, 3.0}, {3}, DType::bf16);
  SGD opt({{"w", w}}, 0.25);
  for (int s = 0; s < 3; ++s) {
    give_grad(w, {0.001, 0.001, 0.001});
    opt.step();
  }
  const Tensor fresh = full({3}, 0.5, DType::bf16);
  fresh.impl()->storage->version = w.version();  // the same count: only the storage tells
  w.impl()->storage = fresh.impl()->storage;
  give_grad(w, {1, 1, 1});
  opt.step();
  for (double x : vals(w)) BOOST_CHECK_EQUAL(x, 0.25);
}

// A parameter converted to another dtype after the optimizer was made is refused by name, before
// any update (its master would be missing: an update would read an undefined tensor).
BOOST_AUTO_TEST_CASE(half_dtype_changed_after_the_optimizer_is_refused) {
  const Tensor w = param({1.0, -2.0}, {2}, DType::f32);
  AdamW opt({{"w", w}}, 0.1);
  w.impl()->storage = cast_copy(w, DType::bf16).impl()->storage;  // as Module::to(bf16) does
  w.impl()->dtype = DType::bf16;
  give_grad(w, {1, 1});
  BOOST_CHECK_EXCEPTION(opt.step(), Error, [](const Error& e) {
    return std::string(e.what()).find(
               "optimizer: parameter 'w' is bf16 (2) but was another "
               "dtype when the optimizer was made") == 0;
  });
}

BOOST_AUTO_TEST_CASE(half_clip_grad_norm) {
  for (DType dt : {DType::bf16, DType::f16}) {
    BOOST_TEST_CONTEXT(dtype_short_name(dt)) {
      const Tensor h = param(std::vector<double>(5000, 0), {5000}, dt);
      const Tensor f = param(std::vector<double>(5000, 0), {5000}, DType::f32);
      give_step_grad(h, dt, 3);
      give_step_grad(f, dt, 3);
      const std::vector<double> g = vals(h.grad());
      const double nh = clip_grad_norm({{"w", h}}, 0.1), nf = clip_grad_norm({{"w", f}}, 0.1);
      BOOST_CHECK_CLOSE(nh, nf, 1e-12);  // the same values, summed in another order
      BOOST_CHECK_GT(nh, 1.0);           // so the grads were scaled
      // Each scaled in float32 by the coefficient and rounded once to dt.
      const float coef = (float)(0.1 / (nh + 1e-6));
      std::vector<float> want(g.size());
      for (size_t i = 0; i < g.size(); ++i) want[i] = (float)g[i] * coef;
      BOOST_CHECK(bit_equal(h.grad(), cast_copy(from_vector(want, {5000}), dt)));
      // A NaN gradient: the norm says so and nothing is scaled, so the trainer skips the step.
      give_step_grad(h, dt, 3);
      static_cast<uint16_t*>(h.grad().raw())[17] =
          dt == DType::bf16 ? 0x7FC0 : 0x7E00;  // a quiet NaN
      const Tensor before = contiguous_copy(h.grad());
      BOOST_CHECK(std::isnan(clip_grad_norm({{"w", h}}, 0.1)));
      BOOST_CHECK(bit_equal(h.grad(), before));
    }
  }
}

// Item 3 of docs/mixed-precision.md#training-in-bf16-float32-master-weights: bytes kept by the
// optimizer per parameter element.
BOOST_AUTO_TEST_CASE(half_state_bytes) {
  auto bytes = [](DType dt, const MakeOpt& make) {
    return make({{"w", param(std::vector<double>(1000, 1), {10, 100}, dt)}})->state_bytes();
  };
  const MakeOpt adamw = [](NamedParams p) { return std::make_unique<AdamW>(std::move(p)); };
  const MakeOpt momentum = [](NamedParams p) {
    return std::make_unique<SGD>(std::move(p), 0.1, 0.9);
  };
  const MakeOpt plain = [](NamedParams p) { return std::make_unique<SGD>(std::move(p), 0.1); };
  BOOST_CHECK_EQUAL(bytes(DType::f32, adamw), 8000);
  BOOST_CHECK_EQUAL(bytes(DType::bf16, adamw), 12000);
  BOOST_CHECK_EQUAL(bytes(DType::f16, adamw), 12000);
  BOOST_CHECK_EQUAL(bytes(DType::f64, adamw), 16000);
  BOOST_CHECK_EQUAL(bytes(DType::bf16, momentum), 8000);
  BOOST_CHECK_EQUAL(bytes(DType::bf16, plain), 4000);
  BOOST_CHECK_EQUAL(bytes(DType::f32, plain), 0);
}

BOOST_AUTO_TEST_CASE(half_load_state_errors) {
  const Tensor w = param({1, 2, 3, 4, 5, 6}, {3, 2}, DType::bf16);
  AdamW opt({{"w", w}}, 0.1);
  give_grad(w, std::vector<double>(6, 0.5));
  opt.step();
  const auto good_t = opt.state_tensors();
  const auto good_j = opt.state_json();
  auto with = [&](const std::string& name, const Tensor& t) {
    auto ts = good_t;
    for (auto& [n, x] : ts)
      if (n == name) x = t;
    return ts;
  };
  auto without = [&](const std::string& name) {
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const auto& e : good_t)
      if (e.first != name) ts.push_back(e);
    return ts;
  };
  const Tensor other_w = param(std::vector<double>(6, 7), {3, 2}, DType::bf16);
  AdamW other({{"w", other_w}}, 0.1);
  auto load = [&](const std::vector<std::pair<std::string, Tensor>>& ts) {
    return [&other, ts, &good_j] { other.load_state(ts, good_j); };
  };
  check_error(load(without("w.master")),
              "load_state: missing tensor 'w.master' (the master of bf16 parameter 'w')");
  check_error(load(with("w.master", zeros({2, 3}))),
              "load_state: tensor 'w.master' has shape (2, 3) but the master of bf16 parameter "
              "'w' is (3, 2)");
  check_error(load(with("w.master", zeros({3, 2}, DType::bf16))),
              "load_state: tensor 'w.master' is bfloat16 but the master of bf16 parameter 'w' is "
              "float32");
  check_error(load(with("w.exp_avg", zeros({3, 2}, DType::bf16))),
              "load_state: tensor 'w.exp_avg' is bfloat16 but the state of bf16 parameter 'w' is "
              "float32");
  // Nothing changed: the master is still the parameter's start.
  for (double x : vals(state_of(other, "w.master"))) BOOST_CHECK_EQUAL(x, 7.0);
  BOOST_CHECK_EQUAL(other.step_count(), 0);
  // A float32 parameter keeps no master; a bf16 one needs its master.
  AdamW f32({{"w", param(std::vector<double>(6, 7), {3, 2}, DType::f32)}}, 0.1);
  check_error([&] { f32.load_state(good_t, good_j); },
              "load_state: unexpected tensor 'w.master' (a master copy is kept only for a bf16 or "
              "f16 parameter, and 'w' is not one)");
  check_error([&] { other.load_state(f32.state_tensors(), f32.state_json()); },
              "load_state: missing tensor 'w.master'");
  other.load_state(good_t, good_j);
  BOOST_CHECK(bit_equal(state_of(other, "w.master"), state_of(opt, "w.master")));
}

BOOST_AUTO_TEST_SUITE_END()
