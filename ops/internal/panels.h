// Float32 weights in panels of 16 outputs, graft's own form for float32 inference where oneDNN
// 2.6 has no blocked kernel of its own (AVX2 builds without AVX-512): a weight w (OUT, IN) is laid
// out as ceil(OUT / 16) panels, panel p holding w[16 p + j][i] at p * IN * 16 + i * 16 + j (the
// last panel's missing outputs zero). keep_weight_fp32 keeps that form (ops/matmul.cpp); a step
// of several rows reads it with linear_panels below, one row with matmul.cpp's loop over blocks
// of outputs (the same family of layouts), a lookup with gather_kept_rows (ops/internal/kept.h).
#pragma once

#include <dnnl.hpp>

#include <cstddef>
#include <cstdint>

namespace graft::kern {

// The outputs one panel holds.
constexpr int64_t kPanelOutputs = 16;

// Whether keep_weight_fp32 keeps weights as panels in this build (AVX2 and FMA without
// AVX-512); else it keeps the layout oneDNN's inner product picks.
bool panels_built();

// The panel layout of a weight (OUT, IN) as a oneDNN descriptor (dims OUT x IN, outputs blocked
// by 16 outermost, padded to whole panels), so that matmul.cpp's layout code reads it as it reads
// oneDNN's own blocked layouts.
dnnl::memory::desc panel_layout(int64_t OUT, int64_t IN);

// The bytes of a weight (OUT, IN) in panels (the last one padded): panel_layout's size.
size_t panels_bytes(int64_t OUT, int64_t IN);

// Whether d is panel_layout's layout (any OUT, IN).
bool is_panel_layout(const dnnl::memory::desc& d);

// Writes w (OUT, IN, plain rows) as panels at `out` (panels_bytes(OUT, IN)), the last panel's
// padding zero. `consume`: w's values are not read again (keep_weight_fp32 frees them next), so
// its whole pages go back to the system (madvise MADV_DONTNEED) as each chunk of about 4 MiB is
// packed: keeping a model's weights peaks at their bytes plus a chunk rather than plus the
// largest weight (TinyLlama's 262 MB tables).
void pack_panels(const float* w, int64_t OUT, int64_t IN, float* out, bool consume);

// y (M, OUT; rows OUT apart) = x (M, IN; rows IN apart) w^T + b (b may be null) for w in panels at
// `w` (a weight of IN inputs, or its rows from a panel's first on: OUT of them). Each output is one
// chain of fused multiply-adds over the inputs in order, the bias added last: the same bits on
// any thread count and for any M. Panels split over the threads, each read once per call
// (a step of 32 rows re-reads a 32 KiB panel from the L1/L2 cache for every 6 rows).
void linear_panels(const float* x, int64_t M, const float* w, const float* b, float* y, int64_t IN,
                   int64_t OUT);

// How many linear_panels calls ran, on any thread: the tests check the path runs.
uint64_t linear_panels_calls();

}  // namespace graft::kern
