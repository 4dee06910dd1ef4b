/// @file
/// matmul: a (..., M, K) @ b (..., K, N) -> (..., M, N), batch dims broadcast; 1-D operands are
/// promoted as in torch.matmul. Transposed views (e.g. transpose(b, -1, -2)) are read through
/// their strides, without a copy.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// Matrix product with broadcast batch dims: a (..., M, K) @ b (..., K, N) -> (..., M, N); a
/// 1-D a is (1, K) and a 1-D b is (K, 1), the added dim dropped from the result (torch.matmul).
/// Float32 products follow the precision setting (ops/precision.h).
/// @throws graft::Error "matmul: (2, 3) @ (4, 5): ..." when an operand is undefined, not float
///         or 0-d, the dtypes differ, the inner dims differ, or the batch dims do not broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
/// linear: y = x W^T + b; x (..., IN), w (OUT, IN), b (OUT) or undefined -> y (..., OUT)
/// @throws graft::Error "linear: x ..., w ...: ..." when x or w is not float, the dtypes
///         differ, x is 0-d, w is not 2-D, x's last dim is not IN, or b is not (OUT).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

}  // namespace graft
