/// @file
/// softmax / log_softmax over one axis: y_i = exp(x_i - max) / sum_j exp(x_j - max).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// Softmax along `axis` (negative counts from the end): x (...) -> y (...), each slice along
/// axis summing to 1; a 0-d x is a one-element vector.
/// @throws graft::Error when x is undefined or not float, or the axis is out of range.
Tensor softmax(const Tensor& x, int64_t axis = -1);
/// log(softmax(x)) along `axis`, computed stably: x (...) -> y (...).
/// @throws graft::Error when x is undefined or not float, or the axis is out of range.
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

}  // namespace graft
