// dropout: out = x * m / (1 - p), m ~ Bernoulli(1 - p) from the generator (same mask for any
// thread count and either float dtype); identity when !training or p == 0.
#pragma once

#include "autograd/tensor.h"

namespace graft {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

}  // namespace graft
