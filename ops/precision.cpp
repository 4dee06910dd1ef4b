#include "graft/ops/precision.h"

#include <cstdio>
#include <mutex>
#include <optional>
#include <string_view>

#include "ops/internal/bf16.h"
#include "ops/internal/dnnl_utils.h"
#include "ops/internal/int8.h"
#include "ops/internal/kept.h"

namespace graft {

namespace {

thread_local Precision current_precision = Precision::fp32;
thread_local Bf16Path current_path = Bf16Path::automatic;

// impl_info_str of an n^3 matmul with operands of type dt and a float32 output (int8: u8 x s8
// with an int32 output), or "" when oneDNN has no implementation.
std::string probe_matmul(dnnl::memory::data_type dt, int64_t n) {
  using dnnl::memory;
  const bool int8 = dt == memory::data_type::s8;
  try {
    const memory::desc a({n, n}, int8 ? memory::data_type::u8 : dt, memory::format_tag::ab),
        b({n, n}, dt, int8 ? memory::format_tag::any : memory::format_tag::ab),
        c({n, n}, int8 ? memory::data_type::s32 : memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), onednn::engine());
    return pd.impl_info_str();
  } catch (const dnnl::error&) {
    return "";
  }
}

const std::string& bf16_probe() {
  static const std::string name = probe_matmul(dnnl::memory::data_type::bf16, 64);
  return name;
}

// Whether the ISA oneDNN dispatches for (its effective ISA, after DNNL_MAX_CPU_ISA) includes
// `want`. The ISA masks are x86's: elsewhere there is no answer (nullopt).
std::optional<bool> effective_isa_has(dnnl::cpu_isa want) {
#if defined(__x86_64__) || defined(_M_X64)
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa()),
             w = static_cast<unsigned>(want);
  return (isa & w) == w;
#else
  (void)want;
  return std::nullopt;
#endif
}

// Whether that CPU multiplies bf16 natively: AVX512_BF16 (the AMX mask includes it). On AVX-512
// without it oneDNN 2.6 still offers bf16 matmuls (gemm:jit, widening to float32 on the fly), 2.4x
// slower than its float32 ones on a small training step (AMD EPYC Zen 5 with the ISA capped at
// AVX512_CORE). Off x86 the probe decides alone.
bool native_bf16_isa() { return effective_isa_has(dnnl::cpu_isa::avx512_core_bf16).value_or(true); }

const std::string& int8_probe() {
  static const std::string name = probe_matmul(dnnl::memory::data_type::s8, 64);
  return name;
}

// Whether that CPU has VNNI (vpdpbusd: u8 x s8 products summed in 32 bits), as AVX512_VNNI or
// AVX-VNNI; AMX-INT8 CPUs have AVX512_VNNI. Off x86: no.
bool vnni_isa() {
  return effective_isa_has(dnnl::cpu_isa::avx512_core_vnni).value_or(false) ||
         effective_isa_has(dnnl::cpu_isa::avx2_vnni).value_or(false);
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace

Precision parse_precision(const std::string& s, const std::string& what) {
  if (s == "fp32") return Precision::fp32;
  if (s == "bf16") return Precision::bf16;
  if (s == "int8") return Precision::int8;
  fail(what + ": unknown precision '" + s + "' (one of: fp32, bf16, int8)");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::bf16:
      return "bf16";
    case Precision::int8:
      return "int8";
    default:
      return "fp32";
  }
}

const char* bf16_path_name(Bf16Path p) {
  switch (p) {
    case Bf16Path::onednn:
      return "onednn";
    case Bf16Path::reference:
      return "reference";
    default:
      return "automatic";
  }
}

PrecisionGuard::PrecisionGuard(Precision p, Bf16Path path)
    : prev_precision_(current_precision), prev_path_(current_path) {
  if (p == Precision::bf16 && path == Bf16Path::onednn && !bf16_kernel_available())
    fail(bf16_unavailable_reason("PrecisionGuard(bf16, onednn):"));
  current_precision = p;
  current_path = path;
}

PrecisionGuard::~PrecisionGuard() {
  current_precision = prev_precision_;
  current_path = prev_path_;
}

Precision matmul_precision() { return current_precision; }

PrecisionState precision_state() { return {current_precision, current_path}; }

Bf16Path bf16_path() {
  if (current_path != Bf16Path::automatic) return current_path;
  if (bf16_kernel_available()) return Bf16Path::onednn;
  static std::once_flag said;
  std::call_once(said, [] { std::fprintf(stderr, "graft: %s\n", bf16_description().c_str()); });
  return Bf16Path::reference;
}

bool bf16_kernel_available() {
  static const bool ok = [] {
    const std::string& name = bf16_probe();
    return native_bf16_isa() && !name.empty() && std::string_view(name).substr(0, 3) != "ref";
  }();
  return ok;
}

std::string matmul_kernel_name(Precision p) {
  using dt = dnnl::memory::data_type;
  const std::string name = probe_matmul(p == Precision::bf16   ? dt::bf16
                                        : p == Precision::int8 ? dt::s8
                                                               : dt::f32,
                                        1024);
  return name.empty() ? "none (oneDNN has no implementation)" : name;
}

namespace {

// What oneDNN lacks for a reduced precision on this CPU, said once for bf16 and int8.
struct MissingKernel {
  const char* precision;  // "bf16", "int8"
  const char* kernel;     // "native bf16 matmul kernel"
  const char* needs;      // "AVX512_BF16 or AMX"
};

constexpr MissingKernel kBf16{"bf16", "native bf16 matmul kernel", "AVX512_BF16 or AMX"};
constexpr MissingKernel kInt8{"int8", "int8 matmul kernel with VNNI",
                              "AVX512_VNNI, AVX-VNNI or AMX"};

// "<what>: oneDNN <kernel name>" when the kernel runs, else what runs instead and why.
std::string kernel_description(bool available, Precision p, const std::string& what,
                               const std::string& fallback, const MissingKernel& m,
                               const std::string& probe, const char* probed) {
  if (available) return what + ": oneDNN " + matmul_kernel_name(p);
  return what + ": " + fallback + ": oneDNN " + onednn_version() + " has no " + m.kernel +
         " for this CPU (it needs " + m.needs + ", and no DNNL_MAX_CPU_ISA cap below them; its " +
         probed + " here: " + (probe.empty() ? std::string("none") : probe) + ")";
}

// "" when the kernel runs, else why `what` refuses the precision.
std::string unavailable_reason(bool available, const std::string& what, const MissingKernel& m,
                               const std::string& why) {
  if (available) return "";
  return what + " " + m.precision + ": oneDNN has no " + m.kernel + " for this CPU (it needs " +
         m.needs + why + "; use fp32";
}

}  // namespace

std::string bf16_description() {
  return kernel_description(bf16_kernel_available(), Precision::bf16, "bf16 matmuls",
                            "reference path (operands rounded to bf16, float32 products)", kBf16,
                            bf16_probe(), "bf16 matmul");
}

std::string bf16_unavailable_reason(const std::string& what) {
  return unavailable_reason(bf16_kernel_available(), what, kBf16,
                            "), so bf16 would only be slower than fp32");
}

bool int8_kernel_available() {
  static const bool ok = [] {
    const std::string& name = int8_probe();
    return vnni_isa() && !name.empty() && std::string_view(name).substr(0, 3) != "ref";
  }();
  return ok;
}

std::string int8_description() {
  return kernel_description(int8_kernel_available(), Precision::int8, "int8 linears",
                            "graft's integer loop (the same exact int32 sums)", kInt8, int8_probe(),
                            "u8 x s8 matmul");
}

namespace {
// oneDNN 2.6 builds f16 matmuls only for AVX512_FP16 (Sapphire Rapids); elsewhere its answer is
// none or the reference loop, and f16 tensors multiply in float32.
const std::string& f16_probe() {
  static const std::string name = probe_matmul(dnnl::memory::data_type::f16, 64);
  return name;
}
bool f16_kernel_available() {
  static const bool ok =
      !f16_probe().empty() && std::string_view(f16_probe()).substr(0, 3) != "ref";
  return ok;
}
}  // namespace

bool half_kernel_available(DType dt) {
  if (dt == DType::bf16) return bf16_kernel_available();
  if (dt == DType::f16) return f16_kernel_available();
  return false;
}

std::string half_matmul_description(DType dt) {
  const bool bf16 = dt == DType::bf16;
  const std::string what = std::string(dtype_short_name(dt)) + " tensor matmuls";
  if (!is_half(dt)) return what + ": not a 16-bit dtype";
  if (half_kernel_available(dt))
    return what + ": oneDNN " + (bf16 ? matmul_kernel_name(Precision::bf16) : f16_probe());
  const std::string& probe = bf16 ? bf16_probe() : f16_probe();
  return what + ": float32 kernel on operands converted per call (" +
         matmul_kernel_name(Precision::fp32) + "): oneDNN " + onednn_version() + " has no native " +
         dtype_short_name(dt) + " matmul kernel for this CPU (it needs " +
         (bf16 ? "AVX512_BF16 or AMX" : "AVX512_FP16") +
         ", and no DNNL_MAX_CPU_ISA cap below it; its probe here: " +
         (probe.empty() ? std::string("none") : probe) + ")";
}

uint64_t int8_weight_copies_made() { return kern::int8_weight_copies(); }

namespace {
// Refuses what a kept linear weight cannot be: undefined, not a contiguous float32 (OUT, IN).
void check_linear_weight(const Tensor& w, const std::string& who, const std::string& name,
                         DType dtype = DType::f32) {
  if (!w.defined()) fail(who + ": " + name + " is an undefined tensor");
  if (w.dtype() != dtype || w.dim() != 2 || !w.is_contiguous())
    fail(who + ": " + name + " " + describe(w) + " must be a contiguous " +
         (dtype == DType::f32 ? "float32" : "bf16") + " (OUT, IN) weight");
}
}  // namespace

size_t quantize_weight_int8(const Tensor& w, const std::string& name) {
  check_linear_weight(w, "quantize_weight_int8", name);
  return kern::quantize_for_inference(w, name, !int8_kernel_available());
}

Int8Weight int8_weight_parts(const Tensor& w, const std::string& name) {
  check_linear_weight(w, "int8_weight_parts", name);
  try {
    auto [values, scales] = kern::int8_parts(w);
    return {values, scales};
  } catch (const Error& e) {
    fail("int8_weight_parts: " + name + ": " + e.what());
  }
}

size_t set_weight_int8(const Tensor& w, const Tensor& values, const Tensor& scales,
                       const std::string& name, const std::string& scale_name) {
  check_linear_weight(w, "set_weight_int8", name);
  check_defined(values, "set_weight_int8", "values");
  check_defined(scales, "set_weight_int8", "scales");
  return kern::set_int8_parts(w, values, scales, name, scale_name, !int8_kernel_available());
}

size_t quantize_weight_int8_from(const Tensor& w, const Tensor& from, const std::string& name) {
  check_linear_weight(w, "quantize_weight_int8_from", name);
  check_defined(from, "quantize_weight_int8_from", "from");
  if (from.dtype() != DType::f32 || from.shape() != w.shape() || !from.is_contiguous())
    fail("quantize_weight_int8_from: " + name + ": the values are " + describe(from) +
         ", they must be float32 " + shape_str(w.shape()) + " (the weight's shape), contiguous");
  return kern::quantize_into(w, from, name, !int8_kernel_available());
}

size_t keep_weight_fp32(const Tensor& w, const std::string& name) {
  return keep_weights_fp32({{name, w}});
}

size_t keep_weights_fp32(const std::vector<std::pair<std::string, Tensor>>& weights) {
  for (const auto& [name, w] : weights) check_linear_weight(w, "keep_weight_fp32", name);
  return kern::keep_blocked_f32(weights);
}

size_t keep_weight_bf16(const Tensor& w, const std::string& name) {
  check_linear_weight(w, "keep_weight_bf16", name, DType::bf16);
  return kern::keep_blocked_bf16(w, name);
}

size_t keep_weights_together(const std::vector<std::pair<std::string, Tensor>>& weights) {
  for (const auto& [name, w] : weights)
    if (!w.defined()) fail("keep_weights_together: " + name + " is undefined");
  return kern::keep_together(weights);
}

uint64_t bf16_weight_copies_made() { return kern::bf16_weight_copies(); }

float round_to_bf16(float x) { return kern::bf16_to_float(kern::bf16_bits(x)); }

}  // namespace graft
