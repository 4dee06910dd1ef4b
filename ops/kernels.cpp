#include "ops/kernels.h"

namespace graft::kern {

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(std::string(op) + ": shapes " + shape_str(a) + " and " + shape_str(b) +
           " cannot be broadcast (dim " + std::to_string(i) + ": " + std::to_string(da) +
           " vs " + std::to_string(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& out) {
  const size_t r = out.size(), k = (size_t)t.dim();
  Shape s(r, 0);
  for (size_t i = 0; i < k; ++i) {
    const size_t o = r - k + i;
    s[o] = t.shape()[i] == 1 && out[o] != 1 ? 0 : t.strides()[i];
  }
  return s;
}

void check_float(const char* op, const Tensor& t) {
  if (!t.defined()) fail(std::string(op) + ": got an undefined tensor");
  if (!is_floating(t.dtype()))
    fail(std::string(op) + ": expected a float tensor, got " + describe(t));
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    fail(std::string(op) + ": dtype mismatch, " + describe(a) + " vs " + describe(b));
}

}  // namespace graft::kern
