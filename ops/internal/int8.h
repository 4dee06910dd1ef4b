// int8 inference for linear (internal to ops/; the switch is ops/precision.h, Precision::int8).
// Weights are quantized symmetrically per output channel, w ≈ ws[o] * wq[o][k] with wq in
// [-127, 127] and ws[o] = max_k |w[o][k]| / 127, once per version of the weight (kept like the bf16
// copies, kern::derived_copy). Activations are quantized per row at each call, x ≈ xs[n] * xq[n][k]
// with xs[n] = max_k |x[n][k]| / 127, and fed to the matmul as u8 = xq + 128 (the operand form
// VNNI's vpdpbusd and AMX multiply natively); the int32 sums are corrected by 128 * Σ_k wq[o][k]
// and dequantized with the bias added:
//   y[n][o] = (acc[n][o] - 128 Σ_k wq[o][k]) * xs[n] * ws[o] + b[o]
// An input row whose scale is not finite (a NaN or inf in it) gives NaN outputs, as float32
// would; an all-zero one gives exact zeros (plus the bias). A weight holding a NaN or inf is
// refused when it is quantized (kern::check_weight_finite names it and the element).
#pragma once

#include <string>
#include <utility>

#include "graft/autograd/tensor.h"

namespace graft::kern {

// y2 (N, OUT) = int8 linear of x2 (N, IN) and w (OUT, IN) (+ b (OUT) when defined), all float32
// and contiguous. `reference` computes the same integer sums in a plain loop instead of oneDNN's
// int8 kernel: bit for bit the same outputs (the sums are exact), at loop speed.
void linear_int8(const Tensor& x2, const Tensor& w, const Tensor& b, const Tensor& y2,
                 bool reference);

// Quantizes w (OUT, IN; float32, contiguous, the whole of its storage) once, keeps that form (in
// the kernel's layout, or plain rows with `reference`) as w's replacement and releases w's
// float32 values (Storage::release, the error naming `name`); linear_int8 reads the replacement,
// and derives from it what a slice of w or another layout needs. Returns the bytes freed (0 when
// w was replaced already). A NaN or inf in w is refused, naming `name`.
size_t quantize_for_inference(const Tensor& w, const std::string& name, bool reference);

// quantize_for_inference with the float32 values taken from `from` (contiguous, w's shape)
// instead of w's own: w (built without memory, or holding values) gets the form `from` quantizes
// to, and its own values, if any, are released.
size_t quantize_into(const Tensor& w, const Tensor& from, const std::string& name, bool reference);

// w's int8 form (quantized from its float32 values, or its replacement when they were freed) as
// the two tensors a file holds: the values, int8 (OUT, IN), and the scales, float32 (OUT):
// w ≈ scales[o] * values[o][k]. Set back with set_int8_parts, it is the same form bit for bit.
std::pair<Tensor, Tensor> int8_parts(const Tensor& w);

// Makes (values, scales) w's int8 form for good, as quantize_for_inference would from the float32
// weight they were quantized from (the same bytes: the row sums are recomputed, the values
// reordered into the kernel's layout), and releases w's float32 values if it holds any: a
// weight built without memory (nn::SkipInit) never allocates them. Errors name `name` (the
// values) and `scale_name`. Returns the bytes freed.
size_t set_int8_parts(const Tensor& w, const Tensor& values, const Tensor& scales,
                      const std::string& name, const std::string& scale_name, bool reference);

// Rows ids[0, N) of w's int8 replacement (quantize_for_inference, set_int8_parts) dequantized
// into out (N, IN): out[n][k] = scale[o] * wq[o][k] for o = ids[n] (the ids checked by the
// caller), read from whatever layout the form is in. False (nothing written) when w has no int8
// replacement. An embedding table made int8 is looked up this way (ops/shape.cpp, embedding).
bool gather_int8_rows(const Tensor& w, const int64_t* ids, int64_t N, float* out);
// Whether w's values were replaced by an int8 form (quantize_for_inference, set_int8_parts).
bool has_int8_form(const Tensor& w);

// For the tests: how many elements of an (OUT, IN) int8 weight reordered by oneDNN into each of
// the plain and blocked layouts its int8 kernels read (ab, ba, AB16b64a4b, BA16a64b4a, ...) are
// not where gather_int8_rows looks for them (0 when its offsets are right).
int64_t int8_layout_mismatches(int64_t OUT, int64_t IN);

// How many quantized weight copies have been made in this process (ops/precision.h:
// int8_weight_copies_made).
uint64_t int8_weight_copies();

}  // namespace graft::kern
