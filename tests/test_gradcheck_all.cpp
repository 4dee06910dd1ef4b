// The generic op tests: every registered case is gradchecked in float64, and its float32
// (oneDNN) forward and backward are compared with the float64 path. Every declared op must
// have at least one case.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <set>

#include "graft/autograd/gradcheck.h"
#include "graft/testing/op_cases.h"

using namespace graft;

namespace {
std::vector<std::string> case_names() {
  register_op_cases();
  return registered_case_names();
}

bool has_double_backward(const std::string& op) {
  for (auto& d : autograd::declared_ops())
    if (d.name == op) return d.double_backward;
  throw std::runtime_error("no declared op " + op);
}
}  // namespace

BOOST_AUTO_TEST_SUITE(gradcheck_all)

BOOST_AUTO_TEST_CASE(every_declared_op_has_a_case) {
  register_op_cases();
  std::set<std::string> covered;
  for (auto& c : registered_cases()) covered.insert(c.op);
  BOOST_TEST(autograd::declared_ops().size() > 20u);
  for (auto& d : autograd::declared_ops())
    BOOST_TEST(covered.count(d.name) == 1u,
               "op '" << d.name << "' (" << d.family << ") has no gradcheck case");
  for (auto& c : registered_cases()) {
    bool declared = false;
    for (auto& d : autograd::declared_ops()) declared |= d.name == c.op;
    BOOST_TEST(declared, "case '" << c.name << "' names undeclared op '" << c.op << "'");
  }
}

// Every case's bad inputs raise their errors (OpCase::error_inputs), and nothing is left on the
// tape by a failed call.
BOOST_DATA_TEST_CASE(error_inputs_raise_their_errors, boost::unit_test::data::make(case_names()),
                     name) {
  for (const ErrorInput& e : registered_case(name).error_inputs) {
    const std::string complaint = check_error_input(e);
    BOOST_TEST(complaint.empty(), name << ": " << complaint);
  }
  autograd::clear_tape();
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
  size_t n = 0;
  for (const OpCase& c : registered_cases()) n += c.error_inputs.size();
  BOOST_TEST_MESSAGE(n << " error inputs in " << registered_cases().size() << " cases");
  BOOST_TEST(n >= 10u);
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

BOOST_AUTO_TEST_SUITE_END()
