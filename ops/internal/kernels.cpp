#include "ops/internal/kernels.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "graft/autograd/tape.h"
#include "graft/ops/precision.h"
#include "ops/internal/bf16.h"
#include "ops/internal/dnnl_utils.h"

namespace graft::kern {

namespace {
std::atomic<uint64_t> f32_detour_count{0};
}  // namespace

uint64_t f32_detours() { return f32_detour_count.load(std::memory_order_relaxed); }
void count_f32_detour() { f32_detour_count.fetch_add(1, std::memory_order_relaxed); }

Tensor widened(const Tensor& t) {
  autograd::NoGrad no_grad;
  return t.defined() ? to_dtype(t.detach(), DType::f32) : t;
}

Tensor narrowed(const Tensor& t, DType dt) {
  autograd::NoGrad no_grad;
  return t.defined() ? to_dtype(t, dt) : t;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(std::string(op) + ": shapes " + shape_str(a) + " and " + shape_str(b) +
           " cannot be broadcast (dim " + std::to_string(i) + ": " + std::to_string(da) + " vs " +
           std::to_string(db) + ")");
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

// ---- views ----------------------------------------------------------------------------------

Tensor view_as(const Tensor& t, const Shape& shape, const Shape& strides) {
  return Tensor::view_of(t, shape, strides, t.offset());
}

Tensor swap_last2(const Tensor& t) {
  Shape s = t.shape(), st = t.strides();
  const size_t r = s.size();
  std::swap(s[r - 1], s[r - 2]);
  std::swap(st[r - 1], st[r - 2]);
  return view_as(t, s, st);
}

Tensor reshaped(const Tensor& t, const Shape& shape) {
  return view_as(t, shape, contiguous_strides(shape));
}

Tensor as_rows(const Tensor& t) {
  const int64_t c = t.shape().back();
  const Shape lead(t.shape().begin(), t.shape().end() - 1);
  return reshaped(t, {shape_numel(lead), c});
}

Tensor row_range(const Tensor& t, int64_t r0, int64_t r1) {
  return Tensor::view_of(t, {r1 - r0, t.size(1)}, t.strides(), t.offset() + r0 * t.strides()[0]);
}

bool batch_is_one(const Tensor& t) {
  for (int64_t d = 0; d + 2 < t.dim(); ++d)
    if (t.shape()[d] != 1) return false;
  return true;
}

bool loop_beats_onednn(int64_t n, bool record) { return !record && n < 4096; }

int64_t merged_row_stride(const Tensor& t) {
  int64_t stride = -1;  // stride of the innermost non-1 dim seen so far
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    const int64_t n = t.shape()[d], s = t.strides()[d];
    if (n == 1) continue;
    if (stride >= 0 && stride != s * n) return -1;
    stride = s;
  }
  // All rows are one row: any stride describes it.
  return stride < 0 ? t.shape().back() : stride;
}

// ---- matmul ---------------------------------------------------------------------------------

namespace {

// b without batch dims and a whose batch rows are evenly spaced: one (B*M, K) @ (K, N) gemm is
// faster than B small ones, so the operands are read that way.
void merge_batch(Tensor& a, Tensor& b, Tensor& out) {
  if (a.dim() <= 2 || !batch_is_one(b)) return;
  const int64_t rs = merged_row_stride(a);
  if (rs < 0) return;
  const int64_t rows = a.numel() / a.shape().back(), K = a.shape().back(), N = b.shape().back();
  a = view_as(a, {rows, K}, {rs, a.strides().back()});
  b = view_as(b, {K, N}, {b.strides()[b.dim() - 2], b.strides().back()});
  out = reshaped(out, {rows, N});
}

bool is_dense(const Shape& shape, const Shape& strides) {
  return onednn::canonical_strides(shape, strides) ==
         onednn::canonical_strides(shape, contiguous_strides(shape));
}

// The element types of a matmul's operands, output and bias.
struct MatmulTypes {
  dnnl::memory::data_type src, dst, bias;
};

// The oneDNN matmul of operands a, b (shapes and strides as, bs) into out; alpha as an output
// scale, accumulate as a sum post-op, and with `bias` a bias of out's last dim added by the kernel
// as it writes out.
onednn::Cached<dnnl::matmul> make_matmul(const Shape& a, const Shape& as, const Shape& b,
                                         const Shape& bs, const Tensor& out, MatmulTypes dt,
                                         float alpha, bool accumulate, bool bias) {
  auto a_md = onednn::md(a, as, dt.src), b_md = onednn::md(b, bs, dt.src),
       o_md = onednn::md(out.shape(), out.strides(), dt.dst);
  Shape bias_shape(out.dim(), 1);
  bias_shape.back() = out.shape().back();
  const auto bias_md =
      bias ? onednn::md(bias_shape, contiguous_strides(bias_shape), dt.bias) : dnnl::memory::desc();
  dnnl::primitive_attr attr = onednn::user_scratchpad();
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  auto desc = [&] {
    return bias ? dnnl::matmul::desc(a_md, b_md, bias_md, o_md)
                : dnnl::matmul::desc(a_md, b_md, o_md);
  };
  dnnl::matmul::primitive_desc pd(desc(), attr, onednn::engine());
  // A strided batch can land on the reference kernel (orders of magnitude slower); dense
  // copies are cheap next to that.
  const bool dense = std::string_view(pd.impl_info_str()).substr(0, 3) == "ref" &&
                     (!is_dense(a, as) || !is_dense(b, bs));
  if (dense) {
    a_md = onednn::md(a, contiguous_strides(a), dt.src);
    b_md = onednn::md(b, contiguous_strides(b), dt.src);
    pd = dnnl::matmul::primitive_desc(desc(), attr, onednn::engine());
  }
  return onednn::Cached<dnnl::matmul>{dnnl::matmul(pd), {a_md, b_md, o_md, bias_md}, dense};
}

// The layout oneDNN is told for an operand: a kept bf16 copy's own, else the tensor's (its
// bf16 copy's strides on the bf16 kernel).
Shape operand_strides(const Operand& o, bool bf16_kernel) {
  if (o.is_kept()) return onednn::canonical_strides(o.kept.shape, o.kept.strides);
  return onednn::canonical_strides(o.f32.shape(),
                                   bf16_kernel ? bf16_strides(o.f32) : o.f32.strides());
}

// A row-major copy of a kept bf16 operand read through other strides (a transpose view).
Bf16Operand dense_bf16(const Bf16Operand& k) {
  Bf16Operand d;
  d.shape = k.shape;
  d.strides = contiguous_strides(k.shape);
  int64_t n = 1;
  for (int64_t s : k.shape) n *= s;
  d.storage = std::make_shared<Storage>((size_t)std::max<int64_t>(n, 1) * 2);
  const uint16_t* src = static_cast<const uint16_t*>(k.data());
  uint16_t* dst = static_cast<uint16_t*>(d.data());
  for_each_strided(k.shape, k.strides, [&](int64_t i, int64_t o) { dst[i] = src[o]; });
  return d;
}

// The operand's bf16 copy for the kernel (slot 0 for a, 1 for b): a kept one as it is, unless
// the primitive needs dense operands and it is a transpose view.
Bf16Operand kernel_bf16(const Operand& o, bool dense, BCopy copy, int slot) {
  if (!o.is_kept())
    return to_bf16(o.f32, dense, copy != BCopy::per_call, slot, copy == BCopy::weight);
  return dense && !is_dense(o.kept.shape, o.kept.strides) ? dense_bf16(o.kept) : o.kept;
}

// float32 through oneDNN matmul, with bf16 operands under PrecisionGuard(bf16) (ops/precision.h):
// oneDNN's bf16 kernel, or the reference path (operands rounded, float32 matmul). A kept bf16
// operand (Operand::kept) is multiplied as it is; it needs the bf16 kernel.
void bmm_f32(Operand a, Operand b, Tensor out, float alpha, bool accumulate, BCopy b_copy,
             const Tensor& bias) {
  if (out.dtype() != DType::f32)
    fail("bmm: float32 operands into " + describe(out) + ": the output must be float32");
  const bool bf16 = matmul_precision() == Precision::bf16;
  const bool bf16_kernel = bf16_kernel_in_force();
  if ((a.is_kept() || b.is_kept()) && !bf16_kernel)
    fail(
        "bmm: a kept bf16 operand needs the oneDNN bf16 path (PrecisionGuard(bf16) on a CPU with a "
        "kernel)");
  if (bf16 && !bf16_kernel) {
    a.f32 = rounded_to_bf16(a.f32, false);
    b.f32 = rounded_to_bf16(b.f32, b_copy != BCopy::per_call, b_copy == BCopy::weight);
  }
  if (!a.is_kept()) a.f32 = onednn::operand(a.f32);
  if (!b.is_kept()) b.f32 = onednn::operand(b.f32);
  if (!a.is_kept() && !b.is_kept()) merge_batch(a.f32, b.f32, out);
  const Shape as = operand_strides(a, bf16_kernel), bs = operand_strides(b, bf16_kernel);
  onednn::Key key{(int64_t)a.shape().size(), accumulate, (int64_t)std::bit_cast<uint32_t>(alpha),
                  bf16_kernel, bias.defined()};
  for (const Shape* v : {&a.shape(), &as, &b.shape(), &bs, &out.shape()})
    key.insert(key.end(), v->begin(), v->end());
  using dnnl_dt = dnnl::memory::data_type;
  const MatmulTypes dt{bf16_kernel ? dnnl_dt::bf16 : dnnl_dt::f32, dnnl_dt::f32, dnnl_dt::f32};
  const auto& c = onednn::cached<dnnl::matmul>(key, [&] {
    return make_matmul(a.shape(), as, b.shape(), bs, out, dt, alpha, accumulate, bias.defined());
  });
  void *pa, *pb;
  Bf16Operand a16, b16;
  if (bf16_kernel) {
    a16 = kernel_bf16(a, c.dense_copy, BCopy::per_call, 0);
    b16 = kernel_bf16(b, c.dense_copy, b_copy, 1);
    pa = a16.data();
    pb = b16.data();
  } else {
    if (c.dense_copy) {
      a.f32 = contiguous_copy(a.f32);
      b.f32 = contiguous_copy(b.f32);
    }
    pa = a.f32.raw();
    pb = b.f32.raw();
  }
  onednn::run(c, {{DNNL_ARG_SRC, c.mds[0], pa},
                  {DNNL_ARG_WEIGHTS, c.mds[1], pb},
                  {DNNL_ARG_DST, c.mds[2], out.raw()},
                  {DNNL_ARG_BIAS, c.mds[3], bias.defined() ? bias.raw() : nullptr}});
}

// ---- 16-bit tensors ----
// A bf16 or f16 tensor is an operand as it is: on a CPU with the dtype's matmul kernel
// (half_kernel_available) oneDNN reads it in place, sums in float32 and writes out in out's
// dtype (the same 16-bit one, or float32); elsewhere the operands are widened to float32 in
// per-thread buffers and the float32 kernel runs. Nothing is kept from call to call.

// t, or a contiguous copy where oneDNN cannot describe it (a broadcast dim, over 12 dims).
Tensor half_operand(const Tensor& t) {
  bool ok = t.dim() <= 12;
  for (int64_t i = 0; i < t.dim(); ++i) ok &= t.strides()[i] != 0 || t.shape()[i] == 1;
  return ok ? t : contiguous_copy(t);
}

void bmm_half_onednn(Tensor a, Tensor b, Tensor out, float alpha, bool accumulate,
                     const Tensor& bias) {
  a = half_operand(a);
  b = half_operand(b);
  merge_batch(a, b, out);
  const Shape as = onednn::canonical_strides(a.shape(), a.strides()),
              bs = onednn::canonical_strides(b.shape(), b.strides());
  // Apart from bmm_f32's keys (0 or 1 in the 4th place).
  onednn::Key key{a.dim(),
                  accumulate,
                  (int64_t)std::bit_cast<uint32_t>(alpha),
                  16 + (int64_t)a.dtype(),
                  bias.defined() ? 1 + (int64_t)bias.dtype() : 0,
                  (int64_t)out.dtype()};
  for (const Shape* v : {&a.shape(), &as, &b.shape(), &bs, &out.shape()})
    key.insert(key.end(), v->begin(), v->end());
  const MatmulTypes dt{
      onednn::data_type(a.dtype()), onednn::data_type(out.dtype()),
      bias.defined() ? onednn::data_type(bias.dtype()) : dnnl::memory::data_type::f32};
  const auto& c = onednn::cached<dnnl::matmul>(key, [&] {
    return make_matmul(a.shape(), as, b.shape(), bs, out, dt, alpha, accumulate, bias.defined());
  });
  if (c.dense_copy) {
    a = contiguous_copy(a);
    b = contiguous_copy(b);
  }
  onednn::run(c, {{DNNL_ARG_SRC, c.mds[0], a.raw()},
                  {DNNL_ARG_WEIGHTS, c.mds[1], b.raw()},
                  {DNNL_ARG_DST, c.mds[2], out.raw()},
                  {DNNL_ARG_BIAS, c.mds[3], bias.defined() ? bias.raw() : nullptr}});
}

// Without the kernel: the float32 matmul on widened operands (and a widened out to accumulate
// into), its result rounded once into a 16-bit out.
void bmm_half_f32(const Tensor& a, const Tensor& b, const Tensor& out, float alpha, bool accumulate,
                  const Tensor& bias) {
  const Tensor af = half_to_f32(a, kHalfA), bf = half_to_f32(b, kHalfB);
  const bool direct = out.dtype() == DType::f32;
  const Tensor of = direct ? out : half_to_f32(out, kHalfOut, /*values=*/accumulate);
  const Tensor bias32 =
      bias.defined() && bias.dtype() != DType::f32 ? cast_copy(bias, DType::f32) : bias;
  {
    PrecisionGuard fp32(Precision::fp32);  // the values are 16-bit already: nothing to round
    bmm_f32(af, bf, of, alpha, accumulate, BCopy::per_call, bias32);
  }
  if (!direct) store_rounded(of, out);
}

// a @ b (+ bias) for 16-bit a and b of one dtype into out of that dtype or float32; bias of
// either too.
void bmm_half(const Tensor& a, const Tensor& b, const Tensor& out, float alpha, bool accumulate,
              const Tensor& bias) {
  const DType dt = a.dtype();
  const bool bias_ok = !bias.defined() || bias.dtype() == dt || bias.dtype() == DType::f32;
  if (b.dtype() != dt || (out.dtype() != dt && out.dtype() != DType::f32) || !bias_ok)
    fail("bmm: dtype mismatch, a " + describe(a) + " @ b " + describe(b) + " into " +
         describe(out) + (bias.defined() ? " + bias " + describe(bias) : std::string()) +
         ": a 16-bit matmul takes operands of one dtype and writes that dtype or float32");
  if (half_kernel_available(dt)) return bmm_half_onednn(a, b, out, alpha, accumulate, bias);
  static std::once_flag said[2];  // the slower path is said once per dtype on stderr
  std::call_once(said[dt == DType::f16], [dt] {
    std::fprintf(stderr, "graft: %s\n", half_matmul_description(dt).c_str());
  });
  bmm_half_f32(a, b, out, alpha, accumulate, bias);
}

bool is_half_tensor(const Operand& o) { return !o.is_kept() && is_half(o.f32.dtype()); }
// The operand as a tensor for bmm_half: a kept bf16 copy as a bf16 tensor.
Tensor half_side(const Operand& o) { return o.is_kept() ? as_bf16_tensor(o.kept) : o.f32; }

// The reference: rows of the output (batch x M) are split over threads; each row is written by
// one thread and accumulated in i-k-j order so the inner loop streams a row of b.
template <class T>
void bmm_loop(const Tensor& a, const Tensor& b, const Tensor& out, T alpha, bool accumulate) {
  const int64_t r = out.dim(), M = out.shape()[r - 2], N = out.shape()[r - 1], K = a.shape()[r - 1];
  const Shape sa = broadcast_strides(a, out.shape()), sb = broadcast_strides(b, out.shape());
  // broadcast_strides maps against out's last two dims too; only the batch part is used.
  const int64_t am = a.strides()[r - 2], ak = a.strides()[r - 1];
  const int64_t bk = b.strides()[r - 2], bn = b.strides()[r - 1];
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const int64_t rows = out.numel() / std::max<int64_t>(N, 1);
#pragma omp parallel for if (rows * N * K > kParallelGrain) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t rem = row / M, oa = 0, ob = 0;
    const int64_t i = row % M;
    for (int64_t d = r - 3; d >= 0; --d) {
      const int64_t id = rem % out.shape()[d];
      rem /= out.shape()[d];
      oa += id * sa[d];
      ob += id * sb[d];
    }
    std::vector<T> acc(N, T(0));
    const T* arow = pa + oa + i * am;
    for (int64_t k = 0; k < K; ++k) {
      const T aik = arow[k * ak];
      const T* brow = pb + ob + k * bk;
      for (int64_t j = 0; j < N; ++j) acc[j] += aik * brow[j * bn];
    }
    T* orow = po + row * N;
    for (int64_t j = 0; j < N; ++j) orow[j] = alpha * acc[j] + (accumulate ? orow[j] : T(0));
  }
}

}  // namespace

namespace {
// Copies derived from weights, by source span and kind; an entry is good while its source
// storage lives at the same version.
struct Derived {
  std::weak_ptr<Storage> source;
  uint64_t version = 0;
  std::shared_ptr<Storage> copy;
};
using DerivedKey =
    std::tuple<const Storage*, int64_t, int64_t, uint64_t>;  // storage, offset, numel, tag
std::mutex derived_mutex;
std::map<DerivedKey, Derived>& derived_cache() {
  static std::map<DerivedKey, Derived> cache;
  return cache;
}
}  // namespace

namespace {
// "(1, 2)": the index of element `flat` (row-major) of `shape`.
std::string index_of(const Shape& shape, int64_t flat) {
  std::string out;
  for (size_t d = shape.size(); d-- > 0;) {
    out = std::to_string(flat % std::max<int64_t>(shape[d], 1)) + (out.empty() ? "" : ", ") + out;
    flat /= std::max<int64_t>(shape[d], 1);
  }
  return "(" + out + ")";
}

// The largest float that rounds to a finite bf16 (0x7F7F7FFF: the next one rounds up to inf).
const float kBf16Max = std::bit_cast<float>(0x7F7F7FFFu);

// w with its dims ordered by decreasing stride (a view that records nothing): a matmul reads a
// linear weight (OUT, IN) as its transpose view (IN, OUT), and the error should name the weight
// as its owner made it.
Tensor in_storage_order(const Tensor& w) {
  std::vector<size_t> dims(w.dim());
  for (size_t d = 0; d < dims.size(); ++d) dims[d] = d;
  std::stable_sort(dims.begin(), dims.end(),
                   [&](size_t a, size_t b) { return w.strides()[a] > w.strides()[b]; });
  Shape shape, strides;
  for (size_t d : dims) shape.push_back(w.shape()[d]), strides.push_back(w.strides()[d]);
  return Tensor::view_of(w, shape, strides, w.offset());
}
}  // namespace

bool has_nan(const float* p, int64_t n, bool pos_inf) {
  const float limit =
      pos_inf ? std::numeric_limits<float>::max() : std::numeric_limits<float>::infinity();
  int bad = 0;
#pragma omp parallel for simd reduction(| : bad) if (n > kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad |= !(p[i] <= limit);
  return bad != 0;
}

void check_weight_finite(const Tensor& w, const std::string& what, bool bf16) {
  const Tensor ws = in_storage_order(w);
  const float* p = ws.data<const float>();
  const float limit = bf16 ? kBf16Max : std::numeric_limits<float>::max();
  int64_t bad = -1, i = 0;
  for_each_offset(ws.shape(), ws.strides(), [&](int64_t o) {
    if (bad < 0 && !(std::fabs(p[o]) <= limit)) bad = i;
    ++i;
  });
  if (bad < 0) return;
  std::ostringstream v;
  v.precision(9);
  v << ws.to_vector<double>()[bad];
  // The module path names the parameter (module.weight) where modules push their names.
  const std::string path = autograd::name_scope_path();
  fail(what + (path.empty() ? "" : " in " + path) + ": weight " + describe(ws) + " holds " +
       v.str() + (std::isfinite(ws.to_vector<double>()[bad]) ? " (beyond bf16's range)" : "") +
       " at " + index_of(ws.shape(), bad) + "; a kept " + (bf16 ? "bf16" : "int8") +
       " copy of a weight needs finite values (a NaN or inf parameter: check the run or the "
       "checkpoint that made it" +
       (path.empty() ? "; anomaly mode, GRAFT_DETECT_ANOMALY=1, names the module" : "") + ")");
}

// Copies of weights that died or changed since: never hit again.
template <class Cache>
void erase_stale(Cache& cache) {
  std::erase_if(cache, [](const auto& kv) {
    const std::shared_ptr<Storage> s = kv.second.source.lock();
    return !s || s->version != kv.second.version;
  });
}

void drop_stale_derived_copies() {
  std::lock_guard<std::mutex> lock(derived_mutex);
  erase_stale(derived_cache());
}

std::shared_ptr<Storage> derived_copy(const Tensor& t, uint64_t tag,
                                      const std::function<std::shared_ptr<Storage>()>& make) {
  const std::shared_ptr<Storage>& src = t.impl()->storage;
  const DerivedKey key{src.get(), t.offset(), t.numel(), tag};
  std::lock_guard<std::mutex> lock(derived_mutex);
  auto& cache = derived_cache();
  auto it = cache.find(key);
  if (it != cache.end() && it->second.source.lock() == src && it->second.version == src->version)
    return it->second.copy;
  erase_stale(cache);  // dropped on every miss
  Derived d{src, src->version, make()};
  cache[key] = d;
  return d.copy;
}

Operand transposed(const Operand& o) {
  if (!o.is_kept()) return swap_last2(o.f32);
  Bf16Operand t = o.kept;
  const size_t r = t.shape.size();
  std::swap(t.shape[r - 1], t.shape[r - 2]);
  std::swap(t.strides[r - 1], t.strides[r - 2]);
  return t;
}

void bmm(const Operand& a, const Operand& b, const Tensor& out, double alpha, bool accumulate,
         BCopy b_copy) {
  if (out.numel() == 0) return;
  const int64_t K = a.shape().back();
  if (K == 0) {  // an empty sum
    if (!accumulate) fill_(out, 0);
    return;
  }
  if (is_half_tensor(a) || is_half_tensor(b))
    return bmm_half(half_side(a), half_side(b), out, (float)alpha, accumulate, Tensor());
  if (a.is_kept() || b.is_kept() || (a.f32.dtype() == DType::f32 && a.f32.dim() <= 12))
    bmm_f32(a, b, out, (float)alpha, accumulate, b_copy, Tensor());
  else
    GRAFT_DISPATCH_FLOAT(a.f32.dtype(), "bmm",
                         [&] { bmm_loop<T>(a.f32, b.f32, out, (T)alpha, accumulate); });
}

namespace {
std::string describe_operand(const Operand& o) {
  return o.is_kept() ? "bfloat16 " + shape_str(o.kept.shape) + " (kept)" : describe(o.f32);
}
// A kept bf16 copy stands for a float32 tensor.
DType operand_dtype(const Operand& o) { return o.is_kept() ? DType::f32 : o.f32.dtype(); }
}  // namespace

void gemm_bias(const Operand& a, const Operand& b, const Tensor& bias, const Tensor& out,
               BCopy b_copy) {
  const Shape &sa = a.shape(), &sb = b.shape();
  const DType dt = operand_dtype(a);
  const bool half = is_half(dt);
  const bool types = operand_dtype(b) == dt && (dt == DType::f32 || half) &&
                     (bias.dtype() == dt || (half && bias.dtype() == DType::f32)) &&
                     (out.dtype() == dt || (half && out.dtype() == DType::f32));
  if (!types || bias.dim() != 1 || !bias.is_contiguous() || sa.size() != 2 || sb.size() != 2 ||
      out.dim() != 2 || !out.is_contiguous() || sa[1] != sb[0] || sa[1] == 0 ||
      bias.shape()[0] != out.shape()[1] || sa[0] != out.shape()[0] || sb[1] != out.shape()[1])
    fail("gemm_bias: a " + describe_operand(a) + " @ b " + describe_operand(b) + " + bias " +
         describe(bias) + " into " + describe(out) +
         ": float32 (or bf16 or f16 operands, bias and out of theirs or float32), 2-D, K > 0 and "
         "matching shapes required");
  if (out.numel() == 0) return;
  if (half) bmm_half(a.f32, b.f32, out, 1.0f, false, bias);
  else bmm_f32(a, b, out, 1.0f, false, b_copy, bias);
}

void gemm(const Operand& a, const Operand& b, const Tensor& out, bool accumulate, BCopy b_copy) {
  const Shape &sa = a.shape(), &sb = b.shape();
  if (sa.size() != 2 || sb.size() != 2 || out.dim() != 2 || !out.is_contiguous() ||
      sa[0] != out.shape()[0] || sb[1] != out.shape()[1] || sa[1] != sb[0])
    fail("gemm: a " + describe_operand(a) + " @ b " + describe_operand(b) + " into " +
         describe(out));
  bmm(a, b, out, 1.0, accumulate, b_copy);
}

// A (rows, C) operand whose rows lie a multiple of 1 KiB apart, read down its columns (the
// reduction over rows of dW = dy^T x): the rows crowd into a few L1 cache sets and oneDNN
// 2.6's f32 gemm slowed down, to half speed at 4 KiB. Measured on an AVX2 machine (GFLOP/s, dW
// of a linear over 2048 or 1024 rows, as is -> with both operands' rows 16 floats further
// apart, copies included): 256 -> 1024 features 80 -> 170, 1024 -> 256 82 -> 154,
// 512 -> 512 116 -> 173, 256 -> 512 129 -> 168, 256 -> 768 150 -> 171.
bool aliasing(const Tensor& t) {
  return t.dim() == 2 && t.size(0) >= 256 && t.strides()[1] == 1 &&
         (t.strides()[0] * (int64_t)dtype_size(t.dtype())) % 1024 == 0;
}

Tensor unaliased(const Tensor& t) {
  if (!aliasing(t)) return t;
  const int64_t rows = t.size(0), cols = t.size(1), ld = t.strides()[0] + 16;
  Tensor buf = Tensor::empty({rows, ld}, t.dtype());
  Tensor v = Tensor::view_of(buf, {rows, cols}, {ld, 1}, 0);
  copy_into(v, t);
  return v;
}

}  // namespace graft::kern

namespace graft::kern {

namespace {
// matmul_into's shape rule: a (B..., M, K) @ b (B..., K, N) into out (B..., M, N), each batch dim
// of a and b equal to out's or 1.
bool matmul_fits(const Shape& a, const Shape& b, const Shape& out) {
  const size_t r = out.size();
  if (r < 2 || a.size() != r || b.size() != r) return false;
  for (size_t d = 0; d + 2 < r; ++d)
    if ((a[d] != out[d] && a[d] != 1) || (b[d] != out[d] && b[d] != 1)) return false;
  return a[r - 2] == out[r - 2] && b[r - 1] == out[r - 1] && a[r - 1] == b[r - 2];
}
}  // namespace

void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, double alpha,
                 bool accumulate) {
  check_float("matmul_into", a);
  check_float("matmul_into", b);
  check_float("matmul_into", out);
  check_same_dtype("matmul_into", a, b);
  if (!(is_half(a.dtype()) && out.dtype() == DType::f32))  // 16-bit operands may write float32
    check_same_dtype("matmul_into", a, out);
  if (!matmul_fits(a.shape(), b.shape(), out.shape()) || !out.is_contiguous())
    fail("matmul_into: a " + describe(a) + " @ b " + describe(b) + " into " + describe(out) +
         ": equal ranks >= 2, matching inner dims, batch dims equal or 1 and a contiguous out "
         "required");
  bmm(a, b, out, alpha, accumulate);
}

Tensor apply_linear(const char* name, const char* adjoint_name, const Tensor& g, const LinearMap& f,
                    const LinearMap& adjoint) {
  Tensor out;
  {
    autograd::NoGrad raw;  // f is a raw map; the entry below is its record
    out = f(g);
  }
  if (autograd::needs_record({g}))
    autograd::record(name, {g}, {out}, {},
                     [name, adjoint_name, f, adjoint](const autograd::Ctx& c, const Tensors& dout) {
                       return Tensors{c.create_graph
                                          ? apply_linear(adjoint_name, name, dout[0], adjoint, f)
                                          : adjoint(dout[0])};
                     });
  return out;
}

}  // namespace graft::kern
