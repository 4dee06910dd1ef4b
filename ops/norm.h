/// @file
/// layer_norm: y = (x - mean) / sqrt(var + eps) * w + b over the last dim (biased var);
/// x (..., C), w (C) and b (C) optional (undefined) -> y (..., C).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// Layer normalisation over the last dim (see the file's description): x (..., C), w (C) or
/// undefined, b (C) or undefined -> y (..., C); differentiable in x, w and b.
/// @throws graft::Error "layer_norm: x ...: ..." when x is undefined, not float or 0-d, w or b
///         differs from x in dtype or is not (C), or eps < 0.
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps = 1e-5);

}  // namespace graft
