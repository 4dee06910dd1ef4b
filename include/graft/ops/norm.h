/// @file
/// layer_norm: y = (x - mean) / sqrt(var + eps) * w + b over the last dim (biased var);
/// x (..., C), w (C) and b (C) optional (undefined) -> y (..., C).
/// rms_norm: y = x / sqrt(mean(x^2) + eps) * w over the last dim; x (..., C), w (C) optional.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// Layer normalisation over the last dim (see the file's description): x (..., C), w (C) or
/// undefined, b (C) or undefined -> y (..., C); differentiable in x, w and b.
/// @throws graft::Error "layer_norm: x ...: ..." when x is undefined, not float or 0-d, w or b
///         differs from x in dtype or is not (C), or eps < 0.
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps = 1e-5);

/// layer_norm(x + r, w, b, eps) as one op (a post-LN Transformer's residual add and LayerNorm):
/// one pass over each row, and the sum is not kept unless the backward needs it. x and r have
/// one shape (no broadcasting); differentiable in x, r, w and b.
/// @throws graft::Error "add_layer_norm: ..." for what layer_norm() rejects, and when r is
///         undefined or differs from x in dtype or shape.
Tensor add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                      double eps = 1e-5);

/// RMS normalisation over the last dim (Llama's RMSNorm, torch.nn.functional.rms_norm):
/// y = x / sqrt(mean(x^2) + eps) * w; x (..., C), w (C) or undefined -> y (..., C);
/// differentiable in x and w. No mean is subtracted and there is no shift.
/// @throws graft::Error "rms_norm: x ...: ..." when x is undefined, not float or 0-d, w differs
///         from x in dtype or is not (C), or eps < 0.
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps = 1e-6);

}  // namespace graft
