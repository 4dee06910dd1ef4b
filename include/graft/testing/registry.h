/// @file
/// The registry of op cases that the generic tests run (tests/test_gradcheck_all.cpp): an op
/// written outside graft registers its cases here and is checked like the library's own
/// (examples/custom_op). Not in the umbrella headers: include <graft/testing/registry.h> where
/// cases are written, and <graft/testing/op_cases.h> for the library's own.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/gradcheck.h"

namespace graft {

/// A bad input of a case's op and the error it must raise (as OpInfo's error_inputs): `call`
/// applies the op to it and must throw a graft::Error whose message contains `message`. The
/// gradcheck-all test runs every case's (check_error_input()).
struct ErrorInput {
  std::string what;            ///< the bad input in words, such as "axis 2 of a rank-2 input"
  std::function<void()> call;  ///< the op applied to the bad input
  std::string message;         ///< a fragment the error message must contain
};

/// "" when `e.call()` throws a graft::Error whose message contains `e.message`, else what went
/// wrong (nothing thrown, another message, another exception type).
std::string check_error_input(const ErrorInput& e);

/// What a case's op does with a NaN or +-Inf in its float inputs, checked by
/// tests/test_nonfinite.cpp (a case left `undecided` fails there, so every new op decides).
struct NonFiniteRule {
  /// The decision.
  enum Kind {
    undecided,   ///< none taken yet: the non-finite test fails for the case
    propagates,  ///< PyTorch's rule: a NaN reaches every output that depends on its element
    exception,   ///< the op does something else on purpose; `why` says what and why
  };
  Kind kind = undecided;  ///< the decision
  std::string why{};      ///< for an exception: what the op does instead, and why
};

/// One registered case for the generic tests. make_inputs builds the inputs in the requested
/// float dtype (integer inputs such as ids stay int64) from a seeded generator; float inputs
/// that should be checked come back with requires_grad set.
struct OpCase {
  std::string name;  ///< unique, such as "add/broadcast"
  std::string op;    ///< the declared op it covers, such as "add"
  /// Builds the inputs in a float dtype from a seeded generator.
  std::function<Tensors(DType, Generator&)> make_inputs;
  OpFn fn;                 ///< the op applied to the inputs
  GradcheckOptions opt{};  ///< tolerances of the float64 gradcheck
  /// Tolerances of the float32 (oneDNN) path vs the float64 path (check_f32_vs_f64()); f32_atol
  /// is relative to the largest float64 value (or 1).
  ///@{
  double f32_atol = 1e-4, f32_rtol = 1e-3;
  ///@}
  std::vector<ErrorInput> error_inputs{};  ///< bad inputs of the op and the errors they raise
  NonFiniteRule nonfinite{};               ///< what the op does with NaN and +-Inf inputs
};

/// The rule of almost every op: NaN propagates to every output that depends on it.
inline NonFiniteRule nan_propagates() { return {NonFiniteRule::propagates, ""}; }
/// An exception to nan_propagates(): `why` says what the op does instead, and why.
inline NonFiniteRule nan_exception(std::string why) {
  return {NonFiniteRule::exception, std::move(why)};
}
/// `c` with its non-finite decision set to `rule` (for cases built by a helper such as
/// one_input_case()).
inline OpCase with_nonfinite(OpCase c, NonFiniteRule rule) {
  c.nonfinite = std::move(rule);
  return c;
}

/// A case for an op that another op's backward records under create_graph (such as
/// slice_backward): its input is the upstream gradient v of `forward` (of shape out_shape) at a
/// constant leaf of in_shape, its output the gradient that forward's backward returns (taken
/// with create_graph), so gradcheck differentiates that backward in v. For linear ops (whose
/// backward does not depend on the point).
OpCase backward_op_case(std::string name, std::string op, Shape in_shape, Shape out_shape,
                        std::function<Tensor(const Tensor&)> forward);

/// A case of an op of one float input: uniform(lo, hi) of `shape`, stored with its last two dims
/// transposed when `transposed` (the op then sees a non-contiguous view, as case_input_t());
/// `fn` applies the op to it.
OpCase one_input_case(std::string name, std::string op, Shape shape, bool transposed,
                      std::function<Tensor(const Tensor&)> fn, double lo = -1, double hi = 1);

/// Adds a case to the registry (names must be unique). The library's own cases are registered by
/// register_op_cases() (graft/testing/op_cases.h); a program adds its own with explicit calls.
/// Thread-safe.
/// @throws graft::Error when a case of that name is already registered.
void register_case(OpCase c);

/// Registers the gradcheck cases of the engine's own ops (accumulate_grad, reduce_grad,
/// expand_grad: autograd/tape.h); register_op_cases() calls it. Idempotent.
void register_autograd_cases();

/// Input helper for cases: a uniform(lo, hi) leaf of `shape` that requires grad.
Tensor case_input(const Shape& shape, DType dt, Generator& g, double lo = -1, double hi = 1);
/// Input helper for cases: like case_input(), but stored with its last two dims transposed, so
/// the op sees a non-contiguous view of `shape`.
/// @throws graft::Error when `shape` has fewer than 2 dims.
Tensor case_input_t(const Shape& shape, DType dt, Generator& g, double lo = -1, double hi = 1);
/// Every case registered so far, in registration order.
const std::vector<OpCase>& registered_cases();
/// The names of registered_cases(), in registration order (what a data-driven test runs over).
std::vector<std::string> registered_case_names();
/// The registered case named `name`.
/// @throws graft::Error "no registered op case '<name>'".
const OpCase& registered_case(const std::string& name);
/// The case's inputs in float32 and float64 with the same values: the float32 inputs are the
/// float64 ones rounded (keeping any non-contiguous layout the case built), and the float64 ones
/// are then set to the rounded values; gradients cleared.
std::pair<Tensors, Tensors> case_inputs_f32_f64(const OpCase& c);

/// Runs the case's float32 forward and backward and compares output and input gradients with
/// the float64 path (same input values, same upstream gradient).
GradcheckResult check_f32_vs_f64(const OpCase& c);
/// The same comparison for the double backward (gradgradcheck()'s analytic side): the
/// second-order gradients of the float32 path against the float64 path, with the same v and u.
GradcheckResult check_f32_vs_f64_double_backward(const OpCase& c);

}  // namespace graft
