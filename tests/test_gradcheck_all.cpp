// The generic op tests, derived from the op records (graft/testing/registry.h): every sample is
// gradchecked in float64 (and gradgradchecked where the record has a double backward), its
// float32 (oneDNN) forward and backward are compared with the float64 path, and every bad input
// raises its error. Every declared op must have a record with every field.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <regex>
#include <set>

#include "graft/autograd/gradcheck.h"
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
