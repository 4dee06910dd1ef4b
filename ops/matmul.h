// matmul: a (..., M, K) @ b (..., K, N) -> (..., M, N), batch dims broadcast; 1-D operands are
// promoted as in torch.matmul. Transposed views (e.g. transpose(b, -1, -2)) are read through
// their strides, without a copy.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

Tensor matmul(const Tensor& a, const Tensor& b);
// linear: y = x W^T + b; x (..., IN), w (OUT, IN), b (OUT) or undefined -> y (..., OUT)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

}  // namespace graft
