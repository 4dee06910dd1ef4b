// bfloat16 operands for the matmuls (internal to ops/; the switch is ops/precision.h). A bf16
// copy of a float32 operand lives in its own storage; when the operand fills a dense span of its
// storage in some dim order (contiguous, or a transpose of contiguous), the span is converted in
// storage order and keeps the operand's strides, else the copy is contiguous.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>

#include "graft/autograd/tensor.h"

namespace graft::kern {

// Round to nearest even on the bit pattern; a NaN stays a (quiet) NaN, overflow gives inf
// (graft/autograd/half.h, the one conversion).
inline uint16_t bf16_bits(float f) { return bf16_bits_of(f); }
inline float bf16_to_float(uint16_t b) { return bf16_bits_to_float(b); }

// True when t's elements fill exactly [offset, offset + numel) of its storage, in some order of
// its dims (size-1 dims ignored).
bool dense_span(const Tensor& t);

// A bf16 copy of a float32 tensor for oneDNN: its shape, the strides it was written with.
struct Bf16Operand {
  std::shared_ptr<Storage> storage;
  Shape shape, strides;
  void* data() const { return storage->data; }
};
// The strides to_bf16(t, false, ..) writes: t's own when dense_span(t), those of a transpose of
// a contiguous copy when t is a transpose view of contiguous rows (K^T), else contiguous.
Shape bf16_strides(const Tensor& t);
// t (float32, any strides) in bf16: contiguous when `contiguous`, else with bf16_strides(t).
// With `reuse`, a dense-span copy is kept until t's storage changes version or dies, and later
// calls for the same span return it (see kern::BCopy for who asks for that). Any other
// copy is written into this thread's buffer for `slot` (0 or 1, one per operand of a matmul),
// valid until the next to_bf16 for that slot on this thread.
// A kept copy counts as a weight's (bf16_weight_copies) unless `weight` is false.
Bf16Operand to_bf16(const Tensor& t, bool contiguous, bool reuse, int slot, bool weight = true);
// t (float32, any strides) in bf16, contiguous, in storage of its own: the copy an op converts
// an activation into for its forward matmul and keeps for its backward one, in place of t. Ops
// asking for the same view of unchanged values while an earlier copy lives get that copy.
Bf16Operand kept_bf16(const Tensor& t);
// Whether float32 matmuls run on oneDNN's bf16 kernel on this thread now.
bool bf16_kernel_in_force();
// Whether an op should keep kept_bf16(x) for its backward instead of saving x: under the oneDNN
// bf16 path, when x is an activation (made by a recorded op, not a leaf its owner holds) that
// no tape entry saves already (else the copy would add memory).
bool keep_bf16_of(const Tensor& x);
// While one is open on this thread, an operand whose span was the last one converted into its
// slot's buffer is not converted again (linear's backward reads dy for both dx and dW). Only for
// code that writes none of its matmul operands in place between the matmuls.
class Bf16ReuseScope {
 public:
  Bf16ReuseScope();
  ~Bf16ReuseScope();
  Bf16ReuseScope(const Bf16ReuseScope&) = delete;
  Bf16ReuseScope& operator=(const Bf16ReuseScope&) = delete;
};

// ---- 16-bit tensors (DType::bf16, DType::f16) on a CPU without their matmul kernel ----

// The per-thread buffer slots of half_to_f32: one per operand of a matmul and one for its output,
// apart from to_bf16's slots 0 and 1.
enum HalfSlot { kHalfA = 2, kHalfB = 3, kHalfOut = 4 };
// t (bf16 or f16, any strides) in float32 in this thread's buffer for `slot`, valid until the
// next call for that slot on this thread; t's strides when dense_span(t), else contiguous.
// Nothing is kept: a bf16 model's weights are widened for one matmul at a time. Without
// `values` the buffer is returned unwritten (an output to be overwritten).
Tensor half_to_f32(const Tensor& t, int slot, bool values = true);
// Writes float32 src (contiguous) into out (bf16 or f16, contiguous, same numel), each value
// rounded once (to nearest even).
void store_rounded(const Tensor& src, const Tensor& out);
// A bf16 copy (Bf16Operand) as a bf16 tensor: a view of its storage, nothing copied.
Tensor as_bf16_tensor(const Bf16Operand& k);

// How many reused copies were made (ops/precision.h: bf16_weight_copies_made).
uint64_t bf16_weight_copies();
// Counts a bf16 copy of a weight made elsewhere (linear's inference layout under bf16).
void count_bf16_weight_copy();
// The reference path: t's values rounded to bf16, as a float32 tensor (same layout rule and
// reuse as to_bf16).
Tensor rounded_to_bf16(const Tensor& t, bool reuse, bool weight = true);

}  // namespace graft::kern
