/// @file
/// Rotary position embedding (Su et al., RoFormer). "Rotate half" pairing as in GPT-NeoX/LLaMA:
/// for each row (a head vector of a query or key at absolute position t), with h = D / 2 and
/// theta_i = base^(-2i / D), angle = t * theta_i, i < h:
/// @code
///   y[i]     = x[i] cos(angle) - x[i + h] sin(angle)
///   y[i + h] = x[i + h] cos(angle) + x[i] sin(angle)
/// @endcode
/// x (..., T, D) with D even, positions int64 (T) -> y (..., T, D). q·k of two rotated vectors
/// depends on their positions only through the difference.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// Rotates every row of x by its position's angles (see the file's description):
/// x (..., T, D) with D even, positions int64 (T) -> y (..., T, D); differentiable in x.
/// @throws graft::Error "rope: x ..., positions ...: ..." when x is undefined, not float, of
///         rank < 2 or with D odd, positions is undefined or not int64 (T), or base is not finite
///         and > 1.
Tensor rope(const Tensor& x, const Tensor& positions, double base = 10000.0);

}  // namespace graft
