/// @file
/// dropout: out = x * m / (1 - p), m ~ Bernoulli(1 - p) from the generator (same mask for any
/// thread count and either float dtype); identity when !training or p == 0.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// Whether p is a drop probability: in [0, 1], PyTorch's rule (p = 1 drops every element; NaN
/// is refused). dropout(), relu_dropout(), attention's dropout, nn::Dropout and every model
/// config check their probabilities with it.
constexpr bool is_dropout_p(double p) { return p >= 0.0 && p <= 1.0; }

/// out = x * m / (1 - p), m ~ Bernoulli(1 - p) drawn from `gen` (advancing it by x.numel()
/// draws); x itself when !training or p == 0. x (...) -> out (...). The backward recomputes the
/// mask from the generator state it started from, so no mask is stored.
/// @throws graft::Error when x is undefined or not float, or p is outside [0, 1].
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

/// relu_dropout: dropout(relu(x)) as one op that keeps only its output for backward (the FFN's
/// hidden activation, which the next linear keeps anyway). Same mask and generator use as
/// dropout; relu(x) when !training or p == 0. x (...) -> out (...).
/// @throws graft::Error when x is undefined or not float, or p is outside [0, 1].
Tensor relu_dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

}  // namespace graft
