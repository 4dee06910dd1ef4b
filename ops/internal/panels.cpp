#include "ops/internal/panels.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define GRAFT_PANELS 1
#else
#define GRAFT_PANELS 0
#endif

namespace graft::kern {

namespace {

std::atomic<uint64_t> panels_calls{0};

#if GRAFT_PANELS
// Rows of x per tile: 6 rows x 16 outputs hold 12 of AVX2's 16 vector registers as sums, 2 the
// panel's 16 values at i, 1 the broadcast x value.
constexpr int64_t kTileRows = 6;

// y[r][0, 16) for R rows of x (IN apart) through one panel p: R x 2 vectors of sums, each one
// chain over i in order. `ahead`: the next panel's bytes, asked for (prefetch) while this one is
// read, as the first tile of a panel reads it from memory; null for the tiles after.
template <int R>
void panel_tile(const float* x, const float* p, int64_t IN, float (*y)[16], const float* ahead) {
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < IN; ++i) {
    if (ahead) _mm_prefetch(reinterpret_cast<const char*>(ahead + i * 16), _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(p + i * 16), w1 = _mm256_loadu_ps(p + i * 16 + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * IN + i);
      lo[r] = _mm256_fmadd_ps(xv, w0, lo[r]);
      hi[r] = _mm256_fmadd_ps(xv, w1, hi[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(y[r], lo[r]);
    _mm256_storeu_ps(y[r] + 8, hi[r]);
  }
}

// R rows (1..6) of x through panel p into `tile`.
void panel_rows(int64_t R, const float* x, const float* p, int64_t IN, float (*tile)[16],
                const float* ahead) {
  switch (R) {
    case 6:
      return panel_tile<6>(x, p, IN, tile, ahead);
    case 5:
      return panel_tile<5>(x, p, IN, tile, ahead);
    case 4:
      return panel_tile<4>(x, p, IN, tile, ahead);
    case 3:
      return panel_tile<3>(x, p, IN, tile, ahead);
    case 2:
      return panel_tile<2>(x, p, IN, tile, ahead);
    default:
      return panel_tile<1>(x, p, IN, tile, ahead);
  }
}
#else
// Without AVX2 (never kept there: panels_built() is false) the same chains, one at a time.
void panel_rows(int64_t R, const float* x, const float* p, int64_t IN, float (*tile)[16],
                const float*) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < kPanelOutputs; ++j) {
      float s = 0;
      for (int64_t i = 0; i < IN; ++i) s = std::fma(x[r * IN + i], p[i * 16 + j], s);
      tile[r][j] = s;
    }
}
constexpr int64_t kTileRows = 6;
#endif

// Panel q's m outputs (the last panel may hold fewer than 16) for every row of x.
void rows_through_panel(const float* x, int64_t M, const float* p, const float* ahead,
                        const float* b, float* y, int64_t IN, int64_t OUT, int64_t m) {
  float tile[kTileRows][16];
  for (int64_t r0 = 0; r0 < M; r0 += kTileRows) {
    const int64_t R = std::min(kTileRows, M - r0);
    panel_rows(R, x + r0 * IN, p, IN, tile, r0 == 0 ? ahead : nullptr);
    for (int64_t r = 0; r < R; ++r) {
      float* yr = y + (r0 + r) * OUT;
      for (int64_t j = 0; j < m; ++j) yr[j] = b ? tile[r][j] + b[j] : tile[r][j];
    }
  }
}

}  // namespace

bool panels_built() { return GRAFT_PANELS != 0; }

dnnl::memory::desc panel_layout(int64_t OUT, int64_t IN) {
  dnnl::memory::desc d({OUT, IN}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
  dnnl_memory_desc_t& m = d.data;
  auto& bl = m.format_desc.blocking;
  m.padded_dims[0] = (OUT + kPanelOutputs - 1) / kPanelOutputs * kPanelOutputs;
  bl.inner_nblks = 1;
  bl.inner_blks[0] = kPanelOutputs;
  bl.inner_idxs[0] = 0;
  bl.strides[0] = IN * kPanelOutputs;
  bl.strides[1] = kPanelOutputs;
  return d;
}

size_t panels_bytes(int64_t OUT, int64_t IN) {
  return (size_t)((OUT + kPanelOutputs - 1) / kPanelOutputs) * kPanelOutputs * IN * sizeof(float);
}

bool is_panel_layout(const dnnl::memory::desc& d) {
  const dnnl_memory_desc_t& m = d.data;
  if (m.ndims != 2 || m.format_kind != dnnl_blocked) return false;
  return d == panel_layout(m.dims[0], m.dims[1]);
}

namespace {

// Panels [q0, q1) of w (OUT, IN) at `out`, the last panel's padding zero.
void pack_panel_range(const float* w, int64_t OUT, int64_t IN, float* out, int64_t q0, int64_t q1) {
#pragma omp parallel for schedule(static)
  for (int64_t q = q0; q < q1; ++q) {
    float* p = out + q * IN * kPanelOutputs;
    for (int64_t j = 0; j < kPanelOutputs; ++j) {
      const int64_t o = q * kPanelOutputs + j;
      for (int64_t i = 0; i < IN; ++i) p[i * kPanelOutputs + j] = o < OUT ? w[o * IN + i] : 0.f;
    }
  }
}

// Gives the whole pages inside [from, to) back to the system (their contents are lost).
void drop_pages(const void* from, const void* to) {
#if defined(__linux__)
  static const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t a = (reinterpret_cast<uintptr_t>(from) + page - 1) / page * page,
                  b = reinterpret_cast<uintptr_t>(to) / page * page;
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
#else
  (void)from, (void)to;
#endif
}

}  // namespace

void pack_panels(const float* w, int64_t OUT, int64_t IN, float* out, bool consume) {
  const int64_t panels = (OUT + kPanelOutputs - 1) / kPanelOutputs;
  // Chunks of about 4 MiB of w: after each, the pages of w it read are given back.
  const int64_t chunk = consume ? std::max<int64_t>(1, (int64_t(4) << 20) / (IN * 64)) : panels;
  for (int64_t q0 = 0; q0 < panels; q0 += chunk) {
    const int64_t q1 = std::min(panels, q0 + chunk);
    pack_panel_range(w, OUT, IN, out, q0, q1);
    if (consume) drop_pages(w, w + std::min(OUT, q1 * kPanelOutputs) * IN);
  }
}

void linear_panels(const float* x, int64_t M, const float* w, const float* b, float* y, int64_t IN,
                   int64_t OUT) {
  panels_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t panels = (OUT + kPanelOutputs - 1) / kPanelOutputs, S0 = IN * kPanelOutputs;
#pragma omp parallel for schedule(static) if (M * OUT * IN >= 16384)
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t o0 = q * kPanelOutputs, m = std::min(kPanelOutputs, OUT - o0);
    const float* ahead = q + 1 < panels ? w + (q + 1) * S0 : nullptr;
    rows_through_panel(x, M, w + q * S0, ahead, b ? b + o0 : nullptr, y + o0, IN, OUT, m);
  }
}

uint64_t linear_panels_calls() { return panels_calls.load(std::memory_order_relaxed); }

}  // namespace graft::kern
