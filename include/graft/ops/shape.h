/// @file
/// Shape ops. reshape/permute/transpose/slice/unsqueeze/squeeze/broadcast_to return views that
/// share storage when the layout allows (reshape of non-viewable data copies, as PyTorch does).
///
/// They take any dtype (embedding's weight excepted) and are differentiable for float inputs.
/// Each throws graft::Error, naming the op and the input's shape, when an input is undefined or
/// an axis is out of range.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// x (...) -> out (shape), the same elements in row-major order; one dim may be -1 (inferred).
/// A view when the strides allow it, else a copy.
/// @throws graft::Error when more than one dim is -1, a dim is otherwise negative, or the
///         element counts differ.
Tensor reshape(const Tensor& x, Shape shape);
/// A view with the axes reordered: x (d0, ..., dn) -> out (d[dims[0]], ..., d[dims[n]]);
/// dims may be negative.
/// @throws graft::Error when dims is not a permutation of x's axes.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
/// A view with axes d0 and d1 swapped (a permute on the tape).
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
/// A view of the elements start, start+step, ... < end along axis (start/end clamped like Python
/// slices; negative ones count from the end): x (..., n, ...) -> out (..., len, ...).
/// @throws graft::Error when step < 1.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
/// A view with a size-1 axis inserted at `axis` (in [-(r+1), r] for x of rank r).
Tensor unsqueeze(const Tensor& x, int64_t axis);
/// A view without axis `axis`, which must have size 1.
/// @throws graft::Error when that axis does not have size 1.
Tensor squeeze(const Tensor& x, int64_t axis);
/// x (...) -> out (shape) under NumPy broadcasting: a stride-0 view, not a copy (write to it
/// only through a copy).
/// @throws graft::Error when x's shape does not broadcast to `shape`.
Tensor broadcast_to(const Tensor& x, const Shape& shape);
/// x itself when already contiguous, else a contiguous copy recorded on the tape (the gradient
/// passes through).
Tensor contiguous(const Tensor& x);
/// x itself when already of dtype dt, else a cast copy. Float-to-float casts are recorded (the
/// gradient is cast back); casts to int64 truncate and carry no gradient.
/// @throws graft::Error when a float value does not fit int64 (NaN, +-inf, out of range).
Tensor to_dtype(const Tensor& x, DType dt);
/// Joins tensors along `axis`: xs[i] (..., n_i, ...) -> out (..., sum n_i, ...), a fresh tensor.
/// @throws graft::Error when xs is empty or 0-d, or the inputs differ in dtype or in a dim
///         other than `axis`.
Tensor concat(const Tensors& xs, int64_t axis);
/// Views of consecutive pieces of x along `axis`, of the given sizes (which must sum to the
/// axis's size): x (..., n, ...) -> pieces (..., sizes[i], ...).
/// @throws graft::Error when a size is negative or the sizes do not sum to the axis's size.
Tensors split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
/// out = x.index_select(axis, idx): idx int64 1-D; backward scatter-adds.
/// x (..., n, ...), idx (k) -> out (..., k, ...), a fresh tensor.
/// @throws graft::Error when idx is not a 1-D int64 tensor or an index is outside [0, n).
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& idx);
/// x[i] = x[idx[i]] along axis 0, in place, every old row read before any is written (a
/// selection with repeats, as beam search reorders its caches); rows with idx[i] == i are not
/// copied. x may be a view whose last dim is contiguous (a KV cache's first positions). Not
/// recorded (no gradient); bumps x's version.
/// @throws graft::Error when idx is not a 1-D int64 tensor of x.size(0) entries, an index is
///         outside [0, x.size(0)), or x's last dim is not contiguous.
void select_rows_(const Tensor& x, const Tensor& idx);
/// Embedding lookup: weight (V, C), ids int64 (...) -> out (..., C). Backward scatter-adds into
/// dweight; rows of padding_idx get no gradient (padding_idx < 0: none).
/// @throws graft::Error when weight is undefined, not float or not 2-D, ids is not int64,
///         padding_idx >= V, or an id is outside [0, V).
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx = -1);

}  // namespace graft
