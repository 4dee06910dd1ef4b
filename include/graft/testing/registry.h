/// @file
/// The registry of op records that the generic tests run (tests/test_gradcheck_all.cpp,
/// test_nonfinite.cpp, test_undefined.cpp): one OpRecord per op carries its samples, bad inputs,
/// double backward and NaN rule. An op written outside graft registers its record here and is
/// checked like the library's own (examples/custom_op). Implemented by the graft_testing library
/// (graft::testing in the CMake package), which the shipped libraries do not contain. Not in the
/// umbrella headers: include <graft/testing/registry.h> where cases are written, and
/// <graft/testing/op_cases.h> for the library's own.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/elementwise.h"

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

/// One sample of an op (OpInfo's sample input): the gradcheck case the generic tests run.
/// make_inputs builds the inputs in the requested float dtype (integer inputs such as ids stay
/// int64) from a seeded generator; float inputs that should be checked come back with
/// requires_grad set.
struct OpCase {
  std::string name;  ///< unique, such as "add/broadcast"
  std::string op{};  ///< the op it samples; register_op() sets it to the record's name
  /// Builds the inputs in a float dtype from a seeded generator.
  std::function<Tensors(DType, Generator&)> make_inputs;
  OpFn fn;                 ///< the op applied to the inputs
  GradcheckOptions opt{};  ///< tolerances of the float64 gradcheck
  /// Tolerances of the float32 (oneDNN) path vs the float64 path (check_f32_vs_f64()); f32_atol
  /// is relative to the largest float64 value (or 1).
  ///@{
  double f32_atol = 1e-4, f32_rtol = 1e-3;
  ///@}
  /// The depth k of the case in 16-bit precision (check_low_vs_f64()): how many roundings to
  /// the 16-bit dtype lie on the longest path from an input to the output or to a gradient (an
  /// op through float32 rounds once forward and once backward; each further recorded op of a
  /// case's fn in bf16 adds its own). The tolerance is k u max(1, max |ref|) + k u |ref|, u the
  /// dtype's unit roundoff (2^-8 for bf16, 2^-11 for f16).
  double low_depth = 2;
  /// Why the case does not run in bf16 and f16 (empty: it does); only for an op that cannot
  /// take a 16-bit float input by nature.
  std::string no_low_precision{};
};

/// How an op's backward is differentiated again (gradgradcheck).
enum class DoubleBackward {
  undecided,    ///< not stated: the record check fails
  composed,     ///< under create_graph the backward is built from recorded ops
  backward_op,  ///< the backward records a registered op of its own (OpRecord::double_backward_op)
  none,         ///< once differentiable (GRAFT_DECLARE_OP_ONCE_DIFFERENTIABLE)
};

/// Everything the generic tests know of one op, declared once (as PyTorch's OpInfo with its
/// derivatives.yaml line): the checks of tests/test_gradcheck_all, test_nonfinite and
/// test_undefined are derived from it. Every field but accepts_undefined must be filled
/// (missing_fields()); the op itself is declared to the tape with GRAFT_DECLARE_OP in the
/// library, and the record must agree with that declaration.
struct OpRecord {
  std::string name{};    ///< the declared op, such as "add"
  std::string family{};  ///< its family, as declared (the ops/ file stem)
  /// The public function that records it ("add"); for an op that a backward records, the public
  /// function whose backward does ("slice" for slice_backward).
  std::string forward{};
  /// Its backward function, <tt>name_backward</tt> by convention ("composite" for an op declared
  /// for its checks but computed by other recorded ops, such as var).
  std::string backward{};
  DoubleBackward double_backward = DoubleBackward::undecided;  ///< how its backward differentiates
  /// For DoubleBackward::backward_op: the op its backward records (which has a record too).
  std::string double_backward_op{};
  std::vector<OpCase> samples{};           ///< the gradcheck cases (at least one)
  std::vector<ErrorInput> error_inputs{};  ///< bad inputs and their errors (at least one)
  /// Input slots of the samples that may be undefined (a parameter documented as optional): the
  /// undefined-tensor check expects success there, graft::Error naming the op elsewhere.
  std::vector<size_t> accepts_undefined{};
  NonFiniteRule nonfinite{};  ///< what the op does with NaN and +-Inf inputs (decided)
};

/// What `r` lacks, one line per missing field ("'x' has no error_inputs"); empty when complete.
std::vector<std::string> missing_fields(const OpRecord& r);

/// The rule of almost every op: NaN propagates to every output that depends on it.
inline NonFiniteRule nan_propagates() { return {NonFiniteRule::propagates, ""}; }
/// An exception to nan_propagates(): `why` says what the op does instead, and why.
inline NonFiniteRule nan_exception(std::string why) {
  return {NonFiniteRule::exception, std::move(why)};
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

/// Adds an op's record to the registry (op and sample names must be unique; each sample's op
/// is set to the record's name). The library's own records are registered by register_op_cases()
/// (graft/testing/op_cases.h); a program adds its own with explicit calls. Thread-safe.
/// @throws graft::Error when an op or a sample of that name is already registered, or a sample
///         names another op.
void register_op(OpRecord r);

/// Declares a UnaryOp row's op (autograd::declare_op()) and registers its record: samples
/// "<name>/contiguous" and "<name>/transposed" (inputs on [row.lo, row.hi], kept 10% of the range
/// away from row.kinks), an int64 input as its error input, NaN propagating, a double backward
/// when the row has a df_op.
/// @throws graft::Error as register_op().
void register_unary_cases(const UnaryOp& row);
/// register_unary_cases() for a row whose function has bad inputs of its own besides an int64
/// input, or a NaN rule of its own.
void register_unary_cases(const UnaryOp& row, std::vector<ErrorInput> more_errors,
                          NonFiniteRule nonfinite);

/// Registers the gradcheck cases of the engine's own ops (accumulate_grad, reduce_grad,
/// expand_grad: autograd/tape.h); register_op_cases() calls it. Idempotent.
void register_autograd_cases();

/// Input helper for cases: a uniform(lo, hi) leaf of `shape` that requires grad.
Tensor case_input(const Shape& shape, DType dt, Generator& g, double lo = -1, double hi = 1);
/// Input helper for cases: like case_input(), but stored with its last two dims transposed, so
/// the op sees a non-contiguous view of `shape`.
/// @throws graft::Error when `shape` has fewer than 2 dims.
Tensor case_input_t(const Shape& shape, DType dt, Generator& g, double lo = -1, double hi = 1);
/// The dtype of case input x, or float64 when x is undefined: a sample that makes other tensors
/// in its input's dtype still reaches its op when the undefined-input check
/// (tests/test_undefined.cpp) hands it an undefined tensor.
DType case_dtype(const Tensor& x);
/// Every record registered so far, in registration order (a copy: registration may go on in
/// another thread). The registry's functions are thread-safe, and the references that
/// registered_record() and registered_case() return stay valid (records are never removed).
std::vector<OpRecord> registered_records();
/// The registered record of op `op`.
/// @throws graft::Error "no registered op record '<op>'".
const OpRecord& registered_record(const std::string& op);
/// Every sample of every record, in registration order.
std::vector<OpCase> registered_cases();
/// The names of registered_cases(), in registration order (what a data-driven test runs over).
std::vector<std::string> registered_case_names();
/// The registered case named `name`.
/// @throws graft::Error "no registered op case '<name>'".
const OpCase& registered_case(const std::string& name);
/// The case's inputs in float32 and float64 with the same values: the float32 inputs are the
/// float64 ones rounded (keeping any non-contiguous layout the case built), and the float64 ones
/// are then set to the rounded values; gradients cleared.
std::pair<Tensors, Tensors> case_inputs_f32_f64(const OpCase& c);

/// case_inputs_f32_f64() for another low-precision dtype (float32, bf16 or f16): the float64
/// inputs hold the low-precision values exactly.
std::pair<Tensors, Tensors> case_inputs_low_f64(const OpCase& c, DType low);
/// The unit roundoff of a float dtype: 2^-8 for bf16, 2^-11 for f16, 2^-24 for float32.
double unit_roundoff(DType dt);

/// Runs the case's float32 forward and backward and compares output and input gradients with
/// the float64 path (same input values, same upstream gradient).
GradcheckResult check_f32_vs_f64(const OpCase& c);
/// The same comparison in bf16 or f16 (`low`): output and first-order gradients (each in its
/// input's dtype) against the float64 path at the same (16-bit) input values and upstream
/// gradient, within c.low_depth * u * max(1, max |ref|) + c.low_depth * u * |ref|, u =
/// unit_roundoff(low).
GradcheckResult check_low_vs_f64(const OpCase& c, DType low);
/// The same comparison for the double backward (gradgradcheck()'s analytic side): the
/// second-order gradients of the float32 path against the float64 path, with the same v and u.
GradcheckResult check_f32_vs_f64_double_backward(const OpCase& c);

}  // namespace graft
