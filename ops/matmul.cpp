// matmul and linear. float32 runs oneDNN (matmul; inner_product for linear) on the tensors'
// own strides, so transposed views are read in place; float64 runs reference loops.
#include "ops/matmul.h"

#include <algorithm>
#include <map>
#include <string_view>

#include "autograd/gradcheck.h"
#include "ops/kernels.h"
#include "ops/onednn/dnnl_utils.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace graft {

namespace {

// ---- views (no recording: used on operands and inside backward) ----

Tensor view_as(const Tensor& t, const Shape& shape, const Shape& strides) {
  return Tensor::view_of(t, shape, strides, t.offset());
}

// Swaps the last two dims: the transpose of every matrix in the batch, without a copy.
Tensor swap_last2(const Tensor& t) {
  Shape s = t.shape(), st = t.strides();
  const size_t r = s.size();
  std::swap(s[r - 1], s[r - 2]);
  std::swap(st[r - 1], st[r - 2]);
  return view_as(t, s, st);
}

// Prepends size-1 dims up to rank r (the broadcasting rule for batch dims).
Tensor pad_rank(const Tensor& t, size_t r) {
  Shape s = t.shape(), st = t.strides();
  const size_t k = s.size();
  s.insert(s.begin(), r - k, 1);
  st.insert(st.begin(), r - k, k ? st[0] * s[r - k] : 1);
  return view_as(t, s, st);
}

// Reshape of a fresh contiguous tensor.
Tensor reshaped(const Tensor& t, const Shape& shape) {
  return view_as(t, shape, contiguous_strides(shape));
}

// If dims [0, r-1) of t (batch dims and M) can be read as one dim, returns its stride
// (the rows of a (B..., M, K) operand laid out as one (B*M, K) matrix); -1 otherwise.
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

bool batch_is_one(const Tensor& t) {
  for (int64_t d = 0; d + 2 < t.dim(); ++d)
    if (t.shape()[d] != 1) return false;
  return true;
}

// ---- float32: oneDNN matmul ----

// oneDNN's own cache only saves the primitive; the primitive descriptor is still built (malloc
// heavy implementation dispatch) on every call, which measured about 40% of a 64x64x64 matmul.
// So each thread keeps the primitives it built, keyed by the problem's dims and strides.
using Key = std::vector<int64_t>;

template <class Prim>
struct Cached {
  Prim prim;
  std::vector<dnnl::memory::desc> mds;  // in the order the caller executes them
  bool dense_copy = false;              // operands must be made dense first (see matmul_f32)
};

template <class Prim, class Make>
const Cached<Prim>& cached(const Key& key, Make&& make) {
  thread_local std::map<Key, Cached<Prim>> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // Training loops use a few dozen shapes; a bound keeps a shape-varying caller from leaking.
  if (cache.size() >= 512) cache.clear();
  return cache.emplace(key, make()).first->second;
}

// The tensor's strides, except that size-1 dims get the stride a dense layout would give them:
// their stride is meaningless, and odd values there (0 for a broadcast dim, anything from a
// view) keep oneDNN from recognising a plain layout.
Shape clean_strides(const Tensor& t) {
  Shape st = t.strides();
  const Shape& s = t.shape();
  for (int64_t d = t.dim(); d-- > 0;)
    if (s[d] == 1) st[d] = d + 1 < t.dim() ? st[d + 1] * s[d + 1] : 1;
  return st;
}

// The operand as oneDNN can take it: stride-0 (expanded) dims other than size 1 are
// materialised, everything else is used in place.
Tensor dnnl_operand(const Tensor& t) { return onednn::usable(t) ? t : contiguous_copy(t); }

// out (B..., M, N) contiguous = a (Ba..., M, K) @ b (Bb..., K, N), equal ranks, batch dims of
// a and b equal or 1 (oneDNN broadcasts them); with accumulate, out += a @ b (a sum post-op).
void matmul_f32(Tensor a, Tensor b, const Tensor& out, bool accumulate = false) {
  a = dnnl_operand(a);
  b = dnnl_operand(b);
  Tensor o = out;
  // b without batch dims and a whose batch rows are evenly spaced: one (B*M, K) @ (K, N)
  // gemm is faster than B small ones.
  if (a.dim() > 2 && batch_is_one(b)) {
    const int64_t rs = merged_row_stride(a);
    if (rs >= 0) {
      const int64_t rows = a.numel() / a.shape().back(), K = a.shape().back(),
                    N = b.shape().back();
      a = view_as(a, {rows, K}, {rs, a.strides().back()});
      b = view_as(b, {K, N}, {b.strides()[b.dim() - 2], b.strides().back()});
      o = reshaped(out, {rows, N});
    }
  }
  const Shape as = clean_strides(a), bs = clean_strides(b);
  Key key{a.dim(), accumulate};
  for (const Shape* v : {&a.shape(), &as, &b.shape(), &bs, &o.shape()})
    key.insert(key.end(), v->begin(), v->end());
  const auto& c = cached<dnnl::matmul>(key, [&] {
    auto a_md = onednn::md(a.shape(), as), b_md = onednn::md(b.shape(), bs),
         o_md = onednn::md(o);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, o_md), attr, onednn::engine());
    // A strided batch can land on the reference kernel (orders of magnitude slower); dense
    // copies are cheap next to that.
    const bool dense = std::string_view(pd.impl_info_str()).substr(0, 3) == "ref" &&
                       (!a.is_contiguous() || !b.is_contiguous());
    if (dense) {
      a_md = onednn::md_contiguous(a.shape());
      b_md = onednn::md_contiguous(b.shape());
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, o_md), attr,
                                        onednn::engine());
    }
    return Cached<dnnl::matmul>{dnnl::matmul(pd), {a_md, b_md, o_md}, dense};
  });
  if (c.dense_copy) {
    a = contiguous_copy(a);
    b = contiguous_copy(b);
  }
  c.prim.execute(onednn::stream(), {{DNNL_ARG_SRC, onednn::mem(c.mds[0], a)},
                                    {DNNL_ARG_WEIGHTS, onednn::mem(c.mds[1], b)},
                                    {DNNL_ARG_DST, onednn::mem(c.mds[2], o)}});
  onednn::stream().wait();
}

// ---- float64 (and empty-shape) reference ----

// Rows of the output (batch x M) are split over threads; each row is written by one thread
// and accumulated in i-k-j order so the inner loop streams a row of b.
template <class T>
void matmul_loop(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false) {
  const int64_t r = out.dim(), M = out.shape()[r - 2], N = out.shape()[r - 1],
                K = a.shape()[r - 1];
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  const Shape sa = kern::broadcast_strides(a, out.shape()),
              sb = kern::broadcast_strides(b, out.shape());
  // broadcast_strides maps against out's last two dims too; only the batch part is used.
  const int64_t am = a.strides()[r - 2], ak = a.strides()[r - 1];
  const int64_t bk = b.strides()[r - 2], bn = b.strides()[r - 1];
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const int64_t nbatch = shape_numel(batch), rows = nbatch * M;
#pragma omp parallel for if (rows * N * K > kern::kParallelGrain) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t rem = row / M, oa = 0, ob = 0;
    const int64_t i = row % M;
    for (int64_t d = r - 3; d >= 0; --d) {
      const int64_t id = rem % out.shape()[d];
      rem /= out.shape()[d];
      oa += id * sa[d];
      ob += id * sb[d];
    }
    T* orow = po + row * N;
    if (!accumulate)
      for (int64_t j = 0; j < N; ++j) orow[j] = T(0);
    const T* arow = pa + oa + i * am;
    for (int64_t k = 0; k < K; ++k) {
      const T aik = arow[k * ak];
      const T* brow = pb + ob + k * bk;
      for (int64_t j = 0; j < N; ++j) orow[j] += aik * brow[j * bn];
    }
  }
}

// out = a @ b for operands of equal rank >= 2 whose batch dims broadcast; a fresh tensor.
Tensor matmul_core(const Tensor& a, const Tensor& b) {
  const int64_t r = a.dim();
  Shape out_shape(r);
  for (int64_t d = 0; d < r - 2; ++d) out_shape[d] = std::max(a.shape()[d], b.shape()[d]);
  out_shape[r - 2] = a.shape()[r - 2];
  out_shape[r - 1] = b.shape()[r - 1];
  Tensor out = Tensor::empty(out_shape, a.dtype());
  if (out.numel() == 0) return out;
  if (a.dtype() == DType::f32 && a.shape()[r - 1] > 0 && r <= 12)
    matmul_f32(a, b, out);
  else
    GRAFT_DISPATCH_FLOAT(a.dtype(), "matmul", [&] { matmul_loop<T>(a, b, out); });
  return out;
}

}  // namespace

// A (rows, C) operand whose rows lie a multiple of 1 KiB apart, read down its columns (the
// reduction over rows of dW = dy^T x): the rows crowd into a few L1 cache sets and oneDNN
// 2.6's f32 gemm slowed down, to half speed at 4 KiB. Measured on this machine (GFLOP/s, dW
// of a linear over 2048 or 1024 rows, as is -> with both operands' rows 16 floats further
// apart, copies included): 256 -> 1024 features 80 -> 170, 1024 -> 256 82 -> 154,
// 512 -> 512 116 -> 173, 256 -> 512 129 -> 168, 256 -> 768 150 -> 171.
bool kern::aliasing(const Tensor& t) {
  return t.dim() == 2 && t.size(0) >= 256 && t.strides()[1] == 1 &&
         (t.strides()[0] * (int64_t)dtype_size(t.dtype())) % 1024 == 0;
}

// t, or a copy of it with rows 16 elements further apart when aliasing(t).
Tensor kern::unaliased(const Tensor& t) {
  if (!aliasing(t)) return t;
  const int64_t rows = t.size(0), cols = t.size(1), ld = t.strides()[0] + 16;
  Tensor buf = Tensor::empty({rows, ld}, t.dtype());
  Tensor v = Tensor::view_of(buf, {rows, cols}, {ld, 1}, 0);
  copy_into(v, t);
  return v;
}

void kern::gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2 || !out.is_contiguous() ||
      a.shape()[0] != out.shape()[0] || b.shape()[1] != out.shape()[1] ||
      a.shape()[1] != b.shape()[0])
    fail("gemm: a " + describe(a) + " @ b " + describe(b) + " into " + describe(out));
  if (out.numel() == 0) return;
  if (a.dtype() == DType::f32 && a.shape()[1] > 0)
    matmul_f32(a, b, out, accumulate);
  else
    GRAFT_DISPATCH_FLOAT(a.dtype(), "gemm", [&] { matmul_loop<T>(a, b, out, accumulate); });
}

namespace {

// torch.matmul's promotion: a 1-D a becomes (1, K), a 1-D b becomes (K, 1), then both are
// padded to a common rank. Also validates and returns the final output shape.
struct Promoted {
  Tensor a, b;
  Shape out_shape;
};

Promoted promote(const Tensor& a, const Tensor& b) {
  const std::string what = "matmul: " + shape_str(a.shape()) + " @ " + shape_str(b.shape());
  if (a.dim() == 0 || b.dim() == 0) fail(what + ": both operands need at least 1 dim");
  Promoted p;
  p.a = a.dim() == 1 ? view_as(a, {1, a.shape()[0]}, {a.shape()[0] * a.strides()[0], a.strides()[0]})
                     : a;
  p.b = b.dim() == 1 ? view_as(b, {b.shape()[0], 1}, {b.strides()[0], 1}) : b;
  const int64_t K = p.a.shape().back(), Kb = p.b.shape()[p.b.dim() - 2];
  if (K != Kb)
    fail(what + ": inner dims " + std::to_string(K) + " != " + std::to_string(Kb));
  const size_t r = std::max(p.a.dim(), p.b.dim());
  p.a = pad_rank(p.a, r);
  p.b = pad_rank(p.b, r);
  for (size_t d = 0; d + 2 < r; ++d) {
    const int64_t da = p.a.shape()[d], db = p.b.shape()[d];
    if (da != db && da != 1 && db != 1)
      fail(what + ": batch dims " +
           shape_str(Shape(a.shape().begin(), a.shape().end() - std::min<int64_t>(a.dim(), 2))) +
           " and " +
           shape_str(Shape(b.shape().begin(), b.shape().end() - std::min<int64_t>(b.dim(), 2))) +
           " cannot be broadcast");
    p.out_shape.push_back(std::max(da, db));
  }
  if (a.dim() > 1) p.out_shape.push_back(a.shape()[a.dim() - 2]);
  if (b.dim() > 1) p.out_shape.push_back(b.shape().back());
  return p;
}

}  // namespace

// matmul: a (..., M, K) @ b (..., K, N) -> out (broadcast(...), M, N)
GRAFT_DECLARE_OP("matmul", "matmul");

Tensor matmul(const Tensor& a, const Tensor& b) {
  kern::check_float("matmul", a);
  kern::check_float("matmul", b);
  if (a.dtype() != b.dtype())
    fail("matmul: " + shape_str(a.shape()) + " @ " + shape_str(b.shape()) +
         ": dtype mismatch, " + describe(a) + " vs " + describe(b));
  Promoted p = promote(a, b);
  Tensor out = reshaped(matmul_core(p.a, p.b), p.out_shape);
  if (autograd::needs_record({a, b}))
    autograd::record("matmul", {a, b}, {out}, {a, b},
                     [](const autograd::Ctx& c, const Tensors& dout) -> Tensors {
                       const Tensor &a = c.saved[0], &b = c.saved[1];
                       Promoted p = promote(a, b);
                       // dout as the promoted (B..., M, N) product
                       Shape ps(p.out_shape.begin(), p.out_shape.end());
                       const int64_t r = p.a.dim();
                       ps.resize(r - 2);
                       ps.push_back(p.a.shape()[r - 2]);
                       ps.push_back(p.b.shape()[r - 1]);
                       const Tensor g = reshaped(dout[0], ps);
                       Tensor da, db;
                       if (c.needs[0]) {
                         // da = dout @ b^T, summed over the batch dims a was broadcast along
                         da = sum_to(matmul_core(g, swap_last2(p.b)), p.a.shape());
                         da = reshaped(kern::contig(da), a.shape());
                       }
                       if (c.needs[1]) {
                         // db = a^T @ dout; for a 2-D b under a batched a this is one gemm
                         // over all rows: (K, B*M) @ (B*M, N).
                         const int64_t rs = batch_is_one(p.b) ? merged_row_stride(p.a) : -1;
                         if (r > 2 && rs >= 0) {
                           const int64_t K = p.a.shape().back(), rows = p.a.numel() / K;
                           const Tensor at = view_as(p.a, {K, rows}, {p.a.strides().back(), rs});
                           db = matmul_core(at, reshaped(g, {rows, g.shape().back()}));
                         } else {
                           db = sum_to(matmul_core(swap_last2(p.a), g), p.b.shape());
                         }
                         db = reshaped(kern::contig(db), b.shape());
                       }
                       return {da, db};
                     });
  return out;
}

GRAFT_OP_CASE({.name = "matmul/batched_broadcast",
               .op = "matmul",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input({2, 1, 3, 4}, dt, g), case_input({3, 4, 5}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "matmul/batched_2d_transposed",
               .op = "matmul",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input({2, 3, 4}, dt, g), case_input_t({4, 5}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "matmul/transposed_a_batched",
               .op = "matmul",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input_t({2, 3, 4}, dt, g), case_input({2, 4, 5}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "matmul/vec_mat",
               .op = "matmul",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input({4}, dt, g), case_input({4, 5}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "matmul/mat_vec_batched",
               .op = "matmul",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input({2, 3, 4}, dt, g), case_input({4}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});

// ---- linear ----

namespace {

// x (N, IN) contiguous, w (OUT, IN) contiguous, b (OUT) or undefined -> y (N, OUT)
template <class T>
void linear_loop(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const int64_t N = x.shape()[0], IN = x.shape()[1], OUT = w.shape()[0];
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  T* py = y.data<T>();
#pragma omp parallel for if (N * IN * OUT > kern::kParallelGrain) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OUT; ++o) {
      T acc = pb ? pb[o] : T(0);
      for (int64_t i = 0; i < IN; ++i) acc += px[n * IN + i] * pw[o * IN + i];
      py[n * OUT + o] = acc;
    }
}

// dy (N, OUT), w (OUT, IN), x (N, IN), all contiguous; fills the defined outputs.
template <class T>
void linear_backward_loop(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                          const Tensor& dw, const Tensor& db) {
  const int64_t N = x.shape()[0], IN = x.shape()[1], OUT = w.shape()[0];
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const bool big = N * IN * OUT > kern::kParallelGrain;
  // dx = dy W, split over rows of x
  if (dx.defined()) {
    T* pdx = dx.data<T>();
#pragma omp parallel for if (big) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      T* row = pdx + n * IN;
      for (int64_t i = 0; i < IN; ++i) row[i] = T(0);
      for (int64_t o = 0; o < OUT; ++o) {
        const T g = pdy[n * OUT + o];
        for (int64_t i = 0; i < IN; ++i) row[i] += g * pw[o * IN + i];
      }
    }
  }
  // dW = dy^T x and db = sum of dy's rows, split over output features
  if (dw.defined() || db.defined()) {
    T* pdw = dw.defined() ? dw.data<T>() : nullptr;
    T* pdb = db.defined() ? db.data<T>() : nullptr;
#pragma omp parallel for if (big) schedule(static)
    for (int64_t o = 0; o < OUT; ++o) {
      if (pdw)
        for (int64_t i = 0; i < IN; ++i) pdw[o * IN + i] = T(0);
      T bsum = T(0);
      for (int64_t n = 0; n < N; ++n) {
        const T g = pdy[n * OUT + o];
        bsum += g;
        if (pdw)
          for (int64_t i = 0; i < IN; ++i) pdw[o * IN + i] += g * px[n * IN + i];
      }
      if (pdb) pdb[o] = bsum;
    }
  }
}

// Descriptors of a linear over contiguous x (N, IN), w (OUT, IN), b (OUT), y (N, OUT).
struct LinearMds {
  dnnl::memory::desc x, w, b, y;
  LinearMds(int64_t N, int64_t IN, int64_t OUT, bool has_bias)
      : x(onednn::md_contiguous({N, IN})),
        w(onednn::md_contiguous({OUT, IN})),
        b(has_bias ? onednn::md_contiguous({OUT}) : dnnl::memory::desc()),
        y(onednn::md_contiguous({N, OUT})) {}
};

dnnl::inner_product_forward::primitive_desc linear_fwd_pd(const LinearMds& m, dnnl::prop_kind kind) {
  using ipf = dnnl::inner_product_forward;
  return m.b.is_zero()
             ? ipf::primitive_desc(ipf::desc(kind, m.x, m.w, m.y), onednn::engine())
             : ipf::primitive_desc(ipf::desc(kind, m.x, m.w, m.b, m.y), onednn::engine());
}

// Flattens the leading dims of a contiguous (..., C) tensor to (rows, C).
Tensor as_rows(const Tensor& t) {
  const int64_t c = t.shape().back();
  return reshaped(t, {c ? t.numel() / c : shape_numel(Shape(t.shape().begin(), t.shape().end() - 1)), c});
}

}  // namespace

// linear: x (..., IN), w (OUT, IN), b (OUT) -> y (..., OUT) = x W^T + b
GRAFT_DECLARE_OP("linear", "matmul");

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  kern::check_float("linear", x);
  kern::check_float("linear", w);
  const bool has_bias = b.defined();
  const std::string what = "linear: x " + shape_str(x.shape()) + ", w " + shape_str(w.shape()) +
                           (has_bias ? ", b " + shape_str(b.shape()) : std::string());
  if (x.dtype() != w.dtype() || (has_bias && b.dtype() != x.dtype()))
    fail(what + ": dtype mismatch, " + describe(x) + " vs " + describe(w) +
         (has_bias ? " vs " + describe(b) : std::string()));
  if (x.dim() < 1) fail(what + ": x needs at least 1 dim");
  if (w.dim() != 2) fail(what + ": w must be 2-D (OUT, IN)");
  if (w.shape()[1] != x.shape().back())
    fail(what + ": in features " + std::to_string(x.shape().back()) + " != w's " +
         std::to_string(w.shape()[1]));
  if (has_bias && (b.dim() != 1 || b.shape()[0] != w.shape()[0]))
    fail(what + ": b must be (" + std::to_string(w.shape()[0]) + ")");

  const int64_t OUT = w.shape()[0];
  Shape y_shape = x.shape();
  y_shape.back() = OUT;
  const Tensor x2 = as_rows(kern::contig(x)), wc = kern::contig(w);
  const Tensor bc = has_bias ? kern::contig(b) : Tensor();
  Tensor y = Tensor::empty(y_shape, x.dtype());
  const Tensor y2 = as_rows(y);
  const bool record = autograd::needs_record({x, w, b});
  if (x.dtype() == DType::f32 && x2.numel() > 0 && y2.numel() > 0) {
    const int64_t N = x2.shape()[0], IN = x2.shape()[1];
    const auto kind =
        record ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    const auto& c = cached<dnnl::inner_product_forward>(
        {(int64_t)kind, N, IN, OUT, has_bias}, [&] {
          LinearMds m(N, IN, OUT, has_bias);
          return Cached<dnnl::inner_product_forward>{
              dnnl::inner_product_forward(linear_fwd_pd(m, kind)), {m.x, m.w, m.b, m.y}};
        });
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, onednn::mem(c.mds[0], x2)},
                                               {DNNL_ARG_WEIGHTS, onednn::mem(c.mds[1], wc)},
                                               {DNNL_ARG_DST, onednn::mem(c.mds[3], y2)}};
    if (has_bias) args[DNNL_ARG_BIAS] = onednn::mem(c.mds[2], bc);
    c.prim.execute(onednn::stream(), args);
    onednn::stream().wait();
  } else {
    GRAFT_DISPATCH_FLOAT(x.dtype(), "linear", [&] { linear_loop<T>(x2, wc, bc, y2); });
  }

  if (record) {
    Tensors saved{x, w};
    autograd::record(
        "linear", {x, w, b}, {y}, saved,
        [has_bias](const autograd::Ctx& c, const Tensors& dout) -> Tensors {
          const Tensor x2 = as_rows(kern::contig(c.saved[0])), w = kern::contig(c.saved[1]);
          const Tensor dy = as_rows(dout[0]);
          const Tensor& x = c.saved[0];
          Tensor dx = c.needs[0] ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
          Tensor dw = c.needs[1] ? Tensor::empty(w.shape(), w.dtype()) : Tensor();
          Tensor db = has_bias && c.needs[2] ? Tensor::empty({w.shape()[0]}, w.dtype()) : Tensor();
          const Tensor dx2 = dx.defined() ? as_rows(dx) : Tensor();
          if (x.dtype() == DType::f32 && x2.numel() > 0 && dy.numel() > 0) {
            const int64_t N = x2.shape()[0], IN = x2.shape()[1], OUT = w.shape()[0];
            const LinearMds m(N, IN, OUT, has_bias);
            auto hint = [&] { return linear_fwd_pd(m, dnnl::prop_kind::forward_training); };
            if (dx.defined()) {
              using ipd = dnnl::inner_product_backward_data;
              const auto& c = cached<ipd>({N, IN, OUT, has_bias}, [&] {
                return Cached<ipd>{
                    ipd(ipd::primitive_desc(ipd::desc(m.x, m.w, m.y), onednn::engine(), hint())),
                    {}};
              });
              c.prim.execute(onednn::stream(), {{DNNL_ARG_DIFF_DST, onednn::mem(m.y, dy)},
                                                {DNNL_ARG_WEIGHTS, onednn::mem(m.w, w)},
                                                {DNNL_ARG_DIFF_SRC, onednn::mem(m.x, dx2)}});
            }
            if (dw.defined() && (kern::aliasing(dy) || kern::aliasing(x2))) {
              // dW = dy^T x as a matmul on copies whose rows are not 1 KiB multiples apart (aliasing).
              kern::gemm(transpose(kern::unaliased(dy), 0, 1), kern::unaliased(x2), dw);
              if (db.defined()) db = sum(dy, {0});
            } else if (dw.defined() || db.defined()) {
              // oneDNN computes dW and db together; whichever was not asked for goes to scratch.
              using ipw = dnnl::inner_product_backward_weights;
              const bool with_db = has_bias && db.defined();
              const auto& c = cached<ipw>({N, IN, OUT, has_bias, with_db}, [&] {
                auto d = with_db ? ipw::desc(m.x, m.w, m.b, m.y) : ipw::desc(m.x, m.w, m.y);
                return Cached<ipw>{ipw(ipw::primitive_desc(d, onednn::engine(), hint())), {}};
              });
              const Tensor dw_buf = dw.defined() ? dw : Tensor::empty(w.shape(), w.dtype());
              std::unordered_map<int, dnnl::memory> args{
                  {DNNL_ARG_SRC, onednn::mem(m.x, x2)},
                  {DNNL_ARG_DIFF_DST, onednn::mem(m.y, dy)},
                  {DNNL_ARG_DIFF_WEIGHTS, onednn::mem(m.w, dw_buf)}};
              if (with_db) args[DNNL_ARG_DIFF_BIAS] = onednn::mem(m.b, db);
              c.prim.execute(onednn::stream(), args);
            }
            onednn::stream().wait();
          } else {
            GRAFT_DISPATCH_FLOAT(x.dtype(), "linear", [&] {
              linear_backward_loop<T>(dy, x2, w, dx2, dw, db);
            });
          }
          return {dx, dw, db};
        });
  }
  return y;
}

GRAFT_OP_CASE({.name = "linear/bias_3d",
               .op = "linear",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input({2, 3, 4}, dt, g), case_input({5, 4}, dt, g),
                                    case_input({5}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return linear(x[0], x[1], x[2]); }});
GRAFT_OP_CASE({.name = "linear/no_bias_transposed_x",
               .op = "linear",
               .make_inputs =
                   [](DType dt, Generator& g) {
                     return Tensors{case_input_t({3, 4}, dt, g), case_input_t({5, 4}, dt, g)};
                   },
               .fn = [](const Tensors& x) { return linear(x[0], x[1]); }});

}  // namespace graft
