// half_matmul_bench: one linear y = x W^T (inference, no tape) at LLM-ish shapes, four ways:
//   f32        float32 x and W (graft's float32 inference path: oneDNN inner product on a
//              reordered copy of W, or its own loop for one row)
//   guard_bf16 float32 x and W under PrecisionGuard(bf16): oneDNN's bf16 inner product on a
//              kept bf16 copy of W reordered to its blocked layout, x converted per call (what
//              bf16 tensors would cost if they kept a reordered weight, as float32 does)
//   bf16       bf16 x and W (DType::bf16): oneDNN's bf16 matmul on W as it is, no copy
// at 1 and 2 threads. Each figure is the best of 5 rounds of the mean time of a call.
// Usage: half_matmul_bench [--rounds N]
// Prints one JSON line per shape, mode and thread count, and the kernels in force.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "graft/graft.h"

using namespace graft;

namespace {

struct Shape3 {
  int64_t rows, in, out;
};

// Best of `rounds` of the mean seconds per call of f over enough calls for ~50 ms.
double best_seconds(const std::function<void()>& f, int rounds) {
  f();  // warm: primitives, thread buffers, kept copies
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto t0 = now();
  f();
  const double once = std::chrono::duration<double>(now() - t0).count();
  const int calls = std::max(1, (int)(0.05 / std::max(once, 1e-7)));
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    t0 = now();
    for (int i = 0; i < calls; ++i) f();
    best = std::min(best, std::chrono::duration<double>(now() - t0).count() / calls);
  }
  return best;
}

void report(const Shape3& s, const char* mode, int threads, double sec, double weight_bytes) {
  const double flops = 2.0 * s.rows * s.in * s.out;
  std::printf(
      "{\"x\":[%lld,%lld],\"w\":[%lld,%lld],\"mode\":\"%s\",\"threads\":%d,\"us\":%.1f,"
      "\"gflops\":%.1f,\"weight_gbs\":%.1f}\n",
      (long long)s.rows, (long long)s.in, (long long)s.out, (long long)s.in, mode, threads,
      sec * 1e6, flops / sec * 1e-9, weight_bytes / sec * 1e-9);
  std::fflush(stdout);
}

void bench_shape(const Shape3& s, int threads, int rounds) {
  omp_set_num_threads(threads);
  autograd::NoGrad no_tape;
  const Tensor x = randn({s.rows, s.in}), w = mul(randn({s.out, s.in}), full({1}, 0.02));
  const Tensor x16 = cast_copy(x, DType::bf16), w16 = cast_copy(w, DType::bf16);
  const double n = (double)s.in * s.out;
  report(s, "f32", threads, best_seconds([&] { linear(x, w); }, rounds), 4 * n);
  {
    PrecisionGuard bf16(Precision::bf16);
    report(s, "guard_bf16", threads, best_seconds([&] { linear(x, w); }, rounds), 2 * n);
  }
  report(s, "bf16", threads, best_seconds([&] { linear(x16, w16); }, rounds), 2 * n);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::max(1, std::atoi(argv[i + 1]));
  std::printf("{\"kernels\":\"%s; %s; f32 %s\"}\n", half_matmul_description(DType::bf16).c_str(),
              bf16_description().c_str(), matmul_kernel_name(Precision::fp32).c_str());
  const std::vector<Shape3> shapes{
      {1, 4096, 4096}, {32, 1024, 4096}, {32, 4096, 4096}, {1, 1024, 4096}, {256, 1024, 4096}};
  for (int threads : {1, 2})
    for (const Shape3& s : shapes) bench_shape(s, threads, rounds);
}
