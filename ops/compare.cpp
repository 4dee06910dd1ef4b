// Comparisons and logical ops on 0/1 masks (ops/compare.h): one broadcast loop over typed
// operands, nothing recorded.
#include "graft/ops/compare.h"

#include <cmath>

#include "graft/ops/custom.h"
#include "graft/ops/elementwise.h"

namespace graft {

namespace {

enum class Rel { eq, ne, lt, le, gt, ge, both, either };

// The dtype of two operands' mask: int64 < bf16, f16 < float32 < float64, as PyTorch promotes
// (bf16 with f16 gives float32).
DType promoted(DType a, DType b) {
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  if (a == DType::f32 || b == DType::f32) return DType::f32;
  if (is_half(a) && is_half(b) && a != b) return DType::f32;
  if (is_half(a)) return a;
  if (is_half(b)) return b;
  return DType::i64;
}

template <class T>
bool holds(Rel r, T x, T y) {
  switch (r) {
    case Rel::eq:
      return x == y;
    case Rel::ne:
      return x != y;
    case Rel::lt:
      return x < y;
    case Rel::le:
      return x <= y;
    case Rel::gt:
      return x > y;
    case Rel::ge:
      return x >= y;
    case Rel::both:
      return x != T(0) && y != T(0);
    case Rel::either:
      return x != T(0) || y != T(0);
  }
  return false;
}

// out[i] = rel(a[i], b[i]) as 0 or 1, a and b already of out's dtype T, read broadcast.
template <class T>
void compare_loop(Rel r, const Tensor& a, const Tensor& b, const Tensor& out) {
  const T* pa = a.data<const T>();
  const T* pb = b.data<const T>();
  T* po = out.data<T>();
  kern::for_each_bcast2(
      out.shape(), kern::broadcast_strides(a, out.shape()), kern::broadcast_strides(b, out.shape()),
      [&](int64_t i, int64_t oa, int64_t ob) { po[i] = holds(r, pa[oa], pb[ob]); });
}

// `t` in dtype `dt` (itself when it already is).
Tensor as_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : cast_copy(t, dt); }

Tensor compare(const char* op, Rel r, const Tensor& a, const Tensor& b) {
  check_defined(a, op, "a");
  check_defined(b, op, "b");
  const Shape shape = kern::broadcast_shapes(op, a.shape(), b.shape());
  const DType dt = promoted(a.dtype(), b.dtype());
  // 16-bit operands compare as float32 (exactly: float32 holds every bf16 and f16 value), and
  // the mask is then cast to their dtype (0 and 1 are exact there too).
  const DType work = is_half(dt) ? DType::f32 : dt;
  const Tensor x = as_dtype(a, work), y = as_dtype(b, work);
  Tensor out = Tensor::empty(shape, work);
  switch (work) {
    case DType::f32:
      compare_loop<float>(r, x, y, out);
      break;
    case DType::f64:
      compare_loop<double>(r, x, y, out);
      break;
    default:
      compare_loop<int64_t>(r, x, y, out);
      break;
  }
  return as_dtype(out, dt);
}

// a against the scalar v, in a's dtype: an int64 a against an integral v that fits int64 exactly;
// any other v against an int64 a in float64 (3 < 3.5, not 3 < 3).
Tensor compare(const char* op, Rel r, const Tensor& a, double v) {
  check_defined(a, op, "a");
  const bool exact_int =
      is_floating(a.dtype()) || (std::nearbyint(v) == v && std::fabs(v) < 9.2e18);
  // An int8 a meets v as int64 (200 does not fit int8, and int8_of would truncate 0.5).
  const DType int_dt = a.dtype() == DType::i8 ? DType::i64 : a.dtype();
  const Tensor b = exact_int ? scalar(v, int_dt) : scalar(v, DType::f64);
  const Tensor out = compare(op, r, a, b);
  return out.dtype() == a.dtype() ? out : cast_copy(out, a.dtype());
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", Rel::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", Rel::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", Rel::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", Rel::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", Rel::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", Rel::ge, a, b); }

// Declared in ops/elementwise.h (the padding masks' eq), defined here with its siblings.
Tensor eq(const Tensor& a, double v) { return compare("eq", Rel::eq, a, v); }
Tensor ne(const Tensor& a, double v) { return compare("ne", Rel::ne, a, v); }
Tensor lt(const Tensor& a, double v) { return compare("lt", Rel::lt, a, v); }
Tensor le(const Tensor& a, double v) { return compare("le", Rel::le, a, v); }
Tensor gt(const Tensor& a, double v) { return compare("gt", Rel::gt, a, v); }
Tensor ge(const Tensor& a, double v) { return compare("ge", Rel::ge, a, v); }

Tensor logical_not(const Tensor& a) { return compare("logical_not", Rel::eq, a, 0.0); }
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return compare("logical_and", Rel::both, a, b);
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return compare("logical_or", Rel::either, a, b);
}

}  // namespace graft
