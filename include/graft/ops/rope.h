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

#include <vector>

#include "graft/autograd/tensor.h"

namespace graft {

/// Rotates every row of x by its position's angles (see the file's description):
/// x (..., T, D) with D even, positions int64 (T) -> y (..., T, D); differentiable in x.
/// @throws graft::Error "rope: x ..., positions ...: ..." when x is undefined, not float, of
///         rank < 2 or with D odd, positions is undefined or not int64 (T), or base is not finite
///         and > 1.
Tensor rope(const Tensor& x, const Tensor& positions, double base = 10000.0);

/// rope() with the pair frequencies given: angle = t * inv_freq[i], i < D / 2 (a scaled rope
/// such as Llama 3's; rope_frequencies() gives the plain ones).
/// @throws graft::Error as rope(), and "rope: ... inv_freq has N entries, D / 2 = M" when the
///         table's length is not D / 2 or an entry is not finite.
Tensor rope(const Tensor& x, const Tensor& positions, const std::vector<double>& inv_freq);

/// The plain frequencies base^(-2i/D), i < D / 2.
/// @throws graft::Error when D is not even and positive, or base is not finite and > 1.
std::vector<double> rope_frequencies(int64_t D, double base);

}  // namespace graft
