// softmax / log_softmax over one axis: y_i = exp(x_i - max) / sum_j exp(x_j - max).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

}  // namespace graft
