/// @file
/// Comparisons and logical ops on masks: eq, ne, lt, le, gt, ge between two tensors (broadcast
/// together, NumPy/PyTorch rules) or a tensor and a scalar, and logical_not/and/or. None is
/// differentiable: the result never requires grad, whatever its inputs.
///
/// A mask is a tensor of 0s and 1s in a numeric dtype: the comparisons give one in the promoted
/// dtype of their operands (int64 < float32 < float64, as PyTorch promotes arithmetic), so it
/// composes with arithmetic without a cast (mul by a mask, mean of one for an accuracy), and
/// where() and masked_fill() take it as it is (non-zero is true). Accuracy without a loop:
/// @code
///   Tensor acc = mean(to_dtype(eq(argmax(logits, -1), target), DType::f32));
/// @endcode
/// graft has no bool dtype (see docs/ops.md, "Comparisons and masks", for why). NaN compares
/// unequal to everything, itself included: ne gives 1, the others 0 (IEEE, as PyTorch). int64
/// against int64 compares exactly (ids beyond 2^53 too); any other pair compares in the promoted
/// float dtype.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// a == b, a != b, a < b, a <= b, a > b, a >= b elementwise, a and b broadcast together:
/// a (...), b (...) -> mask (broadcast shape) of 0s and 1s in the promoted dtype of a and b.
/// Not differentiable.
/// @throws graft::Error "<op>: a is an undefined tensor" (or b), or "<op>: shapes .. and ..
///         cannot be broadcast (dim i: x vs y)".
///@{
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
///@}

/// a != v, a < v, a <= v, a > v, a >= v elementwise against a scalar: a (...) -> mask (...) of
/// a's dtype (eq(a, v) is in ops/elementwise.h). An int64 a against an integral v that fits
/// int64 compares exactly. Not differentiable.
/// @throws graft::Error "<op>: a is an undefined tensor".
///@{
Tensor ne(const Tensor& a, double v);
Tensor lt(const Tensor& a, double v);
Tensor le(const Tensor& a, double v);
Tensor gt(const Tensor& a, double v);
Tensor ge(const Tensor& a, double v);
///@}

/// 1 where a is 0, else 0: a (...) -> mask (...) of a's dtype. Not differentiable. NaN is
/// non-zero, so true.
/// @throws graft::Error "logical_not: a is an undefined tensor".
Tensor logical_not(const Tensor& a);
/// a && b and a || b elementwise (non-zero is true), broadcast together: a (...), b (...) ->
/// mask (broadcast shape) in the promoted dtype. Not differentiable.
/// @throws graft::Error when a or b is undefined or the shapes do not broadcast, naming the op.
///@{
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
///@}

}  // namespace graft
