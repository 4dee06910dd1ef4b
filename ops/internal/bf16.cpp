#include "ops/internal/bf16.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

#include "graft/ops/precision.h"
#include "ops/internal/kernels.h"

namespace graft::kern {

bool dense_span(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.shape()[d] != 1) dims.push_back({t.strides()[d], t.shape()[d]});
  std::sort(dims.begin(), dims.end());
  int64_t expect = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expect) return false;
    expect *= size;
  }
  return true;
}

namespace {
// A transpose view of rows that are contiguous (K^T of a KV cache's first T positions): its
// copy is written in the source's row order and read through swapped strides.
bool transposed_rows(const Tensor& t) {
  const int64_t r = t.dim();
  return r >= 2 && t.strides()[r - 1] != 1 && t.strides()[r - 2] == 1 && t.shape()[r - 1] > 1;
}
Shape swapped_last2(Shape s) {
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}
// t with its last two dims swapped, as a view (no copy).
Tensor swapped_view(const Tensor& t) {
  return view_as(t, swapped_last2(t.shape()), swapped_last2(t.strides()));
}
}  // namespace

Shape bf16_strides(const Tensor& t) {
  if (dense_span(t)) return t.strides();
  if (transposed_rows(t)) return swapped_last2(contiguous_strides(swapped_last2(t.shape())));
  return contiguous_strides(t.shape());
}

namespace {

// Writes conv(x) for every element x of t: in storage order over its span when `span`, else in
// row-major order of t's shape.
template <class Out, class Conv>
void convert(const Tensor& t, bool span, Out* dst, Conv conv) {
  const float* src = t.data<const float>();
  const int64_t n = t.numel();
  if (span) {
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = conv(src[i]);
  } else if (t.dim() >= 2 && t.strides().back() == 1) {
    // Rows of a view (a KV cache's first T positions, a head-split slice): each row is
    // contiguous, so rows are converted in parallel, each by a vectorised loop.
    const int64_t cols = t.shape().back(), rows = n / std::max<int64_t>(cols, 1);
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* s = src + run_offset(t.shape(), t.strides(), r, 0);
      Out* o = dst + r * cols;
      for (int64_t c = 0; c < cols; ++c) o[c] = conv(s[c]);
    }
  } else {
    for_each_strided(t.shape(), t.strides(), [&](int64_t i, int64_t o) { dst[i] = conv(src[o]); });
  }
}

std::atomic<uint64_t> weight_copies{0};

// The copy of t's span (`rounded`: float32 values, else bf16 bits), from derived_copy() when
// `reuse`. A kept weight copy refuses a weight bf16 cannot hold (check_weight_finite).
template <class Make>
std::shared_ptr<Storage> span_copy(const Tensor& t, bool rounded, bool reuse, bool weight,
                                   Make make) {
  if (!reuse) return make();
  return derived_copy(t, rounded ? 1 : 0, [&] {
    if (weight) check_weight_finite(t, "bf16 matmul", true);
    if (weight) ++weight_copies;
    return make();
  });
}

// Per-thread buffers for the two operands of one matmul: an operand converted just before its
// matmul and dead after it is written into its slot's buffer, kept from call to call, since
// fresh pages (faulted in and zeroed by the kernel) cost more than the conversion itself.
std::shared_ptr<Storage> scratch(int slot, size_t bytes) {
  thread_local std::shared_ptr<Storage> buf[kHalfOut + 1];
  std::shared_ptr<Storage>& s = buf[slot];
  if (!s || s->nbytes < bytes || s.use_count() > 1)  // too small, or still held by someone
    s = std::make_shared<Storage>(std::max(bytes, s ? s->nbytes + s->nbytes / 4 : 0));
  return s;
}

// What each slot's buffer holds, when a Bf16ReuseScope is open: the span of which storage, in
// which buffer.
struct SlotMemo {
  const Storage* source = nullptr;
  int64_t offset = 0, numel = 0;
  const void* buffer = nullptr;
};
thread_local int reuse_scopes = 0;
thread_local SlotMemo slot_memo[2];

}  // namespace

Bf16ReuseScope::Bf16ReuseScope() {
  if (reuse_scopes++ == 0) slot_memo[0] = slot_memo[1] = SlotMemo{};
}
Bf16ReuseScope::~Bf16ReuseScope() {
  if (--reuse_scopes == 0) slot_memo[0] = slot_memo[1] = SlotMemo{};
}

uint64_t bf16_weight_copies() { return weight_copies; }
void count_bf16_weight_copy() { ++weight_copies; }

Bf16Operand to_bf16(const Tensor& t, bool contiguous, bool reuse, int slot, bool weight) {
  const bool span = !contiguous && dense_span(t);
  const bool swap = !contiguous && !span && transposed_rows(t);
  Bf16Operand out;
  out.shape = t.shape();
  out.strides = contiguous ? contiguous_strides(t.shape()) : bf16_strides(t);
  const size_t bytes = (size_t)std::max<int64_t>(t.numel(), 1) * 2;
  auto fill = [&](const std::shared_ptr<Storage>& s) {
    convert(swap ? swapped_view(t) : t, span, static_cast<uint16_t*>(s->data),
            [](float x) { return bf16_bits(x); });
    return s;
  };
  if (reuse && span) {
    out.storage =
        span_copy(t, false, true, weight, [&] { return fill(std::make_shared<Storage>(bytes)); });
    return out;
  }
  std::shared_ptr<Storage> buf = scratch(slot, bytes);
  const SlotMemo want{span && reuse_scopes > 0 ? t.impl()->storage.get() : nullptr, t.offset(),
                      t.numel(), buf->data};
  SlotMemo& memo = slot_memo[slot];
  const bool same = want.source && memo.source == want.source && memo.offset == want.offset &&
                    memo.numel == want.numel && memo.buffer == want.buffer;
  out.storage = same ? buf : fill(buf);
  memo = want;
  return out;
}

namespace {
// The kept copies alive, by the view they were made from, so that ops reading the same activation
// (q, k and v as one tensor; one input to several linears) keep one copy between them. Weak: an
// entry lives while some tape entry holds its copy.
struct KeptKey {
  const Storage* source;
  int64_t offset;
  Shape shape, strides;
  auto operator<=>(const KeptKey&) const = default;
};
struct KeptEntry {
  std::weak_ptr<Storage> source, copy;
  uint64_t version = 0;
};
std::mutex kept_mutex;
std::map<KeptKey, KeptEntry>& kept_copies() {
  static auto* m = new std::map<KeptKey, KeptEntry>;  // never destroyed: storages may outlive it
  return *m;
}
}  // namespace

Bf16Operand kept_bf16(const Tensor& t) {
  Bf16Operand out;
  out.shape = t.shape();
  out.strides = contiguous_strides(t.shape());
  const std::shared_ptr<Storage>& src = t.impl()->storage;
  const KeptKey key{src.get(), t.offset(), t.shape(), t.strides()};
  std::lock_guard<std::mutex> lock(kept_mutex);
  auto& copies = kept_copies();
  auto it = copies.find(key);
  if (it != copies.end() && it->second.source.lock() == src && it->second.version == src->version)
    if ((out.storage = it->second.copy.lock())) return out;
  std::erase_if(copies, [](const auto& kv) {
    return kv.second.copy.expired() || kv.second.source.expired();
  });
  out.storage = std::make_shared<Storage>((size_t)std::max<int64_t>(t.numel(), 1) * 2);
  convert(t, t.is_contiguous(), static_cast<uint16_t*>(out.storage->data),
          [](float x) { return bf16_bits(x); });
  copies[key] = KeptEntry{src, out.storage, src->version};
  return out;
}

bool bf16_kernel_in_force() {
  return matmul_precision() == Precision::bf16 && bf16_path() == Bf16Path::onednn;
}

bool keep_bf16_of(const Tensor& x) {
  // A leaf is held by its owner anyway: a copy would only add memory.
  return x.dtype() == DType::f32 && bf16_kernel_in_force() && !x.is_leaf() &&
         x.impl()->storage->saved_by_tape == 0;
}

namespace {
// A tensor of `dtype` over storage s at offset 0.
Tensor tensor_over(std::shared_ptr<Storage> s, const Shape& shape, const Shape& strides,
                   DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(s);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(impl);
}

// float32 of 16-bit H bits, in chunks (the array form of half.h vectorises).
template <class H>
void widen(const Tensor& t, bool span, float* dst) {
  const H* src = t.data<const H>();
  const int64_t n = t.numel();
  if (span) {
    constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; i += kChunk) to_float(src + i, dst + i, std::min(kChunk, n - i));
  } else {
    for_each_strided(t.shape(), t.strides(),
                     [&](int64_t i, int64_t o) { dst[i] = static_cast<float>(src[o]); });
  }
}
}  // namespace

Tensor half_to_f32(const Tensor& t, int slot, bool values) {
  const bool span = dense_span(t);
  std::shared_ptr<Storage> buf = scratch(slot, (size_t)std::max<int64_t>(t.numel(), 1) * 4);
  float* dst = static_cast<float*>(buf->data);
  if (values && t.dtype() == DType::bf16) widen<bfloat16>(t, span, dst);
  else if (values) widen<float16>(t, span, dst);
  return tensor_over(buf, t.shape(), span ? t.strides() : contiguous_strides(t.shape()),
                     DType::f32);
}

void store_rounded(const Tensor& src, const Tensor& out) {
  const float* s = src.data<const float>();
  const int64_t n = out.numel();
  constexpr int64_t kChunk = 1 << 14;
  const bool bf16 = out.dtype() == DType::bf16;
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    if (bf16) from_float(s + i, out.data<bfloat16>() + i, m);
    else from_float(s + i, out.data<float16>() + i, m);
  }
}

Tensor as_bf16_tensor(const Bf16Operand& k) {
  return tensor_over(k.storage, k.shape, k.strides, DType::bf16);
}

Tensor rounded_to_bf16(const Tensor& t, bool reuse, bool weight) {
  const bool span = dense_span(t);
  const Shape strides = span ? t.strides() : contiguous_strides(t.shape());
  auto make = [&] {
    auto s = std::make_shared<Storage>((size_t)std::max<int64_t>(t.numel(), 1) * 4);
    convert(t, span, static_cast<float*>(s->data),
            [](float x) { return bf16_to_float(bf16_bits(x)); });
    return s;
  };
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = span_copy(t, true, reuse && span, weight, make);
  impl->shape = t.shape();
  impl->strides = strides;
  impl->dtype = DType::f32;
  return Tensor(impl);
}

}  // namespace graft::kern
