// NaN and +-Inf through every registered op case (graft/testing/registry.h; the rule is the
// op record's OpRecord::nonfinite), PyTorch's rule:
// a NaN in an input element reaches every output that depends on that element.
//
// For each case, each float input, two of its elements (the first and the middle one), and each
// of NaN, +Inf, -Inf put there:
//  - the outputs that depend on the element are found on the float64 path by putting finite
//    probes (-3, -0.5, 0.5, 3) there instead: an output that changes with a probe depends on it
//    (a masked-out key, a dropped element or the unused side of `where` does not);
//  - with NaN, each of those outputs must be NaN: on the float64 path and on every float32 path
//    (grad off: small inputs run the vectorised loops; grad on: oneDNN where it runs; under bf16,
//    its reference path and oneDNN's kernel where this CPU has one; under int8) and on the bf16
//    path (the case's inputs in bf16: kern::via_f32 or the native shape ops);
//  - for all three values, the float32 outputs must be NaN, +inf, -inf or finite exactly where
//    the float64 outputs are (the float32 paths agree with the reference loops); under int8 an
//    infinite output may be NaN (an int8 row cannot hold an inf), and under bf16 and int8 a
//    non-finite weight may be refused (kern::check_weight_finite), as designed.
// A case whose op does something else on purpose says so (NonFiniteRule::exception, with why):
// only the float32-vs-float64 agreement is checked there. A case with no decision fails.
#include <algorithm>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/ops.h"
#include "graft/ops/precision.h"
#include "graft/testing/op_cases.h"

using namespace graft;

namespace {

std::vector<std::string> case_names() {
  register_op_cases();
  return registered_case_names();
}

// Where one value goes: input `input`, logical element `element`.
struct Spot {
  size_t input;
  int64_t element;
};

// Sets logical element `e` of t (any strides, any float dtype) to v, rounded once to t's dtype.
void set_element(const Tensor& t, int64_t e, double v) {
  std::vector<double> all = t.to_vector<double>();
  all[(size_t)e] = v;
  copy_into(t, from_vector(all, t.shape(), DType::f64));
}

// The case's inputs in dtype dt, with the float64 values rounded to float32 (as
// check_f32_vs_f64()), so both precisions see the same numbers; bf16 ones are those rounded
// again (finite values stay finite: bf16 has float32's range).
Tensors inputs_of(const OpCase& c, DType dt) {
  if (dt == DType::bf16) return case_inputs_low_f64(c, DType::bf16).first;
  auto [x32, x64] = case_inputs_f32_f64(c);
  return dt == DType::f32 ? x32 : x64;
}

// One way of running a case: its dtype, grad recording on or off, the matmul precision.
struct Path {
  const char* name;
  DType dt;
  bool grad;
  Precision precision = Precision::fp32;
  Bf16Path bf16 = Bf16Path::automatic;
};

// The float64 reference, then the float32 paths: without grad (small calls run the vectorised
// loops), with grad (oneDNN), under bf16 (the reference path, and oneDNN's kernel where this CPU
// has one) and under int8 (inference only); then the inputs in bf16.
std::vector<Path> paths() {
  std::vector<Path> p = {
      {"float64", DType::f64, false},
      {"float32", DType::f32, false},
      {"float32 with grad", DType::f32, true},
      {"float32 under bf16 (reference)", DType::f32, false, Precision::bf16, Bf16Path::reference},
      {"float32 under bf16 (reference) with grad", DType::f32, true, Precision::bf16,
       Bf16Path::reference},
      {"float32 under int8", DType::f32, false, Precision::int8},
      {"bf16", DType::bf16, false}};
  if (bf16_kernel_available()) {
    p.push_back(
        {"float32 under bf16 (oneDNN)", DType::f32, false, Precision::bf16, Bf16Path::onednn});
    p.push_back({"float32 under bf16 (oneDNN) with grad", DType::f32, true, Precision::bf16,
                 Bf16Path::onednn});
  }
  return p;
}

// The op's output values on `path` with `v` at `spot` (none when spot is null).
std::vector<double> output_with(const OpCase& c, const Path& path, const Spot* spot, double v) {
  Tensors x = inputs_of(c, path.dt);
  if (spot) set_element(x[spot->input], spot->element, v);
  std::vector<double> out;
  {
    PrecisionGuard precision(path.precision, path.bf16);
    autograd::GradMode mode(path.grad);
    out = c.fn(x).to_vector<double>();
  }
  autograd::clear_tape();
  return out;
}

// The outputs that change (value or NaN-ness) when a finite probe is put at `spot`.
std::vector<bool> dependents(const OpCase& c, const Spot& spot) {
  const Path f64 = paths()[0];
  const std::vector<double> base = output_with(c, f64, nullptr, 0);
  std::vector<bool> dep(base.size(), false);
  for (double probe : {-3.0, -0.5, 0.5, 3.0}) {
    const std::vector<double> y = output_with(c, f64, &spot, probe);
    for (size_t i = 0; i < y.size() && i < dep.size(); ++i)
      if (!(y[i] == base[i]) && !(std::isnan(y[i]) && std::isnan(base[i]))) dep[i] = true;
  }
  return dep;
}

// "nan", "+inf", "-inf" or "finite".
const char* kind_of(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "+inf" : "-inf";
  return "finite";
}

std::string where_str(const OpCase& c, const Spot& s, double v, const char* path) {
  std::ostringstream os;
  os << c.name << ": " << v << " at element " << s.element << " of input " << s.input << ", "
     << path;
  return os.str();
}

// Whether `m` is the refusal of a weight that a kept bf16 or int8 copy cannot hold
// (kern::check_weight_finite): what those paths do with a non-finite weight, by design.
bool refused_weight(const std::string& m) {
  return m.find("copy of a weight needs finite values") != std::string::npos;
}

// Whether output kinds `got` (on `p`) and `want` (float64's) agree: the same, or under int8 NaN
// for an infinite output (a row holding an inf has no int8 scale: its outputs are NaN, as
// ops/internal/int8.h says).
bool kinds_agree(const Path& p, double got, double want) {
  if (std::string(kind_of(got)) == kind_of(want)) return true;
  return p.precision == Precision::int8 && std::isnan(got) && std::isinf(want);
}

// What is wrong with the case's outputs for `v` at `spot` ("" when nothing): each path's outputs
// against the float64 path's (the first).
std::string check_spot(const OpCase& c, const NonFiniteRule& rule, const Spot& spot, double v) {
  const std::vector<Path> ps = paths();
  const std::vector<double> y64 = output_with(c, ps[0], &spot, v);
  const std::vector<bool> dep = std::isnan(v) && rule.kind == NonFiniteRule::propagates
                                    ? dependents(c, spot)
                                    : std::vector<bool>();
  for (const Path& p : ps) {
    std::vector<double> y;
    try {
      y = output_with(c, p, &spot, v);
    } catch (const Error& e) {
      autograd::clear_tape();
      if (p.precision != Precision::fp32 && refused_weight(e.what())) continue;
      throw;
    }
    if (y.size() != y64.size())
      return where_str(c, spot, v, p.name) + ": output size differs from float64's";
    for (size_t i = 0; i < dep.size() && i < y.size(); ++i)
      if (dep[i] && !std::isnan(y[i]))
        return where_str(c, spot, v, p.name) + ": output " + std::to_string(i) +
               " depends on it but is " + std::to_string(y[i]);
    for (size_t i = 0; i < y.size(); ++i)
      if (!kinds_agree(p, y[i], y64[i]))
        return where_str(c, spot, v, p.name) + ": output " + std::to_string(i) + " is " +
               kind_of(y[i]) + ", float64's is " + kind_of(y64[i]);
  }
  return "";
}

// Every complaint for the case (empty when it keeps its op's rule).
std::vector<std::string> check_case(const OpCase& c, const NonFiniteRule& rule) {
  std::vector<std::string> bad;
  const Tensors x = inputs_of(c, DType::f64);
  autograd::clear_tape();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < x.size(); ++k) {
    if (!x[k].defined() || !is_floating(x[k].dtype()) || x[k].numel() == 0) continue;
    for (int64_t e : {int64_t(0), x[k].numel() / 2})
      for (double v : {std::numeric_limits<double>::quiet_NaN(), kInf, -kInf}) {
        std::string m;
        try {
          m = check_spot(c, rule, Spot{k, e}, v);
        } catch (const std::exception& err) {
          m = where_str(c, Spot{k, e}, v, "threw: ") + err.what();
          autograd::clear_tape();
        }
        if (!m.empty()) bad.push_back(m);
      }
  }
  return bad;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(nonfinite)

BOOST_DATA_TEST_CASE(every_case_keeps_its_nonfinite_rule,
                     boost::unit_test::data::make(case_names()), name) {
  const OpCase& c = registered_case(name);
  const NonFiniteRule& rule = registered_record(c.op).nonfinite;
  BOOST_TEST(rule.kind != NonFiniteRule::undecided,
             name << " has no non-finite decision (OpRecord::nonfinite)");
  if (rule.kind == NonFiniteRule::exception)
    BOOST_TEST(!rule.why.empty(), name << ": an exception must say why");
  for (const std::string& m : check_case(c, rule)) BOOST_ERROR(m);
  BOOST_TEST(autograd::tape_size() == 0u);
}

// The check itself: an op that turns NaN into 0 (as relu once did) is caught on both paths, and
// an exception skips that rule.
BOOST_AUTO_TEST_CASE(the_check_catches_a_nan_dropping_op) {
  const OpCase c{.name = "test/drops_nan",
                 .op = "test",
                 .make_inputs =
                     [](DType dt, Generator& g) {
                       return Tensors{case_input({2, 3}, dt, g)};
                     },
                 .fn =
                     [](const Tensors& x) {
                       std::vector<double> v = x[0].to_vector<double>();
                       for (double& e : v)
                         if (std::isnan(e)) e = 0;
                       return from_vector(v, x[0].shape(), x[0].dtype());
                     }};
  // A record written without a decision is undecided, which missing_fields() (and so
  // test_gradcheck_all) refuses.
  const OpRecord fresh{.name = "test", .samples = {c}};
  BOOST_TEST(fresh.nonfinite.kind == NonFiniteRule::undecided);
  const std::vector<std::string> missing = missing_fields(fresh);
  BOOST_TEST(std::count(missing.begin(), missing.end(),
                        "op 'test' has no non-finite decision (nonfinite)") == 1);
  const std::vector<std::string> bad = check_case(c, nan_propagates());
  BOOST_TEST(bad.size() == 2u);  // NaN at element 0 and at element 3
  for (const std::string& m : bad)
    BOOST_TEST(m.find("depends on it but is 0") != std::string::npos, m);
  BOOST_TEST(check_case(c, nan_exception("drops NaN on purpose")).empty());
}

// The float32 paths the small cases do not reach: calls large enough for oneDNN (without a tape
// too) and for the parallel loops, and the fast paths (one-row linear, attention's decoding row
// loop, fused cross-entropy). A NaN at element (row 5, col 7) of a (64, 1024) input must give NaN
// at the outputs the op's rule says.
namespace {
enum class Reach { element, row, reduced_row, everything };
struct LargeCall {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  Reach reach;
};
constexpr int64_t kRows = 64, kCols = 1024, kBadRow = 5, kBadCol = 7;

// The outputs the NaN at (kBadRow, kBadCol) must reach that are not NaN (at most a few listed).
// Row kBadRow of x, as a (1, ...) view.
Tensor bad_row(const Tensor& x) { return slice(x, 0, kBadRow, kBadRow + 1); }

std::string unreached(const std::vector<double>& y, Reach reach) {
  std::vector<int64_t> want;
  switch (reach) {
    case Reach::element:
      want = {kBadRow * kCols + kBadCol};
      break;
    case Reach::row:
      for (int64_t c = 0; c < kCols; ++c) want.push_back(kBadRow * kCols + c);
      break;
    case Reach::reduced_row:
      want = {kBadRow};
      break;
    case Reach::everything:
      for (int64_t i = 0; i < (int64_t)y.size(); ++i) want.push_back(i);
      break;
  }
  std::ostringstream out;
  for (int64_t i : want)
    if (i >= (int64_t)y.size()) out << " " << i << " (missing)";
    else if (!std::isnan(y[i])) out << " " << i << "=" << y[i];
  return out.str().substr(0, 200);
}
}  // namespace

BOOST_AUTO_TEST_CASE(large_float32_calls_and_fast_paths_propagate_nan) {
  Generator g(3);
  const Tensor w = randn({kCols}, DType::f32, g), b = randn({kCols}, DType::f32, g);
  const Tensor lw = randn({16, kCols}, DType::f32, g);
  const Tensor target = zeros({kRows}, DType::i64);
  const std::vector<LargeCall> calls = {
      {"relu", [](const Tensor& x) { return relu(x); }, Reach::element},
      {"exp", [](const Tensor& x) { return exp(x); }, Reach::element},
      {"log", [](const Tensor& x) { return log(x); }, Reach::element},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, Reach::element},
      {"pow", [](const Tensor& x) { return pow(x, 2.0); }, Reach::element},
      {"affine", [](const Tensor& x) { return affine(x, -0.5, 2.0); }, Reach::element},
      {"cos", [](const Tensor& x) { return cos(x); }, Reach::element},
      {"gelu", [](const Tensor& x) { return gelu(x); }, Reach::element},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, Reach::element},
      {"silu", [](const Tensor& x) { return silu(x); }, Reach::element},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, Reach::element},
      {"tanh", [](const Tensor& x) { return tanh(x); }, Reach::element},
      {"abs", [](const Tensor& x) { return abs(x); }, Reach::element},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.5); }, Reach::element},
      {"sin", [](const Tensor& x) { return sin(x); }, Reach::element},
      {"maximum", [](const Tensor& x) { return maximum(x, zeros({kCols})); }, Reach::element},
      {"relu_dropout (eval)", [](const Tensor& x) { return relu_dropout(x, 0.1, false); },
       Reach::element},
      {"softmax", [](const Tensor& x) { return softmax(x, -1); }, Reach::row},
      {"log_softmax", [](const Tensor& x) { return log_softmax(x, -1); }, Reach::row},
      {"layer_norm", [&](const Tensor& x) { return layer_norm(x, w, b); }, Reach::row},
      {"add_layer_norm", [&](const Tensor& x) { return add_layer_norm(x, zeros(x.shape()), w, b); },
       Reach::row},
      {"rms_norm", [&](const Tensor& x) { return rms_norm(x, w); }, Reach::row},
      {"max", [](const Tensor& x) { return max(x, -1); }, Reach::reduced_row},
      {"amax", [](const Tensor& x) { return amax(x, {-1}); }, Reach::reduced_row},
      {"sum", [](const Tensor& x) { return sum(x, {-1}); }, Reach::reduced_row},
      {"linear", [&](const Tensor& x) { return bad_row(linear(x, lw)); }, Reach::everything},
      {"linear (one row)", [&](const Tensor& x) { return linear(bad_row(x), lw); },
       Reach::everything},
      {"cross_entropy", [&](const Tensor& x) { return cross_entropy(x, target); },
       Reach::everything},
      {"linear_cross_entropy", [&](const Tensor& x) { return linear_cross_entropy(x, lw, target); },
       Reach::everything},
  };
  for (const LargeCall& call : calls)
    for (bool grad : {false, true}) {
      Tensor x = randn({kRows, kCols}, DType::f32, g);
      x.data<float>()[kBadRow * kCols + kBadCol] = std::numeric_limits<float>::quiet_NaN();
      if (grad) x.requires_grad_();
      autograd::GradMode mode(grad);
      const std::string bad = unreached(call.fn(x).to_vector<double>(), call.reach);
      BOOST_TEST(bad.empty(), call.name << (grad ? " with grad" : " without grad")
                                        << ": not NaN at output(s)" << bad);
      autograd::clear_tape();
    }
}

// argmax points at the NaN, as torch.argmax; max's backward sends the gradient there.
BOOST_AUTO_TEST_CASE(argmax_points_at_the_nan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x = from_vector(std::vector<double>{1, 5, nan, 2, 9, 3}, {2, 3}, dt);
    BOOST_TEST(argmax(x, -1).to_vector<int64_t>() == (std::vector<int64_t>{2, 1}));
  }
}

// Attention: a NaN in one query row gives NaN in that output row only, on the matmul path (more
// than 4 query rows, or a tape) and on the decoding row loop (at most 4 query rows, no tape); a
// NaN in a key or value reaches every row that attends to it; a padded (masked-out) key's NaN
// reaches no row.
BOOST_AUTO_TEST_CASE(attention_propagates_nan_and_ignores_masked_keys) {
  Generator g(4);
  const int64_t B = 1, H = 2, Tk = 6, D = 8;
  for (int64_t Tq : {int64_t(3), int64_t(8)})
    for (bool grad : {false, true})
      for (DType dt : {DType::f32, DType::f64}) {
        Tensor q = randn({B, H, Tq, D}, dt, g), k = randn({B, H, Tk, D}, dt, g),
               v = randn({B, H, Tk, D}, dt, g);
        set_element(q, (1 * Tq + 1) * D + 2, std::nan(""));  // head 1, query 1
        set_element(k, (0 * Tk + 4) * D + 0, std::nan(""));  // head 0, key 4: padded below
        for (Tensor* t : {&q, &k, &v})
          if (grad) t->requires_grad_();
        autograd::GradMode mode(grad);
        AttentionOptions opt;
        opt.key_padding_mask = from_vector(std::vector<int64_t>{0, 0, 0, 0, 1, 0}, {B, Tk});
        const std::vector<double> y =
            scaled_dot_product_attention(q, k, v, opt).out.to_vector<double>();
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < Tq; ++i)
            for (int64_t d = 0; d < D; ++d) {
              const bool want_nan = h == 1 && i == 1;
              BOOST_TEST(std::isnan(y[((h * Tq) + i) * D + d]) == want_nan,
                         "Tq " << Tq << (grad ? " grad " : " ") << dtype_name(dt) << ": head " << h
                               << " row " << i << " col " << d);
            }
        autograd::clear_tape();
      }
}

// A NaN value (V) at a causally masked key: its probability is 0 and 0 * NaN is NaN, so every row
// is NaN on both paths (the row loop of <= 4 query rows without grad once stopped at the causal
// end and left the rows before the key finite, while the matmul path made them NaN).
BOOST_AUTO_TEST_CASE(a_nan_value_at_a_masked_key_reaches_every_row_on_both_paths) {
  Generator g(5);
  const int64_t B = 1, H = 1, D = 4;
  for (int64_t T : {int64_t(3), int64_t(8)})
    for (bool grad : {false, true})
      for (DType dt : {DType::f32, DType::f64}) {
        Tensor q = randn({B, H, T, D}, dt, g), k = randn({B, H, T, D}, dt, g),
               v = randn({B, H, T, D}, dt, g);
        set_element(v, (T - 1) * D + 1, std::nan(""));  // the last key: masked for rows < T - 1
        for (Tensor* t : {&q, &k, &v})
          if (grad) t->requires_grad_();
        autograd::GradMode mode(grad);
        AttentionOptions opt;
        opt.causal = true;
        const std::vector<double> y =
            scaled_dot_product_attention(q, k, v, opt).out.to_vector<double>();
        for (int64_t i = 0; i < T; ++i)
          BOOST_TEST(std::isnan(y[i * D + 1]),
                     "T " << T << (grad ? " grad " : " ") << dtype_name(dt) << ": row " << i);
        autograd::clear_tape();
      }
}

BOOST_AUTO_TEST_SUITE_END()
