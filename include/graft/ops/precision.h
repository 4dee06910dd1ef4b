/// @file
/// Mixed precision: the switch that makes float32 matmuls run with bfloat16 operands, and int8
/// inference for linear layers.
///
/// Under PrecisionGuard(Precision::bf16), every float32 matmul of the ops (matmul, linear, the four
/// batched matmuls of scaled_dot_product_attention, the output projection of
/// linear_cross_entropy) rounds its two operands to bfloat16 and multiplies them with float32
/// accumulation into a float32 output; attention without a tape over at most 4 query rows per
/// head (cached decoding) runs its float32 row loop instead (it was faster). Everything else
/// (layer norm, softmax, the loss, the optimizers, every gradient that reaches a parameter) stays
/// float32, and float64 is never touched (it is the reference). Without a tape (inference) the
/// bf16 copy of a matmul weight is kept until its storage's version changes, so decoding converts
/// each weight once; in training linear converts its weight at each use (forward, backward), so
/// no copy is alive at the start of backward, the step's memory peak. An op's backward runs in
/// the precision its forward ran in.
///
/// Two paths compute a bf16 matmul:
/// - onednn: oneDNN's bf16 kernel (AMX or AVX512_BF16; oneDNN 2.6 has none for AVX2-only CPUs,
///   and only a float32-widening one, slower than float32, for AVX-512 without AVX512_BF16)
/// - reference: the operands rounded to bf16 (round to nearest even) but kept as float32, then
///   the float32 matmul: the same numbers as bf16 products summed in float32, at
///   float32 speed. Where oneDNN has no native bf16 kernel, Bf16Path::automatic takes it and
///   says so once on stderr; the examples' --precision bf16 refuses instead (nothing
///   to gain there).
///
/// Under PrecisionGuard(Precision::int8), linear without a tape (inference) runs on int8: its
/// weight quantized symmetrically per output channel to s8 (once per version of the weight, kept
/// like the bf16 copies), its input per row, dynamically at each call, the products summed in
/// int32 by oneDNN's int8 kernel (VNNI on AVX512_VNNI and AVX-VNNI CPUs, AMX-INT8 where present)
/// and dequantized to float32 with the bias added (docs/mixed-precision.md has the formula and
/// the error bound). Every other op (matmul, the attention products, embeddings, layer norm,
/// softmax, the loss and linear_cross_entropy) stays float32. Where oneDNN has no int8 kernel
/// with VNNI (AVX2 without AVX-VNNI) the same integer sums run in a plain loop (said once on
/// stderr; the examples' --precision int8 refuses instead). int8 is for inference: linear
/// recording a tape under it is an error.
///
/// The switch is per thread (like torch.autocast) and nests. It is about float32 tensors: tensors
/// that are bf16 or f16 (DType::bf16, DType::f16) multiply in their own dtype whatever the
/// setting, on oneDNN's 16-bit kernel with float32 sums where the CPU has one, else in float32 on
/// operands widened for the call (half_kernel_available(), half_matmul_description()).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft {

/// The precision of float32 matmuls: fp32 (plain float32), bf16 (bfloat16 operands, float32
/// accumulation and output) or int8 (linear layers quantized to int8 in inference).
enum class Precision { fp32, bf16, int8 };
/// How a bf16 matmul is computed: automatic (oneDNN's kernel when this CPU has one, else the
/// reference path), onednn (the kernel; an error where there is none) or reference (operands
/// rounded to bf16, multiplied in float32).
enum class Bf16Path { automatic, onednn, reference };

/// Parses a precision name, such as a command-line value.
/// @throws graft::Error "<what>: unknown precision '<s>' (one of: fp32, bf16, int8)" for anything
///         but "fp32", "bf16" or "int8".
Precision parse_precision(const std::string& s, const std::string& what);
/// "fp32", "bf16" or "int8".
const char* precision_name(Precision p);

/// The setting in force on this thread, to enter again later: an op's backward runs under the
/// setting its forward ran under.
struct PrecisionState {
  Precision precision = Precision::fp32;  ///< the matmul precision
  Bf16Path path = Bf16Path::automatic;    ///< the bf16 path (as set, not resolved)
};
/// The setting in force on this thread (PrecisionGuard(state) enters it again).
PrecisionState precision_state();

/// Sets the matmul precision of this thread for a scope and restores the previous setting when
/// the scope ends; nests.
class PrecisionGuard {
 public:
  /// Enters precision `p` with bf16 path `path`.
  /// @throws graft::Error when `p` is bf16 and `path` is onednn on a CPU without a oneDNN bf16
  ///         kernel (see bf16_unavailable_reason()).
  explicit PrecisionGuard(Precision p, Bf16Path path = Bf16Path::automatic);
  /// Enters a setting saved by precision_state().
  /// @throws graft::Error as the other constructor.
  explicit PrecisionGuard(const PrecisionState& s) : PrecisionGuard(s.precision, s.path) {}
  /// Restores the setting in force before.
  ~PrecisionGuard();
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  Precision prev_precision_;
  Bf16Path prev_path_;
};

/// The matmul precision in force on this thread.
Precision matmul_precision();
/// The path a bf16 matmul takes on this thread now: onednn or reference (automatic resolved;
/// the first time automatic resolves to reference it says so on stderr).
Bf16Path bf16_path();
/// "automatic", "onednn" or "reference".
const char* bf16_path_name(Bf16Path p);

/// Whether oneDNN has a native bf16 matmul kernel for this CPU (probed once): oneDNN's effective
/// ISA has AVX512_BF16 (or AMX), and a small bf16 matmul's implementation is not its reference
/// loop. On AVX-512 without AVX512_BF16 oneDNN's bf16 gemm widens to float32 and runs slower than
/// float32: no kernel. `DNNL_MAX_CPU_ISA` (oneDNN's cap on the ISA it dispatches for) counts.
/// The ISA test is for x86-64; elsewhere the probe alone decides.
bool bf16_kernel_available();
/// The oneDNN implementations a 1024^3 matmul gets here (impl_info_str, such as
/// "brg:avx512_core_amx_bf16"), or why there is none: for bench headers and test logs.
std::string matmul_kernel_name(Precision p);
/// One line for logs: "bf16 matmuls: oneDNN brg:avx512_core_amx_bf16" or
/// "bf16 matmuls: reference path (operands rounded to bf16, float32 products): ...".
std::string bf16_description();
/// The error to give when bf16 was asked for on a machine without a kernel (empty when there is
/// one): "<what> bf16: oneDNN has no native bf16 matmul kernel for this CPU ...".
std::string bf16_unavailable_reason(const std::string& what);

/// How many kept bf16 copies of weights have been made in this process: a training step adds
/// one for the output projection's weight, an inference run one per weight, once (for tests).
uint64_t bf16_weight_copies_made();

/// Whether oneDNN has an int8 matmul kernel with VNNI for this CPU (probed once): its effective ISA
/// (after DNNL_MAX_CPU_ISA) has AVX512_VNNI or AVX-VNNI (AMX-INT8 CPUs have both), and a small
/// u8 x s8 matmul's implementation is not its reference loop. Without VNNI oneDNN's int8 kernels
/// sum pairs of products in 16 bits, which can saturate: graft does not use them.
bool int8_kernel_available();
/// One line for logs: "int8 linears: oneDNN brg:avx512_core_vnni", or "int8 linears: graft's
/// integer loop (...)" with the reason oneDNN's kernel does not run. Every CPU runs int8: where
/// oneDNN has no VNNI kernel, graft's own loop computes the same exact int32 sums (with AVX2's
/// vpmaddwd on int16-widened operands, which cannot saturate), bit for bit the same outputs.
std::string int8_description();
/// How many int8 copies of weights have been made in this process: an inference run makes one per
/// linear weight, once (for tests).
uint64_t int8_weight_copies_made();

/// Whether matmuls of 16-bit tensors of dtype `dt` (DType::bf16 or DType::f16) run on a native
/// oneDNN kernel here (probed once; DNNL_MAX_CPU_ISA counts): bf16 where bf16_kernel_available(),
/// f16 where oneDNN 2.6 builds a non-reference f16 matmul (AVX512_FP16 CPUs). Elsewhere such a
/// matmul converts its operands to float32 for the call (a per-thread buffer, nothing kept), runs
/// the float32 kernel and rounds the result once into the output's dtype. False for other dtypes.
bool half_kernel_available(DType dt);
/// One line for logs naming the path matmuls of `dt` tensors take here: "bf16 tensor matmuls:
/// oneDNN brg:avx512_core_bf16" or "f16 tensor matmuls: float32 kernel on converted operands
/// (...why...)".
std::string half_matmul_description(DType dt);
/// Makes the float32 weight `w` (OUT, IN) of a linear layer int8 for good, for inference: quantized
/// once as under PrecisionGuard(int8) (per output channel, in the layout oneDNN's int8 kernel
/// reads, or plain rows where the reference loop runs), that form kept as w's replacement, and
/// w's float32 values freed (Storage::release). linear(x, w, b) (or a slice of w's rows) under
/// PrecisionGuard(int8) without a tape then reads the int8 form; every other read of w's values
/// (training, saving, a float32 linear, printing) fails with "<name> f32 (OUT, IN): its float32
/// values were freed when it was quantized to int8 for inference ...". The model keeps 1 byte a
/// weight instead of 4 + 1. Call it before inference starts, not while another thread reads w.
/// @return the bytes freed; 0 when w was made int8 already.
/// @throws graft::Error naming `name` when w is undefined, not float32, not 2-D, not contiguous,
///         a view of a larger storage (freeing it would free the rest), or holds a NaN or inf.
size_t quantize_weight_int8(const Tensor& w, const std::string& name);
/// quantize_weight_int8() of the float32 values `from` (w's shape, contiguous) in place of w's
/// own: w becomes exactly what quantize_weight_int8 makes of a w holding them, and its own
/// float32 values, if it has any, are released. A w built without memory
/// (nn::SkipInit(nn::SkipInit::Memory::none)) never allocates them: a loader reading a float32
/// file tensor by tensor quantizes each one as it comes (models::load_hf_causal_lm at int8).
/// @return the bytes of float32 values freed (0 for a w built without memory).
/// @throws graft::Error naming `name` as quantize_weight_int8, or when `from` is not float32 of
///         w's shape and contiguous.
size_t quantize_weight_int8_from(const Tensor& w, const Tensor& from, const std::string& name);
/// Keeps the float32 weight `w` (OUT, IN) of a linear layer for float32 inference only: w is
/// reordered once into the blocked layout float32 inference reads (an AVX-512 build: the one
/// oneDNN's inference inner product picks, on such a CPU blocks of 16 inputs x 64 outputs; an
/// AVX2 build: graft's panels of 16 outputs, read by graft's own kernel at every row count (a
/// slice of rows that starts inside a panel by the inner product on a copy), see
/// docs/mixed-precision.md), that form kept as w's replacement, and w's float32 values freed
/// (Storage::release), so the process holds each weight once. linear(x, w, b) (or a slice of
/// w's rows) at fp32 precision without a tape then reads the kept form at any row count (one row
/// through graft's own loop over the blocks), and so does embedding(w, ids) without a tape (a
/// tied table); every other read of w's values (training, saving, another precision, printing)
/// fails with "<name> f32 (OUT, IN): its float32 values were freed when it was kept in the
/// blocked layout of float32 inference ...". Call it before inference starts, not while another
/// thread reads w.
/// @return the bytes freed (a kept form holds as many, padded to its blocks); 0 when w was kept
///         already, or where oneDNN's kernel reads plain rows (an AVX-512 build run under
///         DNNL_MAX_CPU_ISA=AVX2: nothing is kept there).
/// @throws graft::Error naming `name` when w is undefined, not float32, not 2-D, not contiguous
///         or a view of a larger storage (freeing it would free the rest).
size_t keep_weight_fp32(const Tensor& w, const std::string& name);
/// keep_weight_fp32() for each weight of `weights` (name, weight), their kept forms packed into
/// one block of memory, which asks the system for 2 MiB pages: one row of decoding streams every
/// weight, and a base decoder's steps ran 7-9% faster from huge pages (AMD EPYC Zen 4,
/// docs/performance.md). A storage named twice is kept once. models::keep_for_inference(fp32)
/// calls it with every linear weight and embedding table of the model. The block lives while any of
/// its weights does (a dead model's block is given back at the next keep at the latest).
/// @return the bytes freed.
/// @throws graft::Error naming the weight, as keep_weight_fp32(), before anything is kept.
size_t keep_weights_fp32(const std::vector<std::pair<std::string, Tensor>>& weights);
/// Keeps the bf16 weight `w` (OUT, IN) of a linear layer of a bf16 model for bf16 inference
/// only: w is reordered once into the layout oneDNN's bf16 inference inner product reads (on an
/// AVX512_BF16 CPU blocks of 16 inputs x 64 outputs), that form kept as w's replacement, and w's
/// plain bf16 values freed (Storage::release): the process still holds 2 bytes a weight, and no
/// matmul repacks w per call. linear(x, w, b) on bf16 tensors (or a slice of w's rows) without a
/// tape then reads the kept form at any row count (up to 4 rows through graft's own loop over the
/// blocks); every other read of w's values fails with "<name> bf16 (OUT, IN): its bf16 values
/// were freed when it was kept in the inner product's blocked layout for bf16 inference ...".
/// Where no bf16 kernel runs (bf16_kernel_available() false, as under DNNL_MAX_CPU_ISA=AVX2) w
/// stays as it is. Call it before inference starts, not while another thread reads w.
/// @return the bytes freed (the kept form holds as many, padded to its blocks); 0 when w was
///         kept already or stays plain.
/// @throws graft::Error naming `name` when w is undefined, not bf16, not 2-D, not contiguous or
///         a view of a larger storage (freeing it would free the rest).
size_t keep_weight_bf16(const Tensor& w, const std::string& name);
/// Gathers what inference reads of each weight of `weights` (name, weight) into one block of
/// memory that asks the system for 2 MiB pages: a weight's own values (plain float32 rows where
/// nothing was kept, plain bf16 rows without a bf16 kernel) or the form kept for it (int8, a bf16
/// blocked form), each storage once; forms packed together already (keep_weights_fp32) stay. Every
/// view stays valid (Storage::move_into) and the values are unchanged. One row of decoding streams
/// every weight: SmolLM-135M's bf16 weights (matrices under 2 MiB each, so on 4 KiB pages one by
/// one) generated 1.08x to 1.20x as fast from one block (AMD EPYC Zen 3, docs/hub-models.md).
/// models::keep_for_inference calls it at every precision. Call it before inference starts, not
/// while another thread reads the weights.
/// @return the bytes moved; 0 under 2 MiB (nothing is gained there).
/// @throws graft::Error naming the weight when it is undefined.
size_t keep_weights_together(const std::vector<std::pair<std::string, Tensor>>& weights);

/// A linear weight's int8 form as the two tensors a file holds (docs/mixed-precision.md, "int8
/// and bf16 exports"): w ≈ scales[o] * values[o][k].
struct Int8Weight {
  Tensor values;  ///< int8 (OUT, IN), in [-127, 127]
  Tensor scales;  ///< float32 (OUT), one per output row, max_k |w[o][k]| / 127
};
/// The int8 form quantize_weight_int8 gives the float32 weight `w` (OUT, IN), the same bytes, as
/// values and scales (for a file); w is left as it is. Works on a weight made int8 already too
/// (its kept form is read back).
/// @throws graft::Error naming `name` as quantize_weight_int8 (not float32 (OUT, IN) and
///         contiguous, a NaN or inf), or when its float32 values were freed by anything else.
Int8Weight int8_weight_parts(const Tensor& w, const std::string& name);
/// Makes the float32 weight `w` (OUT, IN) int8 for good from a stored int8 form (values, scales,
/// as int8_weight_parts() gives them): afterwards w is exactly what quantize_weight_int8 would
/// have made of the weight the form was taken from (linear under PrecisionGuard(int8) gives the
/// same bits), and w's float32 values are released. A w built without memory
/// (nn::SkipInit(nn::SkipInit::Memory::none)) never holds float32 values at all: loading an
/// int8 file that way allocates no float32 copy of the weight. Call it before inference starts.
/// @return the bytes of float32 values freed (0 for a w built without memory).
/// @throws graft::Error naming `name` or `scale_name` when w is not float32 (OUT, IN), contiguous
///         and the whole of its storage, `values` not int8 of w's shape or holding -128,
///         `scales` not float32 (OUT) or holding a negative, NaN or infinite scale.
size_t set_weight_int8(const Tensor& w, const Tensor& values, const Tensor& scales,
                       const std::string& name, const std::string& scale_name);

/// x rounded to the nearest bfloat16 (ties to even), as a float; NaN stays NaN, overflow gives inf.
float round_to_bf16(float x);

}  // namespace graft
