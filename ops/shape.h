// Shape ops. reshape/permute/transpose/slice/unsqueeze/squeeze/broadcast_to return views that
// share storage when the layout allows (reshape of non-viewable data copies, as PyTorch does).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

Tensor reshape(const Tensor& x, Shape shape);  // one dim may be -1
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
// Elements start, start+step, ... < end along axis (start/end clamped like Python slices).
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
Tensor unsqueeze(const Tensor& x, int64_t axis);
Tensor squeeze(const Tensor& x, int64_t axis);
Tensor broadcast_to(const Tensor& x, const Shape& shape);  // a stride-0 view
Tensor contiguous(const Tensor& x);                         // differentiable copy if needed
Tensor to_dtype(const Tensor& x, DType dt);                 // differentiable cast (float<->float)
Tensor concat(const Tensors& xs, int64_t axis);
Tensors split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
// out = x.index_select(axis, idx): idx int64 1-D; backward scatter-adds.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& idx);
// Embedding lookup: weight (V, C), ids int64 (...) -> out (..., C). Backward scatter-adds into
// dweight; rows of padding_idx get no gradient (padding_idx < 0: none).
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx = -1);

}  // namespace graft
