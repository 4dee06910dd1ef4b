// Reductions over axes. axes may be negative; an empty axes list reduces over every axis.
// keepdim keeps reduced axes with size 1. x (...) -> out (... without axes).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
// max over one axis; the gradient flows to the first maximal element of each slice.
Tensor max(const Tensor& x, int64_t axis, bool keepdim = false);
// Index of the first maximal element along axis (NaN counts as maximal, as in PyTorch); int64,
// axis removed; not differentiable.
Tensor argmax(const Tensor& x, int64_t axis);
// var = sum((x - mean)^2) / (N - correction); correction 1 (unbiased) as PyTorch's default.
Tensor var(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false,
           int64_t correction = 1);
// Sums a broadcast gradient back to `shape` (the reverse of broadcasting); differentiable.
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace graft
