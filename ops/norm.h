// layer_norm: y = (x - mean) / sqrt(var + eps) * w + b over the last dim (biased var);
// x (..., C), w (C) and b (C) optional (undefined) -> y (..., C).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps = 1e-5);

}  // namespace graft
