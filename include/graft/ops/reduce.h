/// @file
/// Reductions over axes. axes may be negative; an empty axes list reduces over every axis.
/// keepdim keeps reduced axes with size 1. x (...) -> out (... without axes).
///
/// Each throws graft::Error, naming the op, when x is undefined or not float, an axis is out of
/// range, or an axis is repeated.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// Sum over `axes` (all when empty): x (...) -> out (... without axes, or size 1 with keepdim).
/// Summed in a fixed order, so the result does not depend on the thread count.
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
/// Mean over `axes` (all when empty): x (...) -> out (... without axes, or size 1 with keepdim).
/// @throws graft::Error also when the reduced axes hold no elements.
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
/// max over one axis; the gradient flows to the first maximal element of each slice.
/// x (...) -> out (... without axis, or size 1 with keepdim).
/// @throws graft::Error also when the axis is empty.
Tensor max(const Tensor& x, int64_t axis, bool keepdim = false);
/// Maximum over `axes` (all when empty), PyTorch's amax: x (...) -> out (... without axes, or
/// size 1 with keepdim). NaN counts as maximal. The gradient is shared evenly among the
/// elements equal to their slice's maximum.
/// @throws graft::Error also when a reduced axis is empty.
Tensor amax(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
/// Index of the first maximal element along axis (NaN counts as maximal, as in PyTorch); int64,
/// axis removed; not differentiable. x is float (...) -> out int64 (... without axis).
/// @throws graft::Error also when the axis is empty.
Tensor argmax(const Tensor& x, int64_t axis);
/// var = sum((x - mean)^2) / (N - correction) over `axes` (all when empty), N the number of
/// reduced elements; correction 1 (unbiased) as PyTorch's default. A composite of sub, mean,
/// mul and sum on the tape.
/// @throws graft::Error also when N - correction <= 0.
Tensor var(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false,
           int64_t correction = 1);
/// Sums a broadcast gradient back to `shape` (the reverse of broadcasting); differentiable.
/// x (...) -> out (shape); x itself when its shape already is `shape`.
/// @throws graft::Error when x is undefined or `shape` does not broadcast to x's shape.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace graft
