// Tensor: an N-d array handle (float32, float64 or int64) with shape, strides and a shared
// storage, plus the autograd fields (requires_grad, grad, the tape entry that produced it).
//
// Views (reshape of contiguous data, permute/transpose, slice) share storage; every in-place
// write bumps the storage's version counter so the tape can detect a saved tensor that changed.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace graft {

enum class DType { f32, f64, i64 };
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
inline bool is_floating(DType dt) { return dt == DType::f32 || dt == DType::f64; }

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(2, 3)"
int64_t shape_numel(const Shape& s);
// Counts with overflow checks: a result that does not fit int64 is an error naming `what`.
int64_t checked_mul(int64_t a, int64_t b, const char* what);
int64_t checked_add(int64_t a, int64_t b, const char* what);
Shape contiguous_strides(const Shape& s);
// A contiguous shape read as (outer, n, inner) around the axes [first, last]: outer = product of
// the dims before first, n = product of first..last, inner = product of the dims after last.
struct Split3 {
  int64_t outer = 1, n = 1, inner = 1;
};
Split3 split3(const Shape& s, int64_t first, int64_t last);
inline Split3 split3(const Shape& s, int64_t axis) { return split3(s, axis, axis); }
// True when `from` broadcasts to `to` (NumPy rules: align right, each dim equal or 1).
bool broadcasts_to(const Shape& from, const Shape& to);

// Every error the library raises on bad input: the message names the op and the shapes.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& msg);
// Normalises a possibly negative axis against a rank, or throws "<op>: axis a out of range for rank r".
int64_t norm_axis(const char* op, int64_t axis, int64_t rank);

// Raw, 64-byte aligned memory. The version counter is shared by all views of the storage.
struct Storage {
  explicit Storage(size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;
  size_t nbytes = 0;
  size_t capacity = 0;  // bytes actually allocated (>= nbytes; big blocks come from a cache)
  uint64_t version = 0;
  static size_t live_bytes();  // bytes held by all storages: lets tests check memory stays flat
  static size_t peak_live_bytes();  // the most live_bytes() has been since reset_peak_live_bytes()
  static void reset_peak_live_bytes();
  static size_t cached_bytes();  // freed big blocks kept for reuse (not counted in live_bytes)
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape, strides;
  DType dtype = DType::f32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient (leaves only)
  // Tape position of the op that produced this tensor; -1 for leaves.
  int64_t tape_index = -1;
  uint64_t tape_epoch = 0;
  int tape_slot = 0;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // Fresh contiguous, uninitialised storage.
  static Tensor empty(const Shape& shape, DType dt = DType::f32);
  // A view on another tensor's storage.
  static Tensor view_of(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  int64_t dim() const { return (int64_t)impl_->shape.size(); }
  int64_t size(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  bool is_contiguous() const;
  bool same_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }

  // Typed pointer to element 0 of this view; throws if T does not match the dtype.
  template <class T>
  T* data() const;
  void* raw() const;

  // Scalar value of a one-element tensor, converted to double.
  double item() const;
  // Copy of the elements in row-major order, converted to T.
  template <class T>
  std::vector<T> to_vector() const;

  // ---- autograd ----
  bool requires_grad() const { return impl_->requires_grad; }
  // Marks a leaf as a parameter whose gradient should be accumulated.
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const { return impl_->tape_index < 0; }
  Tensor grad() const;
  void set_grad(const Tensor& g);
  void zero_grad();  // drops the accumulated gradient
  // Same storage, cut from the tape: no gradient flows through it.
  Tensor detach() const;
  // Reverse-mode pass from this tensor; a non-scalar needs an explicit upstream gradient.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  // In-place writes must call this so the tape can detect stale saved tensors.
  void bump_version() const { ++impl_->storage->version; }
  uint64_t version() const { return impl_->storage->version; }

  std::string str(int max_elems = 16) const;  // "Tensor f32 (2, 3) [..]"

 private:
  std::shared_ptr<TensorImpl> impl_;
};
using Tensors = std::vector<Tensor>;

std::string describe(const Tensor& t);  // "f32 (2, 3)"
std::string describe(DType dt, const Shape& shape);

// ---- seedable random numbers ----
// splitmix64 counter stream: the same seed gives the same numbers whatever the thread count,
// because every fill walks the elements in order on one thread.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0x9E3779B97F4A7C15ull) : state_(seed) {}
  uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();   // standard normal (Box-Muller, no cached second value: state is one word)
  uint64_t below(uint64_t n);  // unbiased integer in [0, n)
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};
Generator& default_generator();
void manual_seed(uint64_t seed);

// ---- creation ----
Tensor zeros(const Shape& shape, DType dt = DType::f32);
Tensor ones(const Shape& shape, DType dt = DType::f32);
Tensor full(const Shape& shape, double value, DType dt = DType::f32);
Tensor arange(double start, double end, double step = 1.0, DType dt = DType::f32);
Tensor arange(int64_t n, DType dt = DType::i64);
Tensor scalar(double value, DType dt = DType::f32);
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dt);
Tensor from_vector(const std::vector<float>& values, const Shape& shape);
Tensor from_vector(const std::vector<double>& values, const Shape& shape);
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape);
Tensor rand(const Shape& shape, DType dt = DType::f32, Generator& gen = default_generator(),
            double lo = 0.0, double hi = 1.0);
Tensor randn(const Shape& shape, DType dt = DType::f32, Generator& gen = default_generator(),
             double mean = 0.0, double std = 1.0);

// Copies without recording on the tape (the autograd-aware versions live in ops/shape.h).
Tensor contiguous_copy(const Tensor& t);       // always a fresh contiguous tensor
Tensor cast_copy(const Tensor& t, DType dt);   // fresh contiguous tensor of another dtype
void copy_into(const Tensor& dst, const Tensor& src);  // same shape, any strides and dtypes
// dst += src, same shape; dst contiguous. Used to accumulate gradients.
void accumulate_into(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& t, double value);  // in place; bumps the version
// Sum of a float x over `axes` (sorted, distinct), kept as size-1 dims, times scale: a fresh
// contiguous tensor, not recorded. Parallel over output elements, each summed in index order, so
// the result does not depend on the thread count. The reduce ops and the tape both use it.
Tensor sum_axes(const Tensor& x, const std::vector<int64_t>& axes, double scale = 1.0);
// x summed down to `shape`, which must broadcast to x's shape; not recorded. The tape uses it to
// reduce a gradient of a broadcast shape to its input's shape.
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

// Visits every element offset (in elements, relative to data<T>()) of a strided view in
// row-major order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, F&& f) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  const size_t r = shape.size();
  if (r == 0) {
    f(int64_t(0));
    return;
  }
  std::vector<int64_t> idx(r, 0);
  int64_t off = 0;
  const int64_t inner = shape[r - 1], inner_stride = strides[r - 1];
  for (int64_t done = 0; done < n; done += inner) {
    for (int64_t i = 0; i < inner; ++i) f(off + i * inner_stride);
    for (size_t d = r - 1; d-- > 0;) {
      off += strides[d];
      if (++idx[d] < shape[d]) break;
      off -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

// Calls f.template operator()<T>() with T the C++ type of a floating dtype.
#define GRAFT_DISPATCH_FLOAT(dt, opname, ...)                                          \
  [&] {                                                                                \
    if ((dt) == ::graft::DType::f32) {                                                 \
      using T = float;                                                                 \
      return __VA_ARGS__();                                                            \
    } else if ((dt) == ::graft::DType::f64) {                                          \
      using T = double;                                                                \
      return __VA_ARGS__();                                                            \
    }                                                                                  \
    ::graft::fail(std::string(opname) + ": expected a float32 or float64 tensor, got " + \
                  ::graft::dtype_name(dt));                                            \
  }()

}  // namespace graft
