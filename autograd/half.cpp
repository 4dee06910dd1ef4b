// The array conversions between float and the 16-bit storage types: plain loops over the
// inline per-element conversions of half.h, compiled here so that they vectorise whatever flags
// the caller was built with.
#include "graft/autograd/half.h"

namespace graft {

void to_float(const bfloat16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_bits_to_float(x[i].bits);
}
void to_float(const float16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16_bits_to_float(x[i].bits);
}
void from_float(const float* x, bfloat16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i].bits = bf16_bits_of(x[i]);
}
void from_float(const float* x, float16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i].bits = f16_bits_of(x[i]);
}

}  // namespace graft
