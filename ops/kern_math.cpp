// The array forms of kern::exp, log, tanh and sigmoid (ops/custom.h): compiled here, with the
// library's flags and OpenMP SIMD, so that a custom op's loop is vectorised whatever flags its
// own code is built with.
#include <cmath>

#include "graft/ops/custom.h"

namespace graft::kern {

namespace {

template <class T, class F>
void apply(const T* x, T* y, int64_t n, F&& f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

}  // namespace

void exp(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](float v) { return exp(v); });
}
void exp(const double* x, double* y, int64_t n) {
  apply(x, y, n, [](double v) { return std::exp(v); });
}
void log(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](float v) { return log(v); });
}
void log(const double* x, double* y, int64_t n) {
  apply(x, y, n, [](double v) { return std::log(v); });
}
void tanh(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](float v) { return tanh(v); });
}
void tanh(const double* x, double* y, int64_t n) {
  apply(x, y, n, [](double v) { return std::tanh(v); });
}
void sigmoid(const float* x, float* y, int64_t n) {
  apply(x, y, n, [](float v) { return sigmoid(v); });
}
void sigmoid(const double* x, double* y, int64_t n) {
  apply(x, y, n, [](double v) { return sigmoid(v); });
}

}  // namespace graft::kern
