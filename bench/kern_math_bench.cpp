// kern_math_bench: what a custom op's raw loop costs with each way of writing its math, on one
// thread (issue 48). Times, per 4M float32 elements (best of 5):
//   - std:: in the caller's loop, the inline kern:: function in the caller's loop, and the
//     library's array form kern::f(x, y, n), for exp, log, tanh and sigmoid;
//   - a unary table row's forward (unary(), ops/elementwise.h) for the same formula written two
//     ways: `x > 0 ? x * x : x * 0` and `std::max(x, 0) * x` (equal for finite x).
// Run it with OMP_NUM_THREADS=1. The caller's loops are compiled with this program's flags:
// bench/kern_math_flags.sh builds it with several (-O2, -O3, -march=native, -fopenmp) to show what
// depends on them.
//   kern_math_bench [N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "graft/ops/custom.h"
#include "graft/ops/elementwise.h"

using namespace graft;

namespace {

// The best of 5 runs of f(), in milliseconds.
template <class F>
double best_ms(F&& f) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The best time of a loop calling F per element, compiled here (with this program's flags).
template <auto F>
double loop_ms(const float* x, float* y, int64_t n) {
  return best_ms([&] {
    for (int64_t i = 0; i < n; ++i) y[i] = F(x[i]);
  });
}

// One line per function: std:: in a loop, kern:: inline in a loop, kern::'s array form.
template <auto STD, auto KERN>
void time_function(const char* name, void (*array)(const float*, float*, int64_t), float lo,
                   float hi, int64_t n) {
  std::vector<float> x((size_t)n), y((size_t)n);
  for (int64_t i = 0; i < n; ++i)
    x[(size_t)i] = lo + (hi - lo) * (float)((i * 7919) % n) / (float)n;
  const double t_std = loop_ms<STD>(x.data(), y.data(), n);
  const double t_inline = loop_ms<KERN>(x.data(), y.data(), n);
  const double t_array = best_ms([&] { array(x.data(), y.data(), n); });
  std::printf("%-8s std:: loop %7.2f ms   kern:: inline loop %7.2f ms   kern:: array %7.2f ms\n",
              name, t_std, t_inline, t_array);
}

void time_functions(int64_t n) {
  time_function<[](float x) { return std::exp(x); }, [](float x) { return kern::exp(x); }>(
      "exp", kern::exp, -20, 20, n);
  time_function<[](float x) { return std::log(x); }, [](float x) { return kern::log(x); }>(
      "log", kern::log, 1e-3f, 1e3f, n);
  time_function<[](float x) { return std::tanh(x); }, [](float x) { return kern::tanh(x); }>(
      "tanh", kern::tanh, -5, 5, n);
  time_function<[](float x) { return 1.0f / (1.0f + std::exp(-x)); },
                [](float x) { return kern::sigmoid(x); }>("sigmoid", kern::sigmoid, -10, 10, n);
}

constexpr auto square_pos_ternary = [](auto x, auto, auto) { return x > 0 ? x * x : x * 0; };
constexpr auto square_pos_max = [](auto x, auto, auto) { return std::max(x, decltype(x)(0)) * x; };
constexpr auto square_pos_df = [](auto x, auto, auto, auto) { return x > 0 ? 2 * x : x * 0; };

// A unary row's forward, the same formula written two ways.
void time_rows(int64_t n) {
  static const UnaryOp ternary =
      unary_row<square_pos_ternary, square_pos_df>({.name = "bench_sq_ternary"});
  static const UnaryOp max_form =
      unary_row<square_pos_max, square_pos_df>({.name = "bench_sq_max"});
  Tensor x = Tensor::empty({n});
  float* p = x.data<float>();
  for (int64_t i = 0; i < n; ++i)
    p[i] = (float)(((i * 7919) % 2001) - 1000) / 100.0f;  // signs mixed
  for (const UnaryOp* row : {&ternary, &max_form})
    std::printf("row %-18s %7.2f ms\n", row->name, best_ms([&] { unary(*row, x); }));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t(1) << 22;
  std::printf("%lld float32 elements (run with OMP_NUM_THREADS=1 for one thread)\n", (long long)n);
  time_functions(n);
  time_rows(n);
  return 0;
}
