/// @file
/// Attention's head layout, as copies: the projections' rows (B, T, parts * H * Dh) to
/// head-major (B, H, T, Dh) tensors and back. Attention's matmuls then read dense (B*H, T, Dh)
/// batches, which oneDNN multiplies at matmul speed, where head-split views (permuted strides)
/// land on its slow strided kernel.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// y (B, T, parts * heads * Dh) -> `parts` tensors (B, heads, T, Dh), each dense: part p, head h
/// takes columns [(p * heads + h) * Dh, + Dh) of every row (the packed [Q; K; V] projection with
/// parts = 3). Differentiable; a part that receives no gradient counts as zeros.
/// @throws graft::Error "split_heads: ..." when y is undefined or not a rank-3 float tensor, or
///         parts or heads is not positive, or parts * heads does not divide y's last dim.
Tensors split_heads(const Tensor& y, int64_t parts, int64_t heads);

/// x (B, H, T, Dh) -> (B, T, H * Dh), dense: the heads side by side in every row (the inverse
/// of split_heads() with one part). Differentiable.
/// @throws graft::Error "merge_heads: ..." when x is undefined or not a rank-4 float tensor.
Tensor merge_heads(const Tensor& x);

}  // namespace graft
