#include "graft/autograd/tensor.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <sstream>
#include <type_traits>
#include <vector>

#include "autograd/internal/parallel.h"
#include "graft/autograd/tape.h"

namespace graft {

namespace {

// Calls f(T{}) with T the C++ type of dtype dt: the one switch over the dtypes that the loops
// below share (a new dtype is added here once).
template <class F>
void visit_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i64:
      return f(int64_t{});
    case DType::bf16:
      return f(bfloat16{});
    case DType::f16:
      return f(float16{});
    case DType::i8:
      return f(int8_t{});
  }
}

}  // namespace

namespace {

// Each dtype's facts in one row, indexed by the enum's value (the enum's order).
struct DTypeInfo {
  DType dt;
  size_t size;
  const char *name, *short_name;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::f32, 4, "float32", "f32"}, {DType::f64, 8, "float64", "f64"},
    {DType::i64, 8, "int64", "i64"},   {DType::bf16, 2, "bfloat16", "bf16"},
    {DType::f16, 2, "float16", "f16"}, {DType::i8, 1, "int8", "i8"}};
static_assert([] {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if ((size_t)kDTypes[i].dt != i) return false;
  return true;
}());

const DTypeInfo* dtype_info(DType dt) {
  const auto i = (size_t)dt;
  return i < std::size(kDTypes) ? &kDTypes[i] : nullptr;
}

}  // namespace

size_t dtype_size(DType dt) {
  const DTypeInfo* d = dtype_info(dt);
  return d ? d->size : 0;
}

const char* dtype_name(DType dt) {
  const DTypeInfo* d = dtype_info(dt);
  return d ? d->name : "?";
}

const char* dtype_short_name(DType dt) {
  const DTypeInfo* d = dtype_info(dt);
  return d ? d->short_name : "?";
}

DType parse_dtype(const std::string& name, const std::string& what) {
  for (const DTypeInfo& d : kDTypes)
    if (name == d.short_name || name == d.name) return d.dt;
  fail(what + ": unknown dtype '" + name + "' (f32, f64, i64, bf16, f16, i8 or their long names)");
}

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + ")";
}

// Element counts and strides are checked: a product past 2^63 - 1 would wrap, and a tiny
// buffer would then be written far past its end.
int64_t shape_numel(const Shape& s) {
  for (auto d : s)
    if (d < 0) fail("shape " + shape_str(s) + " has a negative dimension");
  for (auto d : s)
    if (d == 0) return 0;
  int64_t n = 1;
  for (auto d : s)
    if (__builtin_mul_overflow(n, d, &n))
      fail("shape " + shape_str(s) + " has more than 2^63 - 1 elements");
  return n;
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(std::string(what) + ": the count overflows int64");
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(std::string(what) + ": the count overflows int64");
  return r;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    if (__builtin_mul_overflow(acc, std::max<int64_t>(s[i], 1), &acc))
      fail("shape " + shape_str(s) + ": its strides overflow int64");
  }
  return st;
}

void fail(const std::string& msg) { throw Error(msg); }

int64_t norm_axis(const char* op, int64_t axis, int64_t rank, const Tensor* input) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    fail(std::string(op) + ": axis " + std::to_string(axis) + " out of range for " +
         (input ? "input " + describe(*input) : "rank " + std::to_string(rank)));
  return a;
}

Tensor Tensor::empty(const Shape& shape, DType dt) {
  for (auto d : shape)
    if (d < 0) fail("empty: negative dimension in shape " + shape_str(shape));
  const int64_t n = shape_numel(shape);
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n, (int64_t)dtype_size(dt), &bytes))
    fail("empty: shape " + shape_str(shape) + " of " + dtype_name(dt) +
         " needs more than 2^63 bytes");
  auto impl = std::make_shared<TensorImpl>();
  try {
    impl->storage = std::make_shared<Storage>((size_t)bytes);
  } catch (const std::bad_alloc&) {
    fail("empty: cannot allocate " + std::to_string(bytes) + " bytes for shape " +
         shape_str(shape) + " of " + dtype_name(dt));
  }
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dt;
  return Tensor(std::move(impl));
}

// The view must lie inside the storage: its lowest and highest element (through negative and
// positive strides) within [0, elements of the storage), computed without overflow.
Tensor Tensor::view_of(const Tensor& base, const Shape& shape, const Shape& strides,
                       int64_t offset) {
  check_defined(base, "view_of", "the base");
  if (shape.size() != strides.size())
    fail("view_of: shape " + shape_str(shape) + " and strides " + shape_str(strides) +
         " differ in rank");
  if (shape_numel(shape) > 0) {
    __int128 lo = offset, hi = offset;
    for (size_t i = 0; i < shape.size(); ++i) {
      const __int128 span = (__int128)(shape[i] - 1) * strides[i];
      (span < 0 ? lo : hi) += span;
    }
    const int64_t elems = (int64_t)(base.impl_->storage->nbytes / dtype_size(base.dtype()));
    if (lo < 0 || hi >= elems)
      fail("view_of: shape " + shape_str(shape) + ", strides " + shape_str(strides) + ", offset " +
           std::to_string(offset) + " reach outside a storage of " + std::to_string(elems) +
           " elements");
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

void Tensor::undefined_access(const char* accessor) {
  fail(std::string("Tensor::") + accessor + ": called on an undefined tensor");
}

void check_defined(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) fail(std::string(op) + ": " + what + " is an undefined tensor");
}

int64_t Tensor::size(int64_t axis) const {
  const Shape& s = state("size").shape;
  return s[norm_axis("size", axis, (int64_t)s.size())];
}

bool Tensor::is_contiguous() const {
  state("is_contiguous");
  int64_t expect = 1;
  for (int64_t i = dim(); i-- > 0;) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expect) return false;
    expect *= shape()[i];
  }
  return true;
}

template <class T>
static constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, bfloat16>) return DType::bf16;
  else if constexpr (std::is_same_v<T, float16>) return DType::f16;
  else if constexpr (std::is_same_v<T, int8_t>) return DType::i8;
  else return DType::i64;
}

template <class T>
T* Tensor::data() const {
  const TensorImpl& st = state("data");
  if (dtype_of<std::remove_const_t<T>>() != st.dtype)
    fail(std::string("data: tensor is ") + dtype_name(dtype()) + ", requested " +
         dtype_name(dtype_of<std::remove_const_t<T>>()));
  if (!st.storage->data) [[unlikely]]
    fail(st.storage->released);
  return static_cast<T*>(st.storage->data) + st.offset;
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template int64_t* Tensor::data<int64_t>() const;
template const float* Tensor::data<const float>() const;
template const double* Tensor::data<const double>() const;
template const int64_t* Tensor::data<const int64_t>() const;
template bfloat16* Tensor::data<bfloat16>() const;
template float16* Tensor::data<float16>() const;
template const bfloat16* Tensor::data<const bfloat16>() const;
template const float16* Tensor::data<const float16>() const;
template int8_t* Tensor::data<int8_t>() const;
template const int8_t* Tensor::data<const int8_t>() const;

void* Tensor::raw() const {
  const TensorImpl& st = state("raw");
  if (!st.storage->data) [[unlikely]]
    fail(st.storage->released);
  return static_cast<char*>(st.storage->data) + st.offset * dtype_size(st.dtype);
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  state("to_vector");
  std::vector<T> out;
  out.reserve(numel());
  visit_dtype(dtype(), [&](auto tag) {
    const auto* p = data<decltype(tag)>();
    for_each_offset(shape(), strides(), [&](int64_t o) { out.push_back((T)p[o]); });
  });
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

double Tensor::item() const {
  state("item");
  if (numel() != 1)
    fail("item: tensor of shape " + shape_str(shape()) + " has " + std::to_string(numel()) +
         " elements, expected 1");
  return to_vector<double>()[0];
}

Tensor& Tensor::requires_grad_(bool on) {
  state("requires_grad_");
  if (on && !is_floating(dtype()))
    fail(std::string("requires_grad_: only float tensors can require grad, got ") +
         dtype_name(dtype()));
  if (!is_leaf())
    fail("requires_grad_: " + describe(*this) +
         " was produced by an op on the tape; call detach() first");
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const TensorImpl& st = state("grad");
  return st.grad ? Tensor(st.grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  state("set_grad");
  if (g.defined() && (g.shape() != shape() || g.dtype() != dtype()))
    fail("set_grad: gradient " + describe(g) + " does not match tensor " + describe(*this));
  impl_->grad = g.defined() ? g.impl_ptr() : nullptr;
}

void Tensor::zero_grad() { state("zero_grad").grad.reset(); }

void Tensor::retain_grad() const {
  state("retain_grad");
  autograd::retain_grad(*this);
}

Tensor Tensor::detach() const {
  state("detach");
  return view_of(*this, shape(), strides(), offset());
}

void Tensor::backward(const Tensor& grad, bool retain_graph, bool create_graph) const {
  autograd::backward(*this, grad, retain_graph, create_graph);
}

std::string describe(DType dt, const Shape& shape) {
  return std::string(dtype_short_name(dt)) + " " + shape_str(shape);
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return describe(t.dtype(), t.shape());
}

std::string Tensor::str(int max_elems) const {
  state("str");
  std::ostringstream os;
  os << "Tensor " << describe(*this) << " [";
  auto v = to_vector<double>();
  for (size_t i = 0; i < v.size() && (int)i < max_elems; ++i) os << (i ? ", " : "") << v[i];
  if ((int)v.size() > max_elems) os << ", ...";
  os << "]";
  return os.str();
}

// ---- random numbers ----
uint64_t Generator::next_u64() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }

double Generator::uniform() { return (next_u64() >> 11) * 0x1.0p-53; }

double Generator::normal() {
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Generator::below(uint64_t n) {
  if (n == 0) fail("Generator::below: n must be positive");
  // Rejection removes the modulo bias of the top partial block.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return x % n;
}

Generator& default_generator() {
  static Generator g(42);
  return g;
}
void manual_seed(uint64_t seed) { default_generator().set_state(seed); }

// ---- creation ----
// A double as int64: a value outside int64's range (or NaN) would be undefined behaviour in the
// cast, so it is an error instead.
static int64_t int64_of(double v, const char* op) {
  if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
    fail(std::string(op) + ": " + std::to_string(v) + " does not fit an int64 tensor");
  return (int64_t)v;
}
// A double as int8: outside -128..127 (after truncation) or NaN is an error, never a wrap.
static int8_t int8_of(double v, const char* op) {
  if (!(v > -129.0 && v < 128.0))
    fail(std::string(op) + ": " + std::to_string(v) + " does not fit an int8 tensor");
  return (int8_t)v;
}
// A double as an element of type T: checked for the integer types, a plain cast for the floats.
template <class T>
static T element_of(double v, const char* op) {
  if constexpr (std::is_same_v<T, int64_t>) return int64_of(v, op);
  else if constexpr (std::is_same_v<T, int8_t>) return int8_of(v, op);
  else return (T)v;
}

template <class T, class F>
static void fill_seq(const Tensor& t, F&& f) {
  T* p = t.data<T>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = element_of<T>(f(i), "fill");
}

static void fill_all(const Tensor& t, const std::function<double(int64_t)>& f) {
  visit_dtype(t.dtype(), [&](auto tag) { fill_seq<decltype(tag)>(t, f); });
}

Tensor full(const Shape& shape, double value, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  fill_(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  std::memset(t.raw(), 0, t.numel() * dtype_size(dt));
  return t;
}
Tensor ones(const Shape& shape, DType dt) { return full(shape, 1.0, dt); }
Tensor scalar(double value, DType dt) { return full({}, value, dt); }

Tensor arange(double start, double end, double step, DType dt) {
  if (step == 0) fail("arange: step must be non-zero");
  int64_t n = int64_of(std::ceil((end - start) / step), "arange");
  if (n < 0) n = 0;
  Tensor t = Tensor::empty({n}, dt);
  fill_all(t, [&](int64_t i) { return start + (double)i * step; });
  return t;
}
Tensor arange(int64_t n, DType dt) { return arange(0.0, (double)n, 1.0, dt); }

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dt) {
  if ((int64_t)values.size() != shape_numel(shape))
    fail("from_vector: " + std::to_string(values.size()) + " values do not fill shape " +
         shape_str(shape));
  Tensor t = Tensor::empty(shape, dt);
  if (dt == DType::i64 && std::is_integral_v<T>) {  // exact for ids beyond 2^53
    for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = (int64_t)values[i];
    return t;
  }
  fill_all(t, [&](int64_t i) { return (double)values[i]; });
  return t;
}
template Tensor from_vector(const std::vector<float>&, const Shape&, DType);
template Tensor from_vector(const std::vector<double>&, const Shape&, DType);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, DType);
template Tensor from_vector(const std::vector<int>&, const Shape&, DType);
Tensor from_vector(const std::vector<float>& v, const Shape& s) {
  return from_vector(v, s, DType::f32);
}
Tensor from_vector(const std::vector<double>& v, const Shape& s) {
  return from_vector(v, s, DType::f64);
}
Tensor from_vector(const std::vector<int64_t>& v, const Shape& s) {
  return from_vector(v, s, DType::i64);
}

Tensor rand(const Shape& shape, DType dt, Generator& gen, double lo, double hi) {
  Tensor t = Tensor::empty(shape, dt);
  fill_all(t, [&](int64_t) { return lo + (hi - lo) * gen.uniform(); });
  return t;
}
Tensor randn(const Shape& shape, DType dt, Generator& gen, double mean, double std) {
  Tensor t = Tensor::empty(shape, dt);
  fill_all(t, [&](int64_t) { return mean + std * gen.normal(); });
  return t;
}

// ---- raw copies ----
// A batch of transposed matrices (src's last two dims read with strides (1, ld)) into a
// contiguous dst, in 32 x 32 tiles so both the reads and the writes stay within cache lines:
// the row loop below reads such a view a whole column apart per element (11.4 ms for a 2048^2
// float transpose at 2 threads, 5.2 ms tiled, measured on AMD EPYC Zen 4). False when src is not
// such a view.
template <class D, class S>
static bool copy_transposed(const Tensor& dst, const Tensor& src, D* d, const S* s) {
  const int64_t r = src.dim();
  if (r < 2 || !dst.is_contiguous() || src.strides()[r - 2] != 1 || src.strides()[r - 1] <= 1)
    return false;
  const Shape& shp = src.shape();
  const int64_t R = shp[r - 2], C = shp[r - 1], ld = src.strides()[r - 1];
  if (R < 2 || C < 2) return false;
  constexpr int64_t kTile = 32;
  const int64_t tr = (R + kTile - 1) / kTile, tc = (C + kTile - 1) / kTile,
                batch = src.numel() / (R * C);
  const int64_t jobs = batch * tr * tc;
#pragma omp parallel for if (src.numel() > 1 << 15) schedule(static)
  for (int64_t job = 0; job < jobs; ++job) {
    const int64_t b = job / (tr * tc), t = job % (tr * tc), i0 = t / tc * kTile,
                  j0 = t % tc * kTile;
    int64_t rem = b, os = 0;
    for (int64_t k = r - 3; k >= 0; --k) {
      os += rem % shp[k] * src.strides()[k];
      rem /= shp[k];
    }
    D* db = d + b * R * C;
    const int64_t i1 = std::min(R, i0 + kTile), j1 = std::min(C, j0 + kTile);
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = j0; j < j1; ++j) db[i * C + j] = (D)s[os + i + j * ld];
  }
  return true;
}

template <class D, class S>
static void copy_typed(const Tensor& dst, const Tensor& src) {
  D* d = dst.data<D>();
  const S* s = src.data<S>();
  if (dst.is_contiguous() && src.is_contiguous()) {
    const int64_t n = src.numel();
    detail::parallel_for(n, n > 1 << 16, [&](int64_t i) { d[i] = (D)s[i]; });
    return;
  }
  if (copy_transposed(dst, src, d, s)) return;
  // One element read everywhere (a broadcast scalar, as sum's backward expands): a fill, 5x the
  // row loop's speed (4M floats 0.4 against 2.0 ms, AMD EPYC Zen 4).
  if (dst.is_contiguous() && src.numel() > 0 &&
      std::all_of(src.strides().begin(), src.strides().end(), [](int64_t st) { return st == 0; })) {
    const D v = (D)s[0];
    const int64_t n = src.numel();
#pragma omp parallel for simd if (n > 1 << 16) schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = v;
    return;
  }
  // Rows of the last dim are split across threads; each thread decodes its row's start offsets.
  const Shape& shp = src.shape();
  const int64_t r = src.dim(), n = src.numel();
  if (r == 0 || n == 0) {
    if (n) d[0] = (D)s[0];
    return;
  }
  const int64_t inner = shp[r - 1], rows = n / inner;
  const int64_t sd = dst.strides()[r - 1], ss = src.strides()[r - 1];
  detail::parallel_for(rows, n > 1 << 15, [&](int64_t row) {
    int64_t rem = row, od = 0, os = 0;
    for (int64_t k = r - 2; k >= 0; --k) {
      const int64_t id = rem % shp[k];
      rem /= shp[k];
      od += id * dst.strides()[k];
      os += id * src.strides()[k];
    }
    for (int64_t i = 0; i < inner; ++i) d[od + i * sd] = (D)s[os + i * ss];
  });
}

template <class D>
static void copy_from(const Tensor& dst, const Tensor& src) {
  visit_dtype(src.dtype(), [&](auto tag) { copy_typed<D, decltype(tag)>(dst, src); });
}

namespace {
// Whether two elements of t share a memory location (a broadcast_to view, a stride-0 dim, any
// view_of whose strides fold back onto themselves). Dims sorted by stride, each stride past the
// reach of the smaller ones proves the elements distinct; a layout that fails that is checked
// by comparing every element's offset.
bool has_overlapping_elements(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of the dims of size > 1
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.shape()[i] <= 1) continue;
    if (t.strides()[i] == 0) return true;
    dims.emplace_back(std::abs(t.strides()[i]), t.shape()[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the largest offset difference within the smaller dims
  bool ordered = true;
  for (auto [stride, n] : dims) {
    if (stride <= reach) ordered = false;
    reach += stride * (n - 1);  // within the storage (view_of checks), so it cannot overflow
  }
  if (ordered) return false;
  std::vector<int64_t> offsets;
  offsets.reserve(t.numel());
  for_each_offset(t.shape(), t.strides(), [&](int64_t o) { offsets.push_back(o); });
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end();
}

// The bytes [first, last] of its storage a non-empty view reads or writes.
std::pair<int64_t, int64_t> byte_span(const Tensor& t) {
  int64_t lo = t.offset(), hi = t.offset();
  for (int64_t i = 0; i < t.dim(); ++i)
    (t.strides()[i] < 0 ? lo : hi) += (t.shape()[i] - 1) * t.strides()[i];
  const int64_t size = (int64_t)dtype_size(t.dtype());
  return {lo * size, hi * size + size - 1};
}

// Whether writing dst element by element could overwrite source elements not yet read.
bool may_alias(const Tensor& dst, const Tensor& src) {
  if (!dst.same_storage(src) || dst.numel() == 0) return false;
  const auto [dlo, dhi] = byte_span(dst);
  const auto [slo, shi] = byte_span(src);
  return dlo <= shi && slo <= dhi;
}
}  // namespace

// A source that overlaps the destination is copied to a temporary first, as memmove does.
void copy_into(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_into", "the destination");
  check_defined(src, "copy_into", "the source");
  if (dst.shape() != src.shape())
    fail("copy_into: destination " + describe(dst) + " and source " + describe(src) +
         " differ in shape");
  if (has_overlapping_elements(dst))
    fail("copy_into: the destination " + describe(dst) + " (strides " + shape_str(dst.strides()) +
         ") has elements that share memory (a broadcast_to or other overlapping view); copy into "
         "a contiguous tensor instead");
  if (may_alias(dst, src)) return copy_into(dst, contiguous_copy(src));
  if (dst.dtype() == DType::i64 && is_floating(src.dtype()))  // the cast of NaN or +-1e30 is UB
    for (double v : src.to_vector<double>()) int64_of(v, "copy_into (to int64)");
  if (dst.dtype() == DType::i8 && src.dtype() != DType::i8)  // UB for floats, a wrap for int64
    for (double v : src.to_vector<double>()) int8_of(v, "copy_into (to int8)");
  visit_dtype(dst.dtype(), [&](auto tag) { copy_from<decltype(tag)>(dst, src); });
  dst.bump_version();
}

namespace {
// Marks `copy` as made off the tape from `source` (Storage::copied_from), so the tape can tell an
// op that saves it instead of its input.
void tag_copy(const Tensor& copy, const Tensor& source, const char* helper) {
  const std::shared_ptr<Storage>& from = source.impl()->storage;
  std::vector<std::weak_ptr<Storage>> chain{from};
  chain.insert(chain.end(), from->copied_from.begin(), from->copied_from.end());
  copy.impl()->storage->copied_from = std::move(chain);
  copy.impl()->storage->copied_by = helper;
}
}  // namespace

Tensor contiguous_copy(const Tensor& t) {
  check_defined(t, "contiguous_copy", "the tensor");
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  copy_into(out, t);
  tag_copy(out, t, "contiguous_copy");
  return out;
}

Tensor cast_copy(const Tensor& t, DType dt) {
  check_defined(t, "cast_copy", "the tensor");
  Tensor out = Tensor::empty(t.shape(), dt);
  copy_into(out, t);
  tag_copy(out, t, "cast_copy");
  return out;
}

template <class T>
static void add_inplace(T* d, const T* p, int64_t n) {
#pragma omp parallel for simd if (n > 1 << 16)
  for (int64_t i = 0; i < n; ++i) d[i] += p[i];
}

// d += p for a 16-bit dtype: each sum in float32, rounded once into d.
template <class H>
static void add_half(H* d, const H* p, int64_t n) {
#pragma omp parallel for if (n > 1 << 16)
  for (int64_t i = 0; i < n; ++i) d[i] = H((float)d[i] + (float)p[i]);
}

void accumulate_into(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "accumulate_into", "the destination");
  check_defined(src, "accumulate_into", "the source");
  if (dst.shape() != src.shape() || dst.dtype() != src.dtype() || !dst.is_contiguous() ||
      !is_floating(dst.dtype()))
    fail("accumulate_into: cannot add " + describe(src) + " into " + describe(dst));
  Tensor s = src.is_contiguous() ? src : contiguous_copy(src);
  if (dst.dtype() == DType::f32) add_inplace(dst.data<float>(), s.data<float>(), dst.numel());
  else if (dst.dtype() == DType::f64)
    add_inplace(dst.data<double>(), s.data<double>(), dst.numel());
  else if (dst.dtype() == DType::bf16)
    add_half(dst.data<bfloat16>(), s.data<bfloat16>(), dst.numel());
  else add_half(dst.data<float16>(), s.data<float16>(), dst.numel());
  dst.bump_version();
}

void fill_(const Tensor& t, double value) {
  check_defined(t, "fill_", "the tensor");
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    const T v = element_of<T>(value, "fill_");
    for_each_offset(t.shape(), t.strides(), [&](int64_t o) { p[o] = v; });
  });
  t.bump_version();
}

Split3 split3(const Shape& s, int64_t first, int64_t last) {
  Split3 r;
  for (int64_t d = 0; d < (int64_t)s.size(); ++d) {
    if (d < first) r.outer *= s[d];
    else if (d <= last) r.n *= s[d];
    else r.inner *= s[d];
  }
  return r;
}

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != to[lead + i] && from[i] != 1) return false;
  return true;
}

// x viewed as (outer, mid, inner), contiguous: out[o, j] = scale * sum_m x[o, m, j].
// Parallel over output elements (blocks of j), each summed in m order; the j loop vectorises.
template <class T>
static void sum_block(const T* px, T* po, Split3 s, double scale) {
  const int64_t outer = s.outer, mid = s.n, inner = s.inner;
  if (inner == 1) {
#pragma omp parallel for if (outer * mid > 1 << 15) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      T acc = 0;
      const T* row = px + o * mid;
#pragma omp simd reduction(+ : acc)
      for (int64_t m = 0; m < mid; ++m) acc += row[m];
      po[o] = (T)(acc * scale);
    }
    return;
  }
  constexpr int64_t kBlock = 256;
  const int64_t jblocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for if (outer * mid * inner > 1 << 15) schedule(static)
  for (int64_t t = 0; t < outer * jblocks; ++t) {
    const int64_t o = t / jblocks, j0 = (t % jblocks) * kBlock, j1 = std::min(inner, j0 + kBlock);
    T* out = po + o * inner;
    for (int64_t j = j0; j < j1; ++j) out[j] = 0;
    for (int64_t m = 0; m < mid; ++m) {
      const T* row = px + (o * mid + m) * inner;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) out[j] += row[j];
    }
    if (scale != 1.0)
      for (int64_t j = j0; j < j1; ++j) out[j] = (T)(out[j] * scale);
  }
}

// One run of adjacent axes at a time (last run first).
Tensor sum_axes(const Tensor& x, const std::vector<int64_t>& axes, double scale) {
  check_defined(x, "sum_axes", "x");
  if (!is_floating(x.dtype())) fail("sum_axes: expected a float tensor, got " + describe(x));
  if (is_half(x.dtype()))  // summed in float32, stored back in x's dtype
    return cast_copy(sum_axes(cast_copy(x, DType::f32), axes, scale), x.dtype());
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] < 0 || axes[i] >= x.dim() || (i > 0 && axes[i] <= axes[i - 1]))
      fail("sum_axes: axes " + shape_str(axes) + " are not sorted, distinct axes of " +
           describe(x));
  Shape shape = x.shape();
  for (int64_t a : axes) shape[a] = 1;
  if (x.numel() == 0) return zeros(shape, x.dtype());
  Tensor cur = x.is_contiguous() && !axes.empty() ? x : contiguous_copy(x);
  if (axes.empty()) {  // nothing to reduce (a 0-d x): the scaled copy
    GRAFT_DISPATCH_FLOAT(x.dtype(), "sum_axes", [&] {
      for (int64_t i = 0; i < cur.numel(); ++i) cur.data<T>()[i] = (T)(cur.data<T>()[i] * scale);
    });
    return cur;
  }
  shape = x.shape();
  size_t end = axes.size();
  while (end > 0) {
    size_t begin = end - 1;
    while (begin > 0 && axes[begin - 1] == axes[begin] - 1) --begin;
    const Split3 s = split3(shape, axes[begin], axes[end - 1]);
    for (size_t i = begin; i < end; ++i) shape[axes[i]] = 1;
    Tensor next = Tensor::empty(shape, x.dtype());
    const double sc = begin == 0 ? scale : 1.0;
    GRAFT_DISPATCH_FLOAT(x.dtype(), "sum_axes",
                         [&] { sum_block<T>(cur.data<T>(), next.data<T>(), s, sc); });
    cur = next;
    end = begin;
  }
  return cur;
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  check_defined(x, "sum_to", "x");
  if (!broadcasts_to(shape, x.shape()))
    fail("sum_to: cannot reduce " + describe(x) + " to shape " + shape_str(shape));
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - (int64_t)shape.size();
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) axes.push_back(i);
  Tensor s = axes.empty() ? contiguous_copy(x) : sum_axes(x, axes);
  return Tensor::view_of(s, shape, contiguous_strides(shape), 0);
}

}  // namespace graft
