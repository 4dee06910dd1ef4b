/// @file
/// Tensor: an N-d array handle (float32, float64, int64, bfloat16 or float16) with shape, strides
/// and a shared storage, plus the autograd fields (requires_grad, grad, the tape entry that
/// produced it); dtypes and shapes, the library's Error, seeded random numbers, creation and raw
/// copies.
///
/// Views (reshape of contiguous data, permute/transpose, slice) share storage; every in-place
/// write bumps the storage's version counter so the tape can detect a saved tensor that changed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "graft/autograd/half.h"

/// graft: tensors, autograd, ops, layers and models. The autograd layer and the ops live in
/// this namespace itself; nn and models in graft::nn and graft::models.
namespace graft {

/// Element type of a tensor: f32 (float), f64 (double: the reference precision of gradcheck),
/// i64 (int64_t: token ids, indices; never requires grad), bf16 (bfloat16) or f16 (float16): the
/// 16-bit storage types of half.h, computed in float32 (docs/mixed-precision.md), or i8 (int8_t:
/// stored int8 weights, such as a safetensors file's I8 tensors; never requires grad, no op
/// computes in it: cast_copy() it to a float dtype, values -128..127 exactly).
enum class DType { f32, f64, i64, bf16, f16, i8 };
/// Bytes per element: 4 for f32, 8 for f64 and i64, 2 for bf16 and f16, 1 for i8.
size_t dtype_size(DType dt);
/// The dtype as text: "float32", "float64", "int64", "bfloat16", "float16" or "int8".
const char* dtype_name(DType dt);
/// The short name used in messages and by describe(): "f32", "f64", "i64", "bf16", "f16" or "i8".
const char* dtype_short_name(DType dt);
/// The dtype named `name`: a short name ("bf16") or the long one ("bfloat16").
/// @throws graft::Error "<what>: unknown dtype '<name>' (...)" for any other name.
DType parse_dtype(const std::string& name, const std::string& what);
/// True for the float dtypes (f32, f64, bf16, f16): those that can carry gradients.
inline bool is_floating(DType dt) { return dt != DType::i64 && dt != DType::i8; }
/// True for the 16-bit float dtypes (bf16, f16), stored in 16 bits and computed in float32.
inline bool is_half(DType dt) { return dt == DType::bf16 || dt == DType::f16; }

/// Sizes of a tensor's dimensions, outermost first; {} is a scalar (0-d).
using Shape = std::vector<int64_t>;
/// A shape as text, such as "(2, 3)"; "()" for a scalar.
std::string shape_str(const Shape& s);
/// Number of elements (1 for a scalar).
/// @throws graft::Error when a dimension is negative or the product exceeds 2^63 - 1.
int64_t shape_numel(const Shape& s);
/// a * b, for counts (elements, parameters, bytes) that must not wrap.
/// @throws graft::Error "<what>: the count overflows int64" when the result does not fit int64.
int64_t checked_mul(int64_t a, int64_t b, const char* what);
/// a + b with the same overflow check as checked_mul().
/// @throws graft::Error "<what>: the count overflows int64" when the result does not fit int64.
int64_t checked_add(int64_t a, int64_t b, const char* what);
/// Row-major strides (in elements) of a contiguous tensor of shape `s`: (2, 3, 4) -> (12, 4, 1).
/// @throws graft::Error when a stride overflows int64.
Shape contiguous_strides(const Shape& s);
/// A contiguous shape read as (outer, n, inner) around the axes [first, last]: outer = product of
/// the dims before first, n = product of first..last, inner = product of the dims after last.
/// The form every reduction and axis op loops over.
struct Split3 {
  /// The three products; a part with no dims gives 1.
  ///@{
  int64_t outer = 1, n = 1, inner = 1;
  ///@}
};
/// `s` split as (outer, n, inner) around the axes [first, last]; see Split3. The axes must
/// already be normalised (non-negative); they are not checked.
Split3 split3(const Shape& s, int64_t first, int64_t last);
/// `s` split around the single (non-negative) axis `axis`: split3(s, axis, axis).
inline Split3 split3(const Shape& s, int64_t axis) { return split3(s, axis, axis); }
/// True when `from` broadcasts to `to` (NumPy rules: align right, each dim equal or 1).
bool broadcasts_to(const Shape& from, const Shape& to);

/// Every error the library raises on bad input: the message names the op and the shapes,
/// as in "matmul: (2, 3) @ (4, 5): inner dims 3 != 4".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// Throws graft::Error with message `msg`; the one place the library raises its errors.
/// @throws graft::Error always.
[[noreturn]] void fail(const std::string& msg);
class Tensor;
/// Normalises a possibly negative axis against a rank (-1 is the last axis). With `input`, the
/// error names the input (its dtype and shape) rather than the rank alone.
/// @throws graft::Error "<op>: axis a out of range for rank r" (or "... for input <describe>")
///         unless -rank <= axis < rank.
int64_t norm_axis(const char* op, int64_t axis, int64_t rank, const Tensor* input = nullptr);

/// Raw, 64-byte aligned memory shared by a tensor and all its views. The version counter is
/// shared by all views of the storage.
struct Storage {
  /// Allocates `nbytes` uninitialised bytes (big blocks are reused from a process-wide cache),
  /// counted in live_bytes() unless `counted` is false (host_block()).
  /// @throws std::bad_alloc when the memory cannot be had.
  explicit Storage(size_t nbytes, bool counted = true);
  /// Returns the memory (big blocks to the cache).
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;  ///< the first byte (64-byte aligned)
  size_t nbytes = 0;     ///< bytes requested
  size_t capacity = 0;   ///< bytes actually allocated (>= nbytes; big blocks come from a cache)
  uint64_t version = 0;  ///< bumped by every in-place write through any view (Tensor::bump_version)
  /// How many live tape entries save a tensor of this storage: an op may keep a smaller copy of an
  /// input for its backward instead of the input itself only when no other entry keeps it anyway.
  std::atomic<uint32_t> saved_by_tape{0};
  /// Set on the storage of a copy made off the tape (contiguous_copy(), cast_copy(),
  /// kern::contig()): the storages it was copied from, the nearest first (a copy of a copy names
  /// both, since the one between may be gone by the time the tape looks). An op that saves such a
  /// copy of an input that requires grad loses that input's second derivative, so backward under
  /// create_graph refuses it (autograd/tape.h, record()). Empty for any other storage.
  std::vector<std::weak_ptr<Storage>> copied_from;
  /// The helper that made the copy ("contiguous_copy", "kern::contig", ...), for that error.
  const char* copied_by = nullptr;
  /// Set by release(): why the bytes are gone (an int8 inference model frees the float32 weights
  /// of its quantized linears). Empty while the storage holds its bytes.
  std::string released;
  /// Gives the bytes back (data becomes null, live_bytes() drops; nbytes stays, for views' checks)
  /// for a form of them that replaces them elsewhere; Tensor::data() and Tensor::raw() on any view
  /// then fail with `why`, which should name the tensor and what freed it. Releasing twice keeps
  /// the first why. Not while another thread reads the bytes: the owner releases a weight it no
  /// longer runs on.
  void release(const std::string& why);
  /// Copies the bytes to `offset` bytes into `into` (64-byte aligned, the nbytes inside it) and
  /// gives its own back: every view of this storage then reads and writes those bytes, and the
  /// storage keeps `into` alive (host). Its nbytes stay in live_bytes() until it goes or is
  /// released. Weights gathered into one block on 2 MiB pages for inference use it
  /// (kern::keep_together). Fails on a released storage, a misaligned or out-of-range offset, or
  /// one moved already. Not while another thread reads the bytes.
  void move_into(const std::shared_ptr<Storage>& into, size_t offset);
  /// A block for move_into(): its own bytes do not count in live_bytes() (those moved into it
  /// count as their storages' bytes), so gathering weights does not count them twice.
  /// @throws std::bad_alloc when the memory cannot be had.
  static std::shared_ptr<Storage> host_block(size_t nbytes);
  /// Set by move_into(): the storage whose bytes this one's are (null: its own).
  std::shared_ptr<Storage> host;
  bool counted = true;         ///< whether nbytes count in live_bytes() (false: a host_block)
  static size_t live_bytes();  ///< bytes held by all storages: lets tests check memory stays flat
  static size_t
  peak_live_bytes();  ///< the most live_bytes() has been since reset_peak_live_bytes()
  /// Starts a new peak measurement at the current live_bytes().
  static void reset_peak_live_bytes();
  static size_t cached_bytes();  ///< freed big blocks kept for reuse (not counted in live_bytes)
  /// Returns every cached big block to the OS (after loading a model, or a phase whose sizes
  /// will not come again) and lowers the cache's bound by as much; returns the bytes unmapped.
  static size_t release_cached();
};

namespace autograd {
struct TapeAccess;
}

/// Where the op that produced a tensor sits on a tape; autograd's alone (private to TensorImpl).
struct TapeLink {
  int64_t index = -1;  ///< tape position of the producing op; -1 for leaves
  /// Which thread's tape `index` refers to: each thread's tape has an id of its own, never
  /// reused (see autograd/tape.h on graphs and threads).
  uint64_t tape_id = 0;
  uint64_t epoch = 0;  ///< which tape generation `index` refers to (clear_tape() starts one)
  int slot = 0;        ///< which output of its tape entry this tensor is
};

/// The state behind a Tensor handle, shared by the handles that copy it. Library code reads it
/// through Tensor's accessors; its place on the tape is autograd's (private).
struct TensorImpl {
  std::shared_ptr<Storage> storage;  ///< the memory, shared with every view
  int64_t offset = 0;                ///< in elements
  /// Layout: the size and the stride (in elements) of each dimension.
  ///@{
  Shape shape, strides;
  ///@}
  DType dtype = DType::f32;    ///< element type
  bool requires_grad = false;  ///< a gradient is wanted (leaf) or flows through it (op output)
  std::shared_ptr<TensorImpl> grad;  ///< accumulated gradient (leaves, and retain_grad() outputs)
  /// Whether a recorded op produced this tensor (false for leaves).
  bool recorded() const { return tape_.index >= 0; }

 private:
  friend struct autograd::TapeAccess;
  TapeLink tape_;
};

/// An N-d array handle: shape, strides, dtype and a shared Storage, plus the autograd state.
/// Copying a Tensor copies the handle (both name the same data); views share storage. A
/// default-constructed Tensor is undefined (defined() is false): as in PyTorch, every accessor
/// other than defined(), impl() and impl_ptr() throws graft::Error on it, naming the accessor
/// ("Tensor::shape: called on an undefined tensor"); ops name the argument (check_defined()).
class Tensor {
 public:
  /// An undefined tensor ("none": an absent optional input, a missing gradient).
  Tensor() = default;
  /// A handle on existing state.
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  /// Fresh contiguous, uninitialised storage.
  /// @throws graft::Error when a dimension is negative, the size overflows, or the memory
  ///         cannot be allocated.
  static Tensor empty(const Shape& shape, DType dt = DType::f32);
  /// A view on another tensor's storage (same dtype); `strides` and `offset` in elements.
  /// Records nothing on the tape: the autograd-aware views are in ops/shape.h.
  /// @throws graft::Error when `base` is undefined, shape and strides differ in rank or the
  ///         view reaches outside the storage.
  static Tensor view_of(const Tensor& base, const Shape& shape, const Shape& strides,
                        int64_t offset);

  bool defined() const { return impl_ != nullptr; }  ///< false for a default-constructed tensor
  TensorImpl* impl() const { return impl_.get(); }   ///< the shared state (null when undefined)
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }  ///< the owning pointer

  // Every accessor below throws graft::Error "Tensor::<name>: called on an undefined tensor"
  // when the tensor is undefined.
  const Shape& shape() const { return state("shape").shape; }        ///< size of each dimension
  const Shape& strides() const { return state("strides").strides; }  ///< in elements, per dimension
  int64_t offset() const { return state("offset").offset; }          ///< of element 0, in elements
  int64_t dim() const { return (int64_t)state("dim").shape.size(); }  ///< the rank (0 for a scalar)
  /// Size of one dimension; negative axes count from the end.
  /// @throws graft::Error when the axis is out of range.
  int64_t size(int64_t axis) const;
  int64_t numel() const { return shape_numel(state("numel").shape); }  ///< number of elements
  DType dtype() const { return state("dtype").dtype; }                 ///< element type
  /// True when the elements lie in row-major order without gaps (size-1 dims may have any stride).
  bool is_contiguous() const;
  /// True when both tensors view the same Storage (possibly different parts of it).
  bool same_storage(const Tensor& o) const {
    return state("same_storage").storage == o.state("same_storage").storage;
  }

  /// Typed pointer to element 0 of this view (T float, double, int64_t, bfloat16, float16 or
  /// int8_t, optionally const);
  /// index it with the strides.
  /// @throws graft::Error when T does not match the dtype.
  template <class T>
  T* data() const;
  /// Untyped pointer to element 0 of this view.
  void* raw() const;

  /// Scalar value of a one-element tensor, converted to double.
  /// @throws graft::Error when the tensor is undefined or does not have exactly one element.
  double item() const;
  /// Copy of the elements in row-major order, converted to T (float, double or int64_t; any
  /// dtype, int8 included).
  template <class T>
  std::vector<T> to_vector() const;

  /// True for a leaf that wants a gradient, or an op output that a gradient flows through.
  bool requires_grad() const { return state("requires_grad").requires_grad; }
  /// Marks a leaf as a parameter whose gradient should be accumulated (or, with false, stops it).
  /// @throws graft::Error for an undefined or integer (int64, int8) tensor, or for a tensor an
  ///         op on the tape produced (detach() it first).
  Tensor& requires_grad_(bool on = true);
  /// True when no op on the tape produced this tensor.
  bool is_leaf() const { return !state("is_leaf").recorded(); }
  /// The gradient accumulated by backward(): a leaf's, or a non-leaf's that called
  /// retain_grad(); undefined when none arrived yet (always, for other non-leaves).
  /// @throws graft::Error when the tensor itself is undefined.
  Tensor grad() const;
  /// Keeps this non-leaf's gradient: every later backward() that reaches it adds dL/dt to
  /// grad() (they accumulate, as a leaf's do; zero_grad() drops it). A no-op on a leaf that
  /// requires grad. As torch.Tensor.retain_grad. Tensors that do not ask cost nothing.
  /// @throws graft::Error when the tensor is undefined, does not require grad, was recorded on
  ///         another thread's tape, or its tape entry was already freed by a backward().
  void retain_grad() const;
  /// Replaces the accumulated gradient (an undefined `g` drops it).
  /// @throws graft::Error when `g` does not have this tensor's shape and dtype.
  void set_grad(const Tensor& g);
  void zero_grad();  ///< drops the accumulated gradient (grad() becomes undefined)
  /// Same storage, cut from the tape: no gradient flows through it.
  /// @throws graft::Error when the tensor is undefined.
  Tensor detach() const;
  /// Reverse-mode pass from this tensor (autograd::backward()); a non-scalar needs an explicit
  /// upstream gradient of its shape and dtype. Without retain_graph each tape entry is freed
  /// once its backward has run, so a second backward through it is an error.
  /// @throws graft::Error when this tensor is undefined, was recorded on another thread's tape
  ///         (autograd/tape.h), or does not require grad, `grad` is missing or does not
  ///         match, a saved tensor was modified in place since the forward, or an entry was
  ///         already freed.
  /// With create_graph the backward is recorded and the graph kept (see autograd::backward()).
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false,
                bool create_graph = false) const;

  /// In-place writes must call this so the tape can detect stale saved tensors.
  void bump_version() const { ++state("bump_version").storage->version; }
  /// The storage's version counter (shared by all views).
  uint64_t version() const { return state("version").storage->version; }

  /// For printing: dtype, shape and the first `max_elems` values, such as
  /// "Tensor f32 (2, 3) [1, 2, ...]".
  /// @throws graft::Error when the tensor is undefined.
  std::string str(int max_elems = 16) const;

 private:
  /// The state behind a defined handle; `accessor` names the caller in the error otherwise.
  TensorImpl& state(const char* accessor) const {
    if (!impl_) [[unlikely]]
      undefined_access(accessor);
    return *impl_;
  }
  /// @throws graft::Error "Tensor::<accessor>: called on an undefined tensor", always.
  [[noreturn]] static void undefined_access(const char* accessor);
  std::shared_ptr<TensorImpl> impl_;
};
/// A list of tensors: op inputs and outputs, gradients, parameters.
using Tensors = std::vector<Tensor>;

/// dtype and shape for messages, such as "f32 (2, 3)"; "undefined tensor" when `t` is undefined.
std::string describe(const Tensor& t);
/// The one check of a tensor argument that must be defined, such as check_defined(cond, "where",
/// "the condition").
/// @throws graft::Error "<op>: <what> is an undefined tensor" when `t` is undefined.
void check_defined(const Tensor& t, const char* op, const char* what);
/// dtype and shape for messages, such as "f32 (2, 3)".
std::string describe(DType dt, const Shape& shape);

// ---- seedable random numbers ----
/// splitmix64's finaliser: 64 bits mixed so that neighbouring inputs give unrelated outputs. The
/// output function of Generator, of the dropout masks' counter stream and of hashed n-grams.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// A seedable random number generator: a splitmix64 counter stream. The same seed gives the
/// same numbers whatever the thread count, because every fill walks the elements in order on
/// one thread. Its whole state is one word (state()/set_state() save and restore it exactly).
class Generator {
 public:
  /// A generator starting from `seed`.
  explicit Generator(uint64_t seed = 0x9E3779B97F4A7C15ull) : state_(seed) {}
  uint64_t next_u64();  ///< the next 64 random bits
  double uniform();     ///< uniform in [0, 1), 53 random bits
  double normal();      ///< standard normal (Box-Muller, no cached second value: state is one word)
  /// Unbiased integer in [0, n) (rejection sampling, no modulo bias).
  /// @throws graft::Error when n is 0.
  uint64_t below(uint64_t n);
  uint64_t state() const { return state_; }   ///< the whole state, to save
  void set_state(uint64_t s) { state_ = s; }  ///< restores a state from state()

 private:
  uint64_t state_;
};
/// The process-wide generator (seed 42) that creation and layers use when given none. Not
/// synchronised: draw from it on one thread at a time.
Generator& default_generator();
/// Restarts default_generator() from `seed`.
void manual_seed(uint64_t seed);

// ---- creation ----
/// A fresh tensor of zeros.
/// @throws graft::Error for a negative dimension or a size that overflows.
Tensor zeros(const Shape& shape, DType dt = DType::f32);
/// A fresh tensor of ones.
/// @throws graft::Error for a negative dimension or a size that overflows.
Tensor ones(const Shape& shape, DType dt = DType::f32);
/// A fresh tensor with every element `value` (converted to dt).
/// @throws graft::Error for a bad shape, or a value that does not fit an int64 tensor.
Tensor full(const Shape& shape, double value, DType dt = DType::f32);
/// start, start + step, ... (< end for a positive step, > end for a negative one): a 1-D tensor
/// of ceil((end - start) / step) elements, or none.
/// @throws graft::Error when step is 0, or a value does not fit an int64 tensor.
Tensor arange(double start, double end, double step = 1.0, DType dt = DType::f32);
/// 0, 1, ..., n - 1 as a 1-D tensor (int64 by default).
Tensor arange(int64_t n, DType dt = DType::i64);
/// A 0-d tensor holding `value`.
Tensor scalar(double value, DType dt = DType::f32);
/// A fresh tensor of `shape` and dtype `dt` filled from `values` in row-major order (T float,
/// double, int64_t or int; integer values into int64 are exact beyond 2^53).
/// @throws graft::Error when values.size() is not the number of elements of `shape`, or a
///         value does not fit an int64 tensor.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dt);
/// A float32 tensor from `values` (row-major).
/// @throws graft::Error when values.size() does not match `shape`.
Tensor from_vector(const std::vector<float>& values, const Shape& shape);
/// A float64 tensor from `values` (row-major).
/// @throws graft::Error when values.size() does not match `shape`.
Tensor from_vector(const std::vector<double>& values, const Shape& shape);
/// An int64 tensor from `values` (row-major).
/// @throws graft::Error when values.size() does not match `shape`.
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape);
/// Uniform in [lo, hi), drawn from `gen` in element order.
/// @throws graft::Error for a bad shape.
Tensor rand(const Shape& shape, DType dt = DType::f32, Generator& gen = default_generator(),
            double lo = 0.0, double hi = 1.0);
/// Normal with the given mean and standard deviation, drawn from `gen` in element order.
/// @throws graft::Error for a bad shape.
Tensor randn(const Shape& shape, DType dt = DType::f32, Generator& gen = default_generator(),
             double mean = 0.0, double std = 1.0);

// Copies without recording on the tape (the autograd-aware versions live in ops/shape.h).
/// A fresh contiguous copy of `t`, not recorded on the tape (ops/shape.h has contiguous()).
/// @throws graft::Error when `t` is undefined.
Tensor contiguous_copy(const Tensor& t);
/// A fresh contiguous copy of `t` converted to `dt`, not recorded (ops/shape.h has to_dtype()).
/// @throws graft::Error when `t` is undefined, or a float value does not fit int64 (NaN, +-inf,
///         out of range).
Tensor cast_copy(const Tensor& t, DType dt);
/// Copies src's elements into dst (same shape, any strides and dtypes), converting; not
/// recorded; bumps dst's version. A source that overlaps dst in memory (a shifted view of the
/// same storage) is read completely before dst is written, as memmove does.
/// @throws graft::Error when either tensor is undefined, the shapes differ, dst has elements
///         that share memory (a broadcast_to view), or a float value does not fit an int64 dst.
void copy_into(const Tensor& dst, const Tensor& src);
/// dst += src, same shape; dst contiguous. Used to accumulate gradients. Not recorded; bumps
/// dst's version.
/// @throws graft::Error unless dst and src are defined, have the same shape and float dtype and
///         dst is contiguous.
void accumulate_into(const Tensor& dst, const Tensor& src);
/// Sets every element of `t` (any strides) to `value`, in place; not recorded; bumps the version.
/// @throws graft::Error when `t` is undefined or `value` does not fit an int64 tensor.
void fill_(const Tensor& t, double value);
/// Sum of a float x over `axes` (sorted, distinct), kept as size-1 dims, times scale: a fresh
/// contiguous tensor, not recorded. Parallel over output elements, each summed in index order, so
/// the result does not depend on the thread count. The reduce ops and the tape both use it.
/// x (...) -> (... with each axis in `axes` of size 1).
/// @throws graft::Error when x is undefined or not float, or `axes` are not sorted, distinct axes
///         of x.
Tensor sum_axes(const Tensor& x, const std::vector<int64_t>& axes, double scale = 1.0);
/// x summed down to `shape`, which must broadcast to x's shape; not recorded. The tape uses it to
/// reduce a gradient of a broadcast shape to its input's shape. Returns x itself when the shapes
/// are equal.
/// @throws graft::Error (naming "sum_to") when x is undefined or `shape` does not broadcast to
///         x's shape.
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

/// Visits every element offset (in elements, relative to data<T>()) of a strided view in
/// row-major order: f(int64_t offset) once per element, nothing for an empty shape.
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

/// Runs the lambda given as the last argument with `T` the C++ type of the floating dtype `dt`
/// (float or double) in scope, and returns its result: write
/// `GRAFT_DISPATCH_FLOAT(x.dtype(), "myop", [&] { loop<T>(x); });`.
/// @throws graft::Error "<opname>: expected a float32 or float64 tensor, got int64" otherwise.
#define GRAFT_DISPATCH_FLOAT(dt, opname, ...)                                            \
  [&] {                                                                                  \
    if ((dt) == ::graft::DType::f32) {                                                   \
      using T = float;                                                                   \
      return __VA_ARGS__();                                                              \
    } else if ((dt) == ::graft::DType::f64) {                                            \
      using T = double;                                                                  \
      return __VA_ARGS__();                                                              \
    }                                                                                    \
    ::graft::fail(std::string(opname) + ": expected a float32 or float64 tensor, got " + \
                  ::graft::dtype_name(dt));                                              \
  }()

}  // namespace graft
