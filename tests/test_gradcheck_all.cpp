// The generic op tests, derived from the op records (graft/testing/registry.h): every sample is
// gradchecked in float64 (and gradgradchecked where the record has a double backward), its
// float32 (oneDNN) forward and backward are compared with the float64 path, so are its bf16 ones
// (and f16 ones for the matmul, elementwise and softmax cases), and every bad input raises its
// error. Every declared op must have a record with every field.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <regex>
#include <set>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/ops.h"
#include "graft/testing/op_cases.h"

using namespace graft;

namespace {
std::vector<std::string> case_names() {
  register_op_cases();
  return registered_case_names();
}

const autograd::OpDecl* declaration(const std::string& op) {
  for (auto& d : autograd::declared_ops())
    if (d.name == op) return &d;
  return nullptr;
}

bool has_record(const std::string& op) {
  for (const OpRecord& r : registered_records())
    if (r.name == op) return true;
  return false;
}

bool has_double_backward(const std::string& op) {
  return registered_record(op).double_backward != DoubleBackward::none;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(gradcheck_all)

BOOST_AUTO_TEST_CASE(every_declared_op_has_a_record) {
  register_op_cases();
  BOOST_TEST(autograd::declared_ops().size() > 20u);
  for (auto& d : autograd::declared_ops())
    BOOST_TEST(has_record(d.name), "op '" << d.name << "' (" << d.family << ") has no record");
  for (const OpRecord& r : registered_records())
    BOOST_TEST(declaration(r.name) != nullptr, "record '" << r.name << "' names an undeclared op");
}

// Every record has every field (OpRecord; missing_fields()): samples, error_inputs, a double
// backward and a NaN rule among them.
BOOST_AUTO_TEST_CASE(every_record_has_every_field) {
  register_op_cases();
  for (const OpRecord& r : registered_records())
    for (const std::string& m : missing_fields(r)) BOOST_ERROR(m);
  OpRecord bare{.name = "bare"};
  BOOST_TEST(missing_fields(bare).size() == 7u);
}

// The record says what the declaration says: the family, and whether the backward can be
// differentiated; a backward op it names is declared and recorded too.
BOOST_AUTO_TEST_CASE(every_record_agrees_with_its_declaration) {
  register_op_cases();
  for (const OpRecord& r : registered_records()) {
    const autograd::OpDecl* d = declaration(r.name);
    if (!d) continue;
    BOOST_TEST(r.family == d->family, r.name << ": record family " << r.family);
    BOOST_TEST((r.double_backward == DoubleBackward::none) == !d->double_backward,
               r.name << ": double_backward none iff declared once differentiable");
    if (r.double_backward == DoubleBackward::backward_op)
      BOOST_TEST(has_record(r.double_backward_op),
                 r.name << ": its backward op '" << r.double_backward_op << "' has no record");
  }
}

// Every op's bad inputs raise their errors (OpRecord::error_inputs), and nothing is left on the
// tape by a failed call.
BOOST_AUTO_TEST_CASE(error_inputs_raise_their_errors) {
  register_op_cases();
  for (const OpRecord& r : registered_records())
    for (const ErrorInput& e : r.error_inputs) {
      const std::string complaint = check_error_input(e);
      BOOST_TEST(complaint.empty(), r.name << ": " << complaint);
      // The fragment the error must hold starts with the function that raised it ("permute: ",
      // or "transpose: " for an op recorded by another public function), so the error names it.
      BOOST_TEST(std::regex_search(e.message, std::regex(R"(^[a-z_][a-z0-9_]*: )")),
                 r.name << ": " << e.what << ": the message \"" << e.message
                        << "\" does not start with the function that raises it");
      autograd::clear_tape();
    }
}

BOOST_AUTO_TEST_CASE(check_error_input_tells_what_went_wrong) {
  BOOST_TEST(check_error_input({"ok", [] { fail("op: bad shape"); }, "bad shape"}).empty());
  BOOST_TEST(check_error_input({"silent", [] {}, "bad"}).find("nothing was thrown") !=
             std::string::npos);
  BOOST_TEST(check_error_input({"other", [] { fail("op: bad dtype"); }, "bad shape"})
                 .find("does not contain \"bad shape\"") != std::string::npos);
  BOOST_TEST(check_error_input({"std", [] { throw std::out_of_range("at"); }, "x"})
                 .find("non-graft exception") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(error_inputs_are_listed) {
  register_op_cases();
  BOOST_TEST(!registered_records().empty());
  size_t n = 0;
  for (const OpRecord& r : registered_records()) n += r.error_inputs.size();
  BOOST_TEST_MESSAGE(n << " error inputs in " << registered_records().size() << " records");
  BOOST_TEST(n >= registered_records().size());
}

BOOST_DATA_TEST_CASE(float64_gradcheck, boost::unit_test::data::make(case_names()), name) {
  const OpCase& c = registered_case(name);
  Generator gen(11);
  Tensors inputs = c.make_inputs(DType::f64, gen);
  GradcheckResult r = gradcheck(c.fn, inputs, c.opt);
  BOOST_TEST(r.ok, name << ": " << r.message);
  BOOST_TEST(autograd::tape_size() == 0u);
}

BOOST_DATA_TEST_CASE(float32_matches_float64, boost::unit_test::data::make(case_names()), name) {
  GradcheckResult r = check_f32_vs_f64(registered_case(name));
  BOOST_TEST(r.ok, name << ": " << r.message);
}

// Second order: every case's double backward against central differences of its first
// gradients; an op declared without a double backward must say so when asked for one.
BOOST_DATA_TEST_CASE(float64_gradgradcheck, boost::unit_test::data::make(case_names()), name) {
  const OpCase& c = registered_case(name);
  Generator gen(11);
  Tensors inputs = c.make_inputs(DType::f64, gen);
  if (!has_double_backward(c.op)) {
    BOOST_CHECK_EXCEPTION(gradgradcheck(c.fn, inputs, c.opt), Error, [&](const Error& e) {
      const std::string m = e.what();
      return m.find("second backward of '" + c.op + "'") != std::string::npos &&
             m.find("declared without a double backward") != std::string::npos;
    });
  } else {
    GradcheckResult r = gradgradcheck(c.fn, inputs, c.opt);
    BOOST_TEST(r.ok, name << ": " << r.message);
  }
  BOOST_TEST(autograd::tape_size() == 0u);
}

BOOST_DATA_TEST_CASE(float32_double_backward_matches_float64,
                     boost::unit_test::data::make(case_names()), name) {
  const OpCase& c = registered_case(name);
  if (!has_double_backward(c.op)) return;
  GradcheckResult r = check_f32_vs_f64_double_backward(c);
  BOOST_TEST(r.ok, name << ": " << r.message);
  BOOST_TEST(autograd::tape_size() == 0u);
}

// bf16: every case's forward and first-order gradients in bf16 (ops without 16-bit kernels run
// through float32, kern::via_f32) against the float64 path at the same bf16 input values and the
// same bf16 upstream gradient. Tolerance, per element of the output or of a gradient:
//   |x16 - x64| <= k u max(1, max |x64|) + k u |x64|,   u = 2^-8 (bf16's unit roundoff),
// k = the case's low_depth (OpCase): the number of roundings to bf16 on the longest path from an
// input to the output or a gradient (2 by default: one forward, one backward; a case whose fn
// chains recorded ops rounds once per op). Each gradient must be in its input's dtype.
BOOST_DATA_TEST_CASE(bf16_matches_float64, boost::unit_test::data::make(case_names()), name) {
  const OpCase& c = registered_case(name);
  if (!c.no_low_precision.empty()) return;
  GradcheckResult r = check_low_vs_f64(c, DType::bf16);
  BOOST_TEST(r.ok, name << ": " << r.message);
  BOOST_TEST(autograd::tape_size() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- bf16 and f16 inputs: what the case comparisons do not show ----------------------------

namespace {
// The cases of the f16 check: matmul, elementwise and softmax.
std::vector<std::string> f16_case_names() {
  std::vector<std::string> out;
  for (const std::string& n : case_names())
    for (const char* prefix : {"matmul/", "linear/", "add/", "mul/", "div/", "exp/", "tanh/",
                               "softmax/", "log_softmax/"})
      if (n.rfind(prefix, 0) == 0) out.push_back(n);
  return out;
}

// Whether every element of a and b (same size) is within tol of each other.
bool close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= tol * std::max(1.0, std::fabs(b[i])))) return false;
  return true;
}

// The message of the graft::Error that f throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

BOOST_AUTO_TEST_SUITE(half_inputs)

// f16 (unit roundoff 2^-11) on the matmul, elementwise and softmax cases, with the bf16 check's
// tolerance formula.
BOOST_DATA_TEST_CASE(f16_matches_float64, boost::unit_test::data::make(f16_case_names()), name) {
  GradcheckResult r = check_low_vs_f64(registered_case(name), DType::f16);
  BOOST_TEST(r.ok, name << ": " << r.message);
  BOOST_TEST(autograd::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(the_f16_set_is_not_empty) { BOOST_TEST(f16_case_names().size() >= 10u); }

// A bf16 leaf gets a bf16 gradient through ops that run in float32 (the casts are recorded), a
// retained intermediate too, and the scalar output is seeded with a bf16 one.
BOOST_AUTO_TEST_CASE(gradients_keep_the_leaf_dtype) {
  Generator g(5);
  Tensor x = rand({3, 4}, DType::bf16, g, -1, 1).requires_grad_();
  Tensor w = rand({4}, DType::bf16, g, -1, 1).requires_grad_();
  Tensor t = tanh(x);
  t.retain_grad();
  Tensor y = sum(mul(t, w));
  BOOST_TEST((y.dtype() == DType::bf16));
  y.backward();
  BOOST_TEST((x.grad().dtype() == DType::bf16));
  BOOST_TEST((w.grad().dtype() == DType::bf16));
  BOOST_TEST((t.grad().dtype() == DType::bf16));
  // Against float64 at the same values: dx = w (1 - tanh^2), dw = column sums of tanh(x).
  const auto xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> dx(12), dw(4, 0.0);
  for (size_t i = 0; i < 12; ++i) {
    const double th = std::tanh(xv[i]);
    dx[i] = wv[i % 4] * (1 - th * th);
    dw[i % 4] += th;
  }
  const double u = unit_roundoff(DType::bf16);
  BOOST_TEST(close(x.grad().to_vector<double>(), dx, 4 * u));
  BOOST_TEST(close(w.grad().to_vector<double>(), dw, 8 * u));
}

// A broadcast's gradient is summed back to the input's shape in bf16 (the tape's sum_to_shape),
// and a leaf used twice accumulates its two bf16 gradients: 3 rows through broadcast_to, 3 more
// through add's own broadcast.
BOOST_AUTO_TEST_CASE(broadcast_and_accumulated_gradients_in_bf16) {
  Tensor b = full({4}, 0.5, DType::bf16).requires_grad_();
  Tensor y = sum(add(broadcast_to(b, {3, 4}), b));
  y.backward();
  BOOST_TEST((b.grad().dtype() == DType::bf16));
  BOOST_TEST(b.grad().to_vector<double>() == std::vector<double>(4, 6.0),
             boost::test_tools::per_element());
}

// The casts are linear, so a second backward runs through them: d/dx sum(d/dx sum(x^3)) = 6x.
BOOST_AUTO_TEST_CASE(double_backward_through_the_casts) {
  Tensor x = from_vector(std::vector<double>{0.5, -1.25, 2.0}, {3}, DType::bf16).requires_grad_();
  Tensor gx = autograd::grad({sum(pow(x, 3.0))}, {x}, {}, {.create_graph = true})[0];
  BOOST_TEST((gx.dtype() == DType::bf16));
  Tensor ggx = autograd::grad({sum(gx)}, {x})[0];
  BOOST_TEST((ggx.dtype() == DType::bf16));
  BOOST_TEST(ggx.to_vector<double>() == (std::vector<double>{3.0, -7.5, 12.0}),
             boost::test_tools::per_element());
  autograd::clear_tape();
}

// bf16 with float32 (or f16) is refused, naming both tensors; PyTorch would promote.
BOOST_AUTO_TEST_CASE(mixed_float_dtypes_are_refused) {
  const Tensor h = ones({2, 3}, DType::bf16), f = ones({2, 3}), f16 = ones({3, 2}, DType::f16);
  BOOST_TEST(error_of([&] { add(h, f); }) == "add: dtype mismatch, bf16 (2, 3) vs f32 (2, 3)");
  BOOST_TEST(error_of([&] { matmul(h, f16); }) ==
             "matmul: (2, 3) @ (3, 2): dtype mismatch, bf16 (2, 3) vs f16 (3, 2)");
  BOOST_TEST(error_of([&] {
               layer_norm(h, ones({3}), Tensor());
             }).find("layer_norm: dtype mismatch, bf16 (2, 3) vs f32 (3)") == 0u);
  BOOST_TEST(error_of([&] {
               softmax(ones({3}, DType::i64));
             }).find("softmax: expected a float tensor") == 0u);
}

// Undefined optional inputs and int64 ones (ids, targets) pass through the float32 detour as they
// are; argmax's indices stay int64.
BOOST_AUTO_TEST_CASE(undefined_and_int64_inputs_pass_through) {
  Generator g(9);
  const Tensor x = rand({4, 3}, DType::bf16, g), w = rand({5, 3}, DType::bf16, g);
  BOOST_TEST((linear(x, w).dtype() == DType::bf16));
  const Tensor ids = from_vector(std::vector<int64_t>{0, 4, 2, 1}, {4});
  BOOST_TEST((cross_entropy(linear(x, w), ids).dtype() == DType::bf16));
  BOOST_TEST((argmax(w, 1).dtype() == DType::i64));
  BOOST_TEST(
      argmax(w, 1).to_vector<int64_t>() == argmax(to_dtype(w, DType::f32), 1).to_vector<int64_t>(),
      boost::test_tools::per_element());
  BOOST_TEST((embedding(w, ids).dtype() == DType::bf16));
}

// kern::matmul_into (custom ops' matmul, outside the tape) takes bf16 and f16 too: float32 on
// copies, rounded once into out, accumulating onto what out holds.
BOOST_AUTO_TEST_CASE(matmul_into_takes_16_bit_tensors) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor a = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, dt);
    const Tensor b = from_vector(std::vector<double>{1, 0, 0, 1, 1, 1}, {3, 2}, dt);
    const Tensor out = full({2, 2}, 1.0, dt);
    kern::matmul_into(a, b, out, 2.0, /*accumulate=*/true);
    BOOST_TEST(out.to_vector<double>() == (std::vector<double>{9, 11, 21, 23}),
               boost::test_tools::per_element());
  }
}

// Shape ops move bf16 elements as they are (one tape entry, no cast around it, the bits kept).
BOOST_AUTO_TEST_CASE(shape_ops_move_bf16_natively) {
  Generator g(3);
  Tensor x = rand({2, 3, 4}, DType::bf16, g).requires_grad_();
  for (auto op : std::vector<std::function<Tensor(const Tensor&)>>{
           [](const Tensor& t) {
             return permute(t, {2, 0, 1});
           },
           [](const Tensor& t) {
             return concat({t, t}, 1);
           },
           [](const Tensor& t) { return slice(t, 2, 1, 3); },
           [](const Tensor& t) {
             return index_select(t, 1, from_vector(std::vector<int64_t>{2, 0}, {2}));
           },
           [](const Tensor& t) { return contiguous(transpose(t, 0, 2)); }}) {
    Tensor y = op(x);
    BOOST_TEST((y.dtype() == DType::bf16));
    BOOST_TEST(autograd::tape_size() <= 2u);  // the op (and transpose's permute): no casts
    sum(y).backward();
    BOOST_TEST((x.grad().dtype() == DType::bf16));
    x.zero_grad();
  }
  const Tensor y = permute(x, {1, 2, 0});
  BOOST_TEST(contiguous(y).to_vector<double>() ==
                 contiguous(permute(to_dtype(x, DType::f64), {1, 2, 0})).to_vector<double>(),
             boost::test_tools::per_element());
}

// The scatter-add of embedding's and index_select's backward sums repeated ids in float32 and
// rounds once: 300 ones give 300 (a bf16 running sum stops at 256, where 256 + 1 rounds back).
BOOST_AUTO_TEST_CASE(scatter_add_sums_repeated_ids_in_float32) {
  const Tensor ids = zeros({300}, DType::i64);
  Tensor w = zeros({2, 3}, DType::bf16).requires_grad_();
  sum(embedding(w, ids)).backward();
  BOOST_TEST((w.grad().dtype() == DType::bf16));
  BOOST_TEST(w.grad().to_vector<double>() == (std::vector<double>{300, 300, 300, 0, 0, 0}),
             boost::test_tools::per_element());
  Tensor x = zeros({2, 3}, DType::f16).requires_grad_();
  sum(index_select(x, 0, ids)).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{300, 300, 300, 0, 0, 0}),
             boost::test_tools::per_element());
}

// The tape's anomaly scan reads bf16 and f16 as float32 (it read their bytes as float64, past the
// buffer's end, and missed an inf).
BOOST_AUTO_TEST_CASE(the_anomaly_scan_reads_16_bit_tensors) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::bf16, DType::f16}) {
    BOOST_TEST(autograd::nonfinite_kind(from_vector(std::vector<double>{0, 0, 0, inf}, {4}, dt)) ==
               std::string("Inf"));
    BOOST_TEST(autograd::nonfinite_kind(from_vector(std::vector<double>{1, NAN, 0}, {3}, dt)) ==
               std::string("NaN"));
    BOOST_TEST(!autograd::nonfinite_kind(ones({5}, dt)));
  }
}

// Comparisons promote as PyTorch does: bf16 with bf16 gives a bf16 mask, with float32 a float32
// one, bf16 with f16 a float32 one; a scalar keeps the tensor's dtype.
BOOST_AUTO_TEST_CASE(comparisons_promote_16_bit_operands) {
  const Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}, DType::bf16);
  const Tensor b = from_vector(std::vector<double>{3, 2, 1}, {3}, DType::bf16);
  BOOST_TEST((eq(a, b).dtype() == DType::bf16));
  BOOST_TEST(eq(a, b).to_vector<double>() == (std::vector<double>{0, 1, 0}),
             boost::test_tools::per_element());
  BOOST_TEST((lt(a, ones({3})).dtype() == DType::f32));
  BOOST_TEST((lt(a, ones({3}, DType::f16)).dtype() == DType::f32));
  BOOST_TEST((gt(a, 1.5).dtype() == DType::bf16));
  BOOST_TEST(gt(a, 1.5).to_vector<double>() == (std::vector<double>{0, 1, 1}),
             boost::test_tools::per_element());
  BOOST_TEST((logical_not(a).dtype() == DType::bf16));
  BOOST_TEST(where(eq(a, b), a, b).to_vector<double>() == (std::vector<double>{3, 2, 1}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
