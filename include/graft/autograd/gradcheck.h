/// @file
/// gradcheck: compares the tape's analytic gradients with central differences in float64
/// (gradcheck(), and gradgradcheck() for the double backward). The registry of op records that the
/// generic tests run is in graft/testing/registry.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/autograd/tensor.h"

namespace graft {

/// The function under test: the op applied to its inputs, one output tensor.
using OpFn = std::function<Tensor(const Tensors&)>;

/// Tolerances of gradcheck(), PyTorch gradcheck's defaults: an element passes when
/// |analytic - numeric| <= atol + rtol * |numeric|.
struct GradcheckOptions {
  double eps = 1e-6;     ///< central-difference step
  double atol = 1e-5;    ///< absolute tolerance
  double rtol = 1e-3;    ///< relative tolerance (of |numeric|)
  uint64_t seed = 1234;  ///< for the random upstream gradient
};

/// The verdict of gradcheck(), gradgradcheck() or compare_f32_f64().
struct GradcheckResult {
  bool ok = true;          ///< every element within tolerance
  std::string message;     ///< the worst element on failure: input, index, analytic, numeric
  double max_abs_err = 0;  ///< the largest absolute difference seen
};

/// Checks d(sum(fn(inputs) * g))/d(input) for every float64 input that requires grad, with g a
/// random upstream gradient (all ones would hide transposed-gradient bugs): the tape's gradient
/// against central differences of step opt.eps. Inputs are modified in place while it runs and
/// restored; their .grad is cleared. A result that does not require grad is a failed result,
/// not an error.
/// @throws graft::Error when an input that requires grad is not float64 or the output is not
///         float (and whatever fn throws).
GradcheckResult gradcheck(const OpFn& fn, const Tensors& inputs, const GradcheckOptions& opt = {});

/// The second-order check, as torch.autograd.gradgradcheck: with a random upstream gradient v
/// (which itself requires grad), the first gradients G(x, v) = d(sum(fn(x) * v))/dx are taken
/// with create_graph, and the double backward's d(sum_k G_k * u_k)/d(x, v), u random, is compared
/// with central differences of the first gradients (each computed by an ordinary backward).
/// Inputs are modified in place while it runs and restored. A failure whose analytic second
/// derivative is exactly 0 says why that usually happens (a backward that runs untracked kernels
/// or saves untracked copies under create_graph).
/// @throws graft::Error as gradcheck(), and the error of an op declared without a double
///         backward (declare_op()) when fn uses one.
GradcheckResult gradgradcheck(const OpFn& fn, const Tensors& inputs,
                              const GradcheckOptions& opt = {});

/// Tolerances of a float32-vs-float64 comparison: an element differs when
/// |a32 - a64| > atol * max(1, max |a64|) + rtol * |a64|.
struct PrecisionTolerances {
  /// Absolute (relative to the largest float64 value, or 1) and relative tolerance.
  ///@{
  double atol = 1e-4, rtol = 1e-3;
  ///@}
};
/// fn's float32 forward and backward at x32 against its float64 ones at x64 (inputs of the same
/// values, such as case_inputs_f32_f64() builds): the output and the input gradients, with the
/// same upstream gradient (random, rounded to the low precision). x32 may be bf16 or f16 too
/// (the low precision is its first float input's dtype): the output must have that dtype and
/// each input's gradient its input's dtype.
GradcheckResult compare_f32_f64(const OpFn& fn, const Tensors& x32, const Tensors& x64,
                                const PrecisionTolerances& tol);
/// The same comparison for the double backward (gradgradcheck()'s analytic side): the
/// second-order gradients of the float32 path against the float64 path, with the same v and u.
GradcheckResult compare_f32_f64_double_backward(const OpFn& fn, const Tensors& x32,
                                                const Tensors& x64, const PrecisionTolerances& tol);

}  // namespace graft
