// Shared helpers for op implementations (internal to ops/): broadcasting, strided iteration
// with OpenMP, and small checks that produce the library's error messages.
#pragma once

#include <omp.h>

#include <string>

#include "autograd/tape.h"
#include "autograd/tensor.h"

namespace graft::kern {

// Result shape of broadcasting a against b (NumPy rules), or "<op>: shapes .. and .. cannot
// be broadcast".
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// Strides that read t as if it had shape `out` (0 along broadcast dimensions).
Shape broadcast_strides(const Tensor& t, const Shape& out);

// Contiguous version of t without recording (returns t itself when already contiguous).
inline Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous_copy(t); }

void check_float(const char* op, const Tensor& t);

// out (M, N) = a (M, K) @ b (K, N), or out += a @ b with accumulate; a and b any strides
// (transposes as views), out contiguous (a row range of a bigger tensor is fine). Records
// nothing: for ops that run matmuls inside their own forward or backward. oneDNN for float32.
void gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false);
// aliasing(t): a 2-D operand of >= 256 rows whose rows lie a multiple of 1 KiB apart; a gemm
// reducing over those rows (dW = dy^T x) runs far below peak (see ops/matmul.cpp).
// unaliased(t): t, or a copy with rows 16 elements further apart when aliasing(t).
bool aliasing(const Tensor& t);
Tensor unaliased(const Tensor& t);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);

// Splits n rows over OpenMP threads when the work is large enough to pay for the fork.
constexpr int64_t kParallelGrain = 1 << 15;

// Calls f(out_index, offset_in_a, offset_in_b) for every element of a contiguous output of
// shape `out`, reading a and b through (broadcast) strides sa and sb. Rows (the last dim) are
// split across threads; each element is written by exactly one thread.
template <class F>
void for_each_bcast2(const Shape& out, const Shape& sa, const Shape& sb, F&& f) {
  const int64_t n = shape_numel(out);
  if (n == 0) return;
  const int64_t r = (int64_t)out.size();
  if (r == 0) {
    f(int64_t(0), int64_t(0), int64_t(0));
    return;
  }
  const int64_t inner = out[r - 1], rows = n / inner;
  const int64_t ia = sa[r - 1], ib = sb[r - 1];
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t rem = row, oa = 0, ob = 0;
    for (int64_t d = r - 2; d >= 0; --d) {
      const int64_t id = rem % out[d];
      rem /= out[d];
      oa += id * sa[d];
      ob += id * sb[d];
    }
    const int64_t base = row * inner;
    for (int64_t i = 0; i < inner; ++i) f(base + i, oa + i * ia, ob + i * ib);
  }
}

// Same with one input.
template <class F>
void for_each_strided(const Shape& shape, const Shape& sa, F&& f) {
  Shape zero(shape.size(), 0);
  for_each_bcast2(shape, sa, zero, [&](int64_t i, int64_t oa, int64_t) { f(i, oa); });
}

}  // namespace graft::kern
