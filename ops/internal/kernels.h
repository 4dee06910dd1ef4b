// Shared helpers for op implementations (internal to ops/; the public part, with broadcasting,
// the parallel loops and the float checks, is ops/custom.h, included here): views that record
// nothing, the one batched-matmul path (oneDNN with a primitive cache for float32, a reference
// loop for float64), strided iteration with OpenMP, and the checks that produce the library's
// error messages.
#pragma once

#include <functional>
#include <memory>

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/autograd/tensor.h"
#include "graft/ops/custom.h"
#include "graft/ops/shape.h"
#include "ops/internal/bf16.h"

namespace graft::kern {

// ---- bf16 and f16 inputs through float32 ----
//
// An op without 16-bit kernels runs on float32 copies of its bf16 (or f16) float inputs, made by
// the recorded cast (to_dtype), and casts its float outputs back, recorded too: the gradient
// flows through both casts and reaches a bf16 input as bf16, and the pair differentiates to any
// order (a cast is linear). It costs a float32 copy of each 16-bit input and output (and of
// their gradients in backward) and an extra tape entry per cast; the arithmetic is float32's,
// rounded once to the 16-bit dtype at the output. Mixed float dtypes (bf16 with float32, bf16
// with f16) are refused with "<op>: dtype mismatch, ..." (PyTorch would promote).

// An argument of any dtype that via_f32 passes on untouched and leaves out of its dtype check:
// a mask (where's cond, masked_fill's mask), which the op reads in any dtype.
struct AnyDtype {
  const Tensor& t;
};

namespace f32_detail {
// The first 16-bit float tensor among the arguments (AnyDtype ones and undefined ones left out)
// goes into `half`. No allocation: every op call of every dtype runs this.
inline void find_half(const Tensor*& half, const Tensor& t) {
  if (!half && t.defined() && is_half(t.dtype())) half = &t;
}
inline void find_half(const Tensor*& half, const Tensors& ts) {
  for (const Tensor& t : ts) find_half(half, t);
}
inline void find_half(const Tensor*&, const AnyDtype&) {}
template <class A>
void find_half(const Tensor*&, const A&) {}

// Fails when float tensor t has another dtype than `half`.
inline void check_matches(const char* op, const Tensor& half, const Tensor& t) {
  if (t.defined() && is_floating(t.dtype()) && t.dtype() != half.dtype())
    fail(std::string(op) + ": dtype mismatch, " + describe(half) + " vs " + describe(t));
}
inline void check_matches(const char* op, const Tensor& half, const Tensors& ts) {
  for (const Tensor& t : ts) check_matches(op, half, t);
}
inline void check_matches(const char*, const Tensor&, const AnyDtype&) {}
template <class A>
void check_matches(const char*, const Tensor&, const A&) {}

// An argument as the float32 op takes it: 16-bit tensors cast (recorded), anything else as is.
inline Tensor lifted(const Tensor& t) {
  return t.defined() && is_half(t.dtype()) ? to_dtype(t, DType::f32) : t;
}
inline Tensors lifted(const Tensors& ts) {
  Tensors out;
  for (const Tensor& t : ts) out.push_back(lifted(t));
  return out;
}
inline const Tensor& lifted(const AnyDtype& a) { return a.t; }
template <class A>
const A& lifted(const A& a) {
  return a;
}

// A result back in the 16-bit dtype dt: its float32 tensors cast (recorded); int64 ones (argmax's
// indices) and undefined ones as they are.
inline Tensor lowered(const Tensor& t, DType dt) {
  return t.defined() && t.dtype() == DType::f32 ? to_dtype(t, dt) : t;
}
inline Tensors lowered(const Tensors& ts, DType dt) {
  Tensors out;
  for (const Tensor& t : ts) out.push_back(lowered(t, dt));
  return out;
}
}  // namespace f32_detail

// The 16-bit dtype among the float tensors of the arguments, or nullopt when there is none.
// @throws graft::Error "<op>: dtype mismatch, bf16 (2, 3) vs f32 (3)" when a 16-bit
//         tensor meets a float tensor of another dtype.
template <class... A>
std::optional<DType> half_dtype_of(const char* op, const A&... args) {
  const Tensor* half = nullptr;
  (f32_detail::find_half(half, args), ...);
  if (!half) return std::nullopt;
  (f32_detail::check_matches(op, *half, args), ...);
  return half->dtype();
}

// How many op calls went through float32 (via_f32) on any thread: tests/test_half_native.cpp
// checks that inference of the ops with 16-bit loops adds none.
uint64_t f32_detours();
void count_f32_detour();

// How many float32 inference linears ran as pieces of outputs, one single-threaded dnnl_sgemm
// each (ops/matmul.cpp's linear_pieces_avx2; AVX2 builds without AVX-512), on any thread:
// tests/test_matmul.cpp checks the path runs where expected.
uint64_t linear_pieces_calls();

// ---- 16-bit tape entries ----
//
// A recorded op with a 16-bit entry of its own (attention, relu_dropout, add_layer_norm) runs its
// float32 code on copies made by widened() (recording nothing, freed after the call), rounds its
// outputs with narrowed(), and saves its 16-bit tensors, widening them again in backward: the
// float32 arithmetic of via_f32 without the float32 copies on the tape.

// A float32 copy of t that records nothing (t is detached; undefined stays undefined).
Tensor widened(const Tensor& t);
// t rounded to dt, recording nothing (undefined stays undefined).
Tensor narrowed(const Tensor& t, DType dt);

// ---- native 16-bit loops (inference) ----
//
// An op with a 16-bit loop runs it when a float tensor among `ts` is bf16 or f16 and nothing is
// recorded (inference): the 16-bit tensors read and written directly, each element widened to
// float32 in registers, the arithmetic float32's, each output rounded once, no float32 copy of an
// input or output made. One exception: attention with more than 4 query rows makes a float32
// (B, H, Tq, Tk) scores tensor and rounds P to the 16-bit dtype for the P V matmul (as PyTorch's
// CPU flash attention does for reduced types). Recorded calls keep the float32 detour (via_f32,
// or a 16-bit tape entry: widened), so the backward formulas are float32's. The same dtype checks
// as via_f32
// ("<op>: dtype mismatch, ..."). Variadic, so a call with no 16-bit tensor (every float32 op
// call) allocates nothing; the list for needs_record is built only past the dtype check.
template <class... A>
bool native_half(const char* op, const A&... ts) {
  return half_dtype_of(op, ts...) && !autograd::needs_record({ts...});
}

// The arithmetic type of a loop over storage type S: float for the 16-bit ones, S otherwise.
template <class S>
using acc_t = std::conditional_t<std::is_same_v<S, double>, double, float>;

// Runs `f` with S = bfloat16 or float16 (dt must be one of them).
#define GRAFT_DISPATCH_HALF(dt, ...)    \
  [&] {                                 \
    if ((dt) == ::graft::DType::bf16) { \
      using S = ::graft::bfloat16;      \
      return __VA_ARGS__();             \
    }                                   \
    using S = ::graft::float16;         \
    return __VA_ARGS__();               \
  }()

// f(args...) on float32 when a float tensor argument is bf16 or f16: those arguments cast to
// float32 and the float32 outputs (a Tensor or Tensors) cast back, all recorded; nullopt when
// no argument is 16-bit (the op then runs itself). Undefined tensors, int64 tensors and other
// arguments pass as they are. `op` names the op in the dtype-mismatch error.
template <class F, class... A>
auto via_f32(const char* op, F&& f, const A&... args)
    -> std::optional<std::decay_t<std::invoke_result_t<F, decltype(f32_detail::lifted(args))...>>> {
  const std::optional<DType> dt = half_dtype_of(op, args...);
  if (!dt) return std::nullopt;
  count_f32_detour();
  return f32_detail::lowered(f(f32_detail::lifted(args)...), *dt);
}

// The first line of an op without 16-bit kernels: returns fn(args...) run through float32 when
// a float argument is bf16 or f16 (via_f32); otherwise the op goes on.
#define GRAFT_VIA_F32(op, fn, ...)                                                    \
  if (auto graft_f32_result_ = ::graft::kern::via_f32(                                \
          op, [&](const auto&... graft_a_) { return fn(graft_a_...); }, __VA_ARGS__)) \
  return std::move(*graft_f32_result_)

// ---- a linear map's backward under create_graph ----

// A raw linear map of a gradient (such as slice's backward: scatter into zeros).
using LinearMap = std::function<Tensor(const Tensor&)>;
// f(g) recorded as op `name` when g requires grad (a backward under create_graph), with backward
// `adjoint` recorded the same way under op `adjoint_name`, so the pair differentiates to any
// order: slice's backward is apply_linear("slice_backward", "slice", dout, pad, cut).
Tensor apply_linear(const char* name, const char* adjoint_name, const Tensor& g, const LinearMap& f,
                    const LinearMap& adjoint);

// ---- views that record nothing (for operands, and inside forward and backward) ----

// t's storage read with another shape and strides, at t's offset.
Tensor view_as(const Tensor& t, const Shape& shape, const Shape& strides);
// The last two dims swapped: the transpose of every matrix in a batch, without a copy.
Tensor swap_last2(const Tensor& t);
// A contiguous t read as `shape` (same numel).
Tensor reshaped(const Tensor& t, const Shape& shape);
// A contiguous (..., C) t read as (rows, C).
Tensor as_rows(const Tensor& t);
// Rows [r0, r1) of a 2-D t.
Tensor row_range(const Tensor& t, int64_t r0, int64_t r1);
// True when every batch dim (all but the last two) of t is 1.
bool batch_is_one(const Tensor& t);
// Whether a float32 elementwise or norm op over n elements that records nothing (inference)
// takes its plain loop instead of a oneDNN primitive: below 4096 elements a primitive's fixed
// cost per call (2-4 µs measured for eltwise, binary and layer norm) is more than the work (the
// ops of one decoding step of a small model). Recorded ops keep oneDNN, so the gradcheck cases
// still compare oneDNN's float32 with the float64 loop.
bool loop_beats_onednn(int64_t n, bool record);
// If dims [0, rank-1) of t (batch dims and M) can be read as one dim, its stride (the rows of a
// (B..., M, K) operand laid out as one (B*M, K) matrix); -1 otherwise.
int64_t merged_row_stride(const Tensor& t);

// ---- matmul into a buffer ----

// How b's bf16 copy lives (under the bf16 path): made for the call (per_call); kept until b
// changes, as a weight's (weight: counted by bf16_weight_copies_made()); or kept the same way for
// an activation that stays unchanged from call to call (steady: the encoder keys and values of
// cached decoding's cross-attention).
enum class BCopy { per_call, weight, steady };

// A matmul operand: a float32 tensor, or the bf16 copy of one that an op made in forward and
// keeps for its backward (kept_bf16), multiplied as it is (the oneDNN bf16 path only).
struct Operand {
  Tensor f32;
  Bf16Operand kept;                               // storage set: the kept bf16 copy (f32 undefined)
  Operand(const Tensor& t) : f32(t) {}            // NOLINT: a tensor is an operand
  Operand(Bf16Operand k) : kept(std::move(k)) {}  // NOLINT: so is a kept copy
  bool is_kept() const { return kept.storage != nullptr; }
  const Shape& shape() const { return is_kept() ? kept.shape : f32.shape(); }
};
// The operand with its last two dims swapped (a transpose view, nothing copied).
Operand transposed(const Operand& o);

// out (B..., M, N) = alpha * a (Ba..., M, K) @ b (Bb..., K, N), or out += that with accumulate.
// a, b, out of equal rank >= 2 and one float dtype; the batch dims of a and b equal those of out
// or are 1 (broadcast); a and b any strides (transposes and head-split permutes as views), out
// contiguous (a row range of a bigger tensor is fine). float32 runs oneDNN matmul, its primitive
// built once per problem and thread, with bf16 operands under PrecisionGuard(bf16)
// (ops/precision.h); float64 a reference loop. bf16 or f16 a and b (one dtype; a kept bf16 copy
// goes with bf16) are read as they are, whatever the precision setting, into out of their dtype
// or float32: oneDNN's 16-bit matmul with float32 sums where half_kernel_available(), else the
// float32 one on operands widened into per-thread buffers (said once on stderr), the result
// rounded once; b_copy is moot there (no copy is kept). b_copy: how b's bf16 copy lives (BCopy).
// Either operand may be a kept bf16 copy (Operand). Records nothing: for ops that run matmuls
// inside their own forward or backward.
void bmm(const Operand& a, const Operand& b, const Tensor& out, double alpha = 1.0,
         bool accumulate = false, BCopy b_copy = BCopy::per_call);
// out = a @ b + bias (float32, 2-D, bias (N) added by the matmul kernel as it writes out); K
// must be > 0. Follows the precision setting like bmm. 16-bit a and b as in bmm, with a bias and
// out of their dtype or float32.
void gemm_bias(const Operand& a, const Operand& b, const Tensor& bias, const Tensor& out,
               BCopy b_copy = BCopy::per_call);
// bmm for 2-D a (M, K), b (K, N), out (M, N), with the shapes checked.
void gemm(const Operand& a, const Operand& b, const Tensor& out, bool accumulate = false,
          BCopy b_copy = BCopy::per_call);
// Frees the derived copies of weights that died or changed since (replace_weight bumps a kept
// weight's version): a keep frees them at once instead of at the next miss.
void drop_stale_derived_copies();
// A copy derived from weight t's span (converted to bf16, reordered to a matmul's layout), made
// by `make` once per version of t's storage; `tag` tells the kinds of copies of one span apart.
// A copy is kept until its source changes or dies and some later call misses. Thread-safe.
std::shared_ptr<Storage> derived_copy(const Tensor& t, uint64_t tag,
                                      const std::function<std::shared_ptr<Storage>()>& make);

// Whether contiguous float32 p[0, n) holds a NaN, or with `pos_inf` also a +inf. oneDNN 2.6's exp
// (its eltwise and inside its softmax) clamps its input with min/max instructions that drop
// NaN, so the ops that run it take their reference loops for an input holding one (PyTorch's
// rule, docs/ops.md#non-finite-values). One vectorised read of the input.
bool has_nan(const float* p, int64_t n, bool pos_inf = false);

// Refuses a float32 weight that its kept low-precision copy cannot hold: a NaN or inf, or with
// `bf16` a finite value beyond bf16's range (it would round to inf). Such a copy would turn the
// bad value into NaN or finite outputs far from the weight (an int8 row's scale), so the error
// names `what` (the op and the copy) and the first bad element instead.
// @throws graft::Error "<what>: weight f32 (4, 3) holds inf at (1, 2); ..." otherwise.
void check_weight_finite(const Tensor& w, const std::string& what, bool bf16);

// aliasing(t): a 2-D operand of >= 256 rows whose rows lie a multiple of 1 KiB apart; a gemm
// reducing over those rows (dW = dy^T x) runs far below peak (see kernels.cpp).
// unaliased(t): t, or a copy with rows 16 elements further apart when aliasing(t).
bool aliasing(const Tensor& t);
Tensor unaliased(const Tensor& t);

// e^x for x <= 0 (a little above 0 is fine too) by kern::exp's polynomial (custom.h), x
// clamped at -87 (e^x <= 1.6e-38, so -inf gives 1.6e-38, not NaN) on the bit patterns: read as
// int32, the floats from -87 down to -inf are exactly [int(0xC2AE0000), int(0xFF800000)]; a NaN
// with the sign bit set (x86's default NaN, as inf - inf gives) lies above that range and is
// kept, so NaN gives NaN whatever its sign (an unsigned min(bits, -87's) turned it into
// e^-87). A float compare there would stop GCC vectorising the loops that call it without
// `#pragma omp simd` (it will not if-convert them under -ftrapping-math); the two int32
// compares run as fast as the unsigned min did (1.3 ms per 4M elements of a softmax-like loop,
// one Zen 4 core; an unsigned compare took 3.4).
inline float exp_nonpos(float x) {
  constexpr int32_t kMinus87 = std::bit_cast<int32_t>(0xC2AE0000u),
                    kMinusInf = std::bit_cast<int32_t>(0xFF800000u);
  const int32_t i = std::bit_cast<int32_t>(x);
  return exp_in_range(std::bit_cast<float>(i >= kMinus87 && i <= kMinusInf ? kMinus87 : i));
}
inline float exp_nonpos(float x, float) { return exp_nonpos(x); }
inline double exp_nonpos(double x, double) { return std::exp(x); }  // the float64 reference

// ---- dropout masks ----

// A dropout mask that is never stored: element i is kept iff the uniform draw u_i >= p, where
// u_i is exactly what the i-th gen.uniform() would return. splitmix64 is a counter stream (the
// state advances by a constant per draw), so keep(i) is computed directly from the starting
// state, in parallel, identically for any thread count and in backward (one splitmix64, about
// the cost of reading a stored mask). Must match Generator::next_u64 (autograd/tensor.cpp;
// tests/test_loss_dropout.cpp checks the mask against sequential draws).
struct DropoutMask {
  static constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  uint64_t state0 = 0, threshold = 0;
  double keep_value = 1;  // 1 / (1 - p), 0 for p = 1
  // The mask of n elements starting at gen's state; gen advances as if n uniforms were drawn.
  static DropoutMask draw(Generator& gen, double p, int64_t n) {
    DropoutMask m;
    m.state0 = gen.state();
    gen.set_state(m.state0 + (uint64_t)n * kGolden);
    // u = (z >> 11) * 2^-53 >= p  <=>  (z >> 11) >= ceil(p * 2^53), exact in integers.
    m.threshold = (uint64_t)std::ceil(std::ldexp(p, 53));
    m.keep_value = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    return m;
  }
  bool keep(int64_t i) const {
    return (mix64(state0 + ((uint64_t)i + 1) * kGolden) >> 11) >= threshold;
  }
};

// The element offset (from the tensor's first element) of the `run`-th last-dim run over dims
// [first, rank - 1) of a tensor of `shape` and `strides`, runs in row-major order.
inline int64_t run_offset(const Shape& shape, const Shape& strides, int64_t run, int64_t first) {
  int64_t off = 0;
  for (int64_t d = (int64_t)shape.size() - 2; d >= first; --d) {
    off += (run % shape[d]) * strides[d];
    run /= shape[d];
  }
  return off;
}

}  // namespace graft::kern
