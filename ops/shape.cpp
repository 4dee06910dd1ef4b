// Shape ops. Views (reshape of viewable data, permute, slice, unsqueeze, squeeze, broadcast_to,
// split) share the input's storage and so its version counter; their backward hands back a
// contiguous gradient of the input's shape. Copying ops (concat, index_select, embedding,
// contiguous, to_dtype) move bytes with OpenMP loops; none of them needs arithmetic, so every
// dtype shares one path: float32, float64, bf16 and f16 (2-byte elements moved as they are, no
// float32 detour), and int64 wherever no gradient is involved. The one sum, index_select's and
// embedding's backward scatter-add, adds bf16 and f16 gradients in float32 and rounds once.
#include "graft/ops/shape.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "autograd/internal/parallel.h"
#include "graft/autograd/gradcheck.h"
#include "graft/ops/reduce.h"
#include "ops/internal/int8.h"
#include "ops/internal/kept.h"
#include "ops/internal/kernels.h"

namespace graft {

using autograd::Ctx;

GRAFT_DECLARE_OP("reshape", "shape");
GRAFT_DECLARE_OP("permute", "shape");
GRAFT_DECLARE_OP("slice", "shape");
GRAFT_DECLARE_OP("unsqueeze", "shape");
GRAFT_DECLARE_OP("squeeze", "shape");
GRAFT_DECLARE_OP("broadcast_to", "shape");
GRAFT_DECLARE_OP("contiguous", "shape");
GRAFT_DECLARE_OP("to_dtype", "shape");
GRAFT_DECLARE_OP("concat", "shape");
GRAFT_DECLARE_OP("split", "shape");
GRAFT_DECLARE_OP("index_select", "shape");
GRAFT_DECLARE_OP("embedding", "shape");
// What slice, index_select and embedding record as their backward under create_graph.
GRAFT_DECLARE_OP("slice_backward", "shape");
GRAFT_DECLARE_OP("index_select_backward", "shape");
GRAFT_DECLARE_OP("embedding_backward", "shape");

namespace {

void check_defined(const char* op, const Tensor& x) {
  if (!x.defined()) fail(std::string(op) + ": got an undefined tensor");
}

// Normalises an axis, naming the input's shape in the error.
int64_t axis_of(const char* op, int64_t axis, const Tensor& x, int64_t rank) {
  return norm_axis(op, axis, rank, &x);
}
int64_t axis_of(const char* op, int64_t axis, const Tensor& x) {
  return axis_of(op, axis, x, x.dim());
}

// reshape (and squeeze, unsqueeze: reshapes too): dx = dout read with x's shape.
Tensor reshape_backward(const Tensor& dout, const Shape& x_shape) {
  return kern::reshaped(dout, x_shape);
}

void record_reshape_like(const char* op, const Tensor& x, const Tensor& out) {
  if (!autograd::needs_record({x})) return;
  autograd::record(op, {x}, {out}, {}, [in = x.shape()](const Ctx& c, const Tensors& dout) {
    return Tensors{c.create_graph ? reshape(dout[0], in) : reshape_backward(dout[0], in)};
  });
}

// permute by p: dout axis i is input axis p[i], so the inverse permutation reads dx from it.
Tensor permute_backward(const Tensor& dout, const std::vector<int64_t>& p) {
  Shape shape(p.size()), strides(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    shape[p[i]] = dout.shape()[i];
    strides[p[i]] = dout.strides()[i];
  }
  return contiguous_copy(kern::view_as(dout, shape, strides));
}

// Strides that read x's memory as `shape` without a copy, if the layout allows it. Walking x's
// dims from the innermost, dims laid out back to back form a chunk (size-1 dims join any chunk);
// a chunk is uniformly strided, so a run of new dims whose sizes multiply to the chunk's size
// can index it. The reshape is a view exactly when the new dims split into such runs.
std::optional<Shape> view_strides(const Tensor& x, const Shape& shape) {
  const Shape& os = x.shape();
  const Shape& ost = x.strides();
  if (os.empty() || x.numel() == 0) return contiguous_strides(shape);
  Shape st(shape.size(), 0);
  int64_t nd = (int64_t)shape.size() - 1;  // next new dim to place, innermost first
  int64_t base = ost.back(), chunk = 1;
  for (int64_t d = (int64_t)os.size() - 1; d >= 0; --d) {
    chunk *= os[d];
    const bool chunk_ends = d == 0 || (os[d - 1] != 1 && ost[d - 1] != chunk * base);
    if (!chunk_ends) continue;
    int64_t covered = 1;
    while (nd >= 0 && (covered < chunk || shape[nd] == 1)) {
      st[nd] = covered * base;
      covered *= shape[nd];
      --nd;
    }
    if (covered != chunk) return std::nullopt;
    if (d > 0) {
      base = ost[d - 1];
      chunk = 1;
    }
  }
  if (nd != -1) return std::nullopt;
  return st;
}

// Strided slice view along one axis; no validation, no recording.
Tensor slice_view(const Tensor& x, int64_t axis, int64_t start, int64_t len, int64_t step) {
  Shape shape = x.shape(), strides = x.strides();
  const int64_t offset = x.offset() + (len > 0 ? start * strides[axis] : 0);
  shape[axis] = len;
  strides[axis] *= step;
  return Tensor::view_of(x, shape, strides, offset);
}

// src (outer, n, row) -> dst (outer, k, row) with dst[o, j] = src[o, idx[j]]; rows of `row_bytes`
// bytes, so any dtype. Each output row is written by one thread.
void gather_rows(const char* src, char* dst, const int64_t* idx, int64_t outer, int64_t n,
                 int64_t k, size_t row_bytes) {
  const int64_t rows = outer * k;
  detail::parallel_for(
      rows, (int64_t)(rows * row_bytes) > kern::kParallelGrain * 4, [&](int64_t r) {
        const int64_t o = r / k, j = r % k;
        std::memcpy(dst + r * row_bytes, src + (o * n + idx[j]) * row_bytes, row_bytes);
      });
}

// dx (outer, n, inner) += scatter of dout (outer, k, inner): dx[o, idx[j]] += dout[o, j], except
// rows with idx[j] == skip. Repeated indices would make a split over j race, so threads split
// the non-indexed dims (outer x column blocks) and each walks j in order: no write conflicts
// and a summation order that does not depend on the thread count.
template <class T>
void scatter_add_rows(T* dx, const T* dout, const int64_t* idx, int64_t outer, int64_t n, int64_t k,
                      int64_t inner, int64_t skip) {
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
  const int64_t tasks = outer * nblocks;
#pragma omp parallel for if (outer * k * inner > kern::kParallelGrain) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / nblocks, c0 = (t % nblocks) * kBlock;
    const int64_t c1 = std::min(inner, c0 + kBlock);
    for (int64_t j = 0; j < k; ++j) {
      if (idx[j] == skip) continue;
      T* d = dx + (o * n + idx[j]) * inner;
      const T* s = dout + (o * k + j) * inner;
      for (int64_t c = c0; c < c1; ++c) d[c] += s[c];
    }
  }
}

// Copies contiguous src (outer, len * inner) into columns [at, at + len) * inner of contiguous
// dst (outer, total * inner).
void copy_band(const char* src, char* dst, int64_t outer, int64_t len, int64_t at, int64_t total,
               int64_t inner, size_t esize) {
  const size_t band = len * inner * esize, row = total * inner * esize, skip = at * inner * esize;
  if (band == 0) return;
#pragma omp parallel for if ((int64_t)(outer * band) > kern::kParallelGrain * 4) schedule(static)
  for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * row + skip, src + o * band, band);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// reshape: x (...) -> out (shape), same numel; one dim of `shape` may be -1 (inferred).
Tensor reshape(const Tensor& x, Shape shape) {
  check_defined("reshape", x);
  const Shape requested = shape;
  int64_t infer = -1;
  Shape given = shape;  // the -1 counted as 1, for the overflow-checked product below
  for (int64_t i = 0; i < (int64_t)shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0)
        fail("reshape: " + describe(x) + " to " + shape_str(requested) +
             ": only one dimension can be -1");
      infer = i;
      given[i] = 1;
    } else if (shape[i] < 0) {
      fail("reshape: " + describe(x) + " to " + shape_str(requested) + ": invalid dimension " +
           std::to_string(shape[i]));
    }
  }
  const int64_t known = shape_numel(given);
  if (infer >= 0) {
    if (known == 0 || x.numel() % known != 0)
      fail("reshape: cannot reshape " + describe(x) + " (" + std::to_string(x.numel()) +
           " elements) into " + shape_str(requested));
    shape[infer] = x.numel() / known;
  }
  if (shape_numel(shape) != x.numel())
    fail("reshape: cannot reshape " + describe(x) + " (" + std::to_string(x.numel()) +
         " elements) into " + shape_str(requested) + " (" + std::to_string(shape_numel(shape)) +
         " elements)");

  Tensor out;
  if (auto st = view_strides(x, shape)) out = Tensor::view_of(x, shape, *st, x.offset());
  else out = kern::reshaped(contiguous_copy(x), shape);
  record_reshape_like("reshape", x, out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// permute: x (d0, ..., dn) -> out (d[dims[0]], ..., d[dims[n]]), a view.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined("permute", x);
  const int64_t r = x.dim();
  std::vector<int64_t> p(dims.size());
  std::vector<bool> seen(r, false);
  bool ok = (int64_t)dims.size() == r;
  for (size_t i = 0; ok && i < dims.size(); ++i) {
    p[i] = dims[i] < 0 ? dims[i] + r : dims[i];
    ok = p[i] >= 0 && p[i] < r && !seen[p[i]];
    if (ok) seen[p[i]] = true;
  }
  if (!ok)
    fail("permute: dims " + shape_str(dims) + " are not a permutation of the " + std::to_string(r) +
         " axes of " + describe(x));
  Shape shape(r), strides(r);
  for (int64_t i = 0; i < r; ++i) {
    shape[i] = x.shape()[p[i]];
    strides[i] = x.strides()[p[i]];
  }
  Tensor out = Tensor::view_of(x, shape, strides, x.offset());
  if (autograd::needs_record({x})) {
    autograd::record("permute", {x}, {out}, {}, [p](const Ctx& c, const Tensors& dout) {
      if (!c.create_graph) return Tensors{permute_backward(dout[0], p)};
      std::vector<int64_t> inverse(p.size());
      for (size_t i = 0; i < p.size(); ++i) inverse[p[i]] = (int64_t)i;
      return Tensors{permute(dout[0], inverse)};
    });
  }
  return out;
}

// transpose: swaps axes d0 and d1; a permute.
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  check_defined("transpose", x);
  const int64_t a = axis_of("transpose", d0, x), b = axis_of("transpose", d1, x);
  std::vector<int64_t> p(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) p[i] = i;
  std::swap(p[a], p[b]);
  return permute(x, p);
}

// slice: dx = zeros of x's shape with dout written into the sliced positions.
Tensor slice_backward(const Tensor& dout, const Shape& x_shape, int64_t axis, int64_t start,
                      int64_t len, int64_t step) {
  Tensor dx = zeros(x_shape, dout.dtype());
  copy_into(slice_view(dx, axis, start, len, step), dout);
  return dx;
}

// ---------------------------------------------------------------------------------------------
// slice: x (..., n, ...) -> out (..., len, ...) with elements start, start + step, ... < end
// along axis; start/end clamp into [0, n] after adding n to negatives (Python slices).
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  check_defined("slice", x);
  const int64_t a = axis_of("slice", axis, x);
  if (step <= 0)
    fail("slice: step must be >= 1, got " + std::to_string(step) + " (input " + describe(x) +
         ", axis " + std::to_string(axis) + ")");
  const int64_t n = x.shape()[a];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  const int64_t s = clamp(start), e = clamp(end);
  const int64_t len = e > s ? (e - s + step - 1) / step : 0;
  Tensor out = slice_view(x, a, s, len, step);
  if (autograd::needs_record({x})) {
    autograd::record(
        "slice", {x}, {out}, {},
        [in = x.shape(), a, s, len, step](const Ctx& c, const Tensors& dout) {
          auto pad = [=](const Tensor& g) { return slice_backward(g, in, a, s, len, step); };
          if (!c.create_graph) return Tensors{pad(dout[0])};
          auto cut = [=](const Tensor& g) {
            return contiguous_copy(slice_view(g, a, s, len, step));
          };
          return Tensors{kern::apply_linear("slice_backward", "slice", dout[0], pad, cut)};
        });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// unsqueeze: x (...) -> out with a size-1 axis inserted at `axis` (in [-(r+1), r]).
Tensor unsqueeze(const Tensor& x, int64_t axis) {
  check_defined("unsqueeze", x);
  const int64_t a = axis_of("unsqueeze", axis, x, x.dim() + 1);
  Shape shape = x.shape(), strides = x.strides();
  // Any stride is valid for a size-1 axis; this one keeps a contiguous input contiguous.
  const int64_t st = a < x.dim() ? strides[a] * shape[a] : 1;
  shape.insert(shape.begin() + a, 1);
  strides.insert(strides.begin() + a, st);
  Tensor out = Tensor::view_of(x, shape, strides, x.offset());
  record_reshape_like("unsqueeze", x, out);
  return out;
}

// squeeze: x (..., 1, ...) -> out without that axis; the axis must have size 1.
Tensor squeeze(const Tensor& x, int64_t axis) {
  check_defined("squeeze", x);
  const int64_t a = axis_of("squeeze", axis, x);
  if (x.shape()[a] != 1)
    fail("squeeze: axis " + std::to_string(axis) + " of " + describe(x) + " has size " +
         std::to_string(x.shape()[a]) + ", expected 1");
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + a);
  strides.erase(strides.begin() + a);
  Tensor out = Tensor::view_of(x, shape, strides, x.offset());
  record_reshape_like("squeeze", x, out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// broadcast_to: x (...) -> out (shape), NumPy rules, a view with stride 0 on broadcast axes.
// broadcast_to: dx = dout summed over the broadcast axes, which the tape does for every op.
Tensors broadcast_to_backward(const Tensor& dout) { return {dout}; }

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check_defined("broadcast_to", x);
  bool ok = x.dim() <= (int64_t)shape.size();
  for (int64_t i = 0; ok && i < (int64_t)shape.size(); ++i) {
    ok = shape[i] >= 0;
    const int64_t k = i - ((int64_t)shape.size() - x.dim());
    if (ok && k >= 0) ok = x.shape()[k] == shape[i] || x.shape()[k] == 1;
  }
  if (!ok) fail("broadcast_to: cannot broadcast " + describe(x) + " to " + shape_str(shape));
  Tensor out = Tensor::view_of(x, shape, kern::broadcast_strides(x, shape), x.offset());
  if (autograd::needs_record({x})) {
    autograd::record("broadcast_to", {x}, {out}, {}, [](const Ctx&, const Tensors& dout) {
      return broadcast_to_backward(dout[0]);
    });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// contiguous: dx = dout.
Tensors contiguous_backward(const Tensor& dout) { return {dout}; }

// contiguous: x itself when already contiguous, else a recorded copy (gradient passes through).
Tensor contiguous(const Tensor& x) {
  check_defined("contiguous", x);
  if (x.is_contiguous()) return x;
  Tensor out = contiguous_copy(x);
  if (autograd::needs_record({x}))
    autograd::record("contiguous", {x}, {out}, {},
                     [](const Ctx&, const Tensors& dout) { return contiguous_backward(dout[0]); });
  return out;
}

// to_dtype: dx = dout cast back to x's dtype.
Tensor to_dtype_backward(const Tensor& dout, DType x_dtype) { return cast_copy(dout, x_dtype); }

// to_dtype: x itself when already of dtype dt, else a cast copy. Float-to-float casts are
// recorded (the gradient is cast back); casts to int64 truncate and carry no gradient.
Tensor to_dtype(const Tensor& x, DType dt) {
  check_defined("to_dtype", x);
  if (x.dtype() == dt) return x;
  Tensor out = cast_copy(x, dt);
  if (is_floating(dt) && autograd::needs_record({x}))
    autograd::record(
        "to_dtype", {x}, {out}, {}, [in = x.dtype()](const Ctx& c, const Tensors& dout) {
          return Tensors{c.create_graph ? to_dtype(dout[0], in) : to_dtype_backward(dout[0], in)};
        });
  return out;
}

// ---------------------------------------------------------------------------------------------
// concat: dxs[i] = the band [starts[i], starts[i] + lens[i]) of dout along axis.
// Under create_graph the bands are recorded slices.
Tensors concat_backward(const Tensor& dout, int64_t axis, const std::vector<int64_t>& starts,
                        const std::vector<int64_t>& lens, const std::vector<bool>& needs,
                        bool create_graph) {
  Tensors dxs(lens.size());
  for (size_t i = 0; i < lens.size(); ++i)
    if (needs[i])
      dxs[i] = create_graph ? slice(dout, axis, starts[i], starts[i] + lens[i])
                            : contiguous_copy(slice_view(dout, axis, starts[i], lens[i], 1));
  return dxs;
}

// concat: xs[i] (..., n_i, ...) -> out (..., sum n_i, ...) along axis; same dtype and same
// shape except on axis. Backward slices dout.
Tensor concat(const Tensors& xs, int64_t axis) {
  if (xs.empty()) fail("concat: needs at least one tensor");
  for (auto& x : xs) check_defined("concat", x);
  const Tensor& x0 = xs[0];
  if (x0.dim() == 0) fail("concat: cannot concatenate 0-d tensors, got " + describe(x0));
  const int64_t a = axis_of("concat", axis, x0);
  Shape shape = x0.shape();
  shape[a] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    if (x.dtype() != x0.dtype())
      fail("concat: dtype mismatch, input 0 is " + describe(x0) + " and input " +
           std::to_string(i) + " is " + describe(x));
    bool same = x.dim() == x0.dim();
    for (int64_t d = 0; same && d < x.dim(); ++d) same = d == a || x.shape()[d] == x0.shape()[d];
    if (!same)
      fail("concat: input " + std::to_string(i) + " " + describe(x) + " does not match input 0 " +
           describe(x0) + " outside axis " + std::to_string(axis));
    shape[a] += x.shape()[a];
  }
  Tensor out = Tensor::empty(shape, x0.dtype());
  const Split3 o = split3(shape, a);
  const size_t esize = dtype_size(x0.dtype());
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (auto& x : xs) {
    starts.push_back(at);
    Tensor xc = kern::contig(x);
    copy_band(static_cast<const char*>(xc.raw()), static_cast<char*>(out.raw()), o.outer,
              x.shape()[a], at, o.n, o.inner, esize);
    at += x.shape()[a];
  }
  if (autograd::needs_record(xs)) {
    std::vector<int64_t> lens;
    for (auto& x : xs) lens.push_back(x.shape()[a]);
    autograd::record("concat", xs, {out}, {}, [a, starts, lens](const Ctx& c, const Tensors& dout) {
      return concat_backward(dout[0], a, starts, lens, c.needs, c.create_graph);
    });
  }
  return out;
}

// split: dx = the pieces' gradients laid back side by side along axis.
Tensor split_backward(const Tensors& dout, const Shape& x_shape, int64_t axis,
                      const std::vector<int64_t>& sizes) {
  Tensor dx = Tensor::empty(x_shape, dout[0].dtype());
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    copy_into(slice_view(dx, axis, at, sizes[i], 1), dout[i]);
    at += sizes[i];
  }
  return dx;
}

// split: x (..., n, ...) -> pieces (..., sizes[i], ...) along axis, views; sum(sizes) == n.
// One tape entry for all pieces: pieces that received no gradient arrive as zeros.
Tensors split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  check_defined("split", x);
  const int64_t a = axis_of("split", axis, x);
  int64_t total = 0;
  for (auto s : sizes) {
    if (s < 0) fail("split: negative size in " + shape_str(sizes) + " for input " + describe(x));
    total += s;
  }
  if (total != x.shape()[a])
    fail("split: sizes " + shape_str(sizes) + " sum to " + std::to_string(total) + " but axis " +
         std::to_string(axis) + " of " + describe(x) + " has size " + std::to_string(x.shape()[a]));
  Tensors pieces;
  int64_t at = 0;
  for (auto s : sizes) {
    pieces.push_back(slice_view(x, a, at, s, 1));
    at += s;
  }
  if (!pieces.empty() && autograd::needs_record({x})) {
    autograd::record(
        "split", {x}, pieces, {}, [in = x.shape(), a, sizes](const Ctx& c, const Tensors& dout) {
          return Tensors{c.create_graph ? concat(dout, a) : split_backward(dout, in, a, sizes)};
        });
  }
  return pieces;
}

// ---------------------------------------------------------------------------------------------
// index_select (and embedding): dx = zeros of x's shape (s: its (outer, n, inner) split around
// the axis) with dout's rows scatter-added at ids, rows whose id is `skip` left out.
Tensor index_select_backward(const Tensor& dout, const Tensor& ids, const Shape& x_shape,
                             const Split3& s, int64_t skip) {
  if (is_half(dout.dtype()))  // repeated ids sum in float32, rounded once to dout's dtype
    return cast_copy(index_select_backward(cast_copy(dout, DType::f32), ids, x_shape, s, skip),
                     dout.dtype());
  Tensor dx = zeros(x_shape, dout.dtype());
  GRAFT_DISPATCH_FLOAT(dout.dtype(), "index_select", [&] {
    scatter_add_rows<T>(dx.data<T>(), dout.data<T>(), ids.data<int64_t>(), s.outer, s.n,
                        ids.numel(), s.inner, skip);
  });
  return dx;
}

// index_select: x (..., n, ...), idx int64 (k) with values in [0, n) -> out (..., k, ...),
// out[.., j, ..] = x[.., idx[j], ..]. Backward scatter-adds dout into zeros of x's shape.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& idx) {
  check_defined("index_select", x);
  check_defined("index_select", idx);
  const int64_t a = axis_of("index_select", axis, x);
  if (idx.dtype() != DType::i64 || idx.dim() != 1)
    fail("index_select: index must be a 1-D int64 tensor, got " + describe(idx) + " (input " +
         describe(x) + ")");
  Tensor ic = kern::contig(idx);
  const int64_t* pi = ic.data<int64_t>();
  const int64_t n = x.shape()[a], k = idx.numel();
  for (int64_t j = 0; j < k; ++j)
    if (pi[j] < 0 || pi[j] >= n)
      fail("index_select: index " + std::to_string(pi[j]) + " (position " + std::to_string(j) +
           ") out of range for axis " + std::to_string(axis) + " of size " + std::to_string(n) +
           " (input " + describe(x) + ")");
  Shape shape = x.shape();
  shape[a] = k;
  Tensor out = Tensor::empty(shape, x.dtype());
  const Split3 s = split3(x.shape(), a);
  const size_t esize = dtype_size(x.dtype());
  Tensor xc = kern::contig(x);
  gather_rows(static_cast<const char*>(xc.raw()), static_cast<char*>(out.raw()), pi, s.outer, n, k,
              s.inner * esize);
  if (autograd::needs_record({x})) {
    autograd::record("index_select", {x}, {out}, {ic},
                     [in = x.shape(), s, a](const Ctx& c, const Tensors& dout) {
                       const Tensor ids = c.saved[0];
                       auto scatter = [=](const Tensor& g) {
                         return index_select_backward(g, ids, in, s, -1);
                       };
                       if (!c.create_graph) return Tensors{scatter(dout[0])};
                       auto gather = [=](const Tensor& g) { return index_select(g, a, ids); };
                       return Tensors{kern::apply_linear("index_select_backward", "index_select",
                                                         dout[0], scatter, gather)};
                     });
  }
  return out;
}

namespace {
// A tensor's rows (dim 0) as contiguous runs: its shape and strides with the trailing dims that
// are contiguous together merged into the last (a KV cache's (H, len, Dh) row is H runs of
// len * Dh elements, not H * len runs of Dh). The last stride must be 1.
struct RowRuns {
  Shape shape, strides;
  int64_t run() const { return shape.back(); }
  int64_t runs() const { return shape_numel(shape) / std::max<int64_t>(shape[0] * run(), 1); }
};
RowRuns row_runs(const Tensor& x) {
  int64_t d = x.dim() - 1, run = x.shape()[d];
  while (d > 1 && x.strides()[d - 1] == run) run *= x.shape()[--d];
  RowRuns r{Shape(x.shape().begin(), x.shape().begin() + d),
            Shape(x.strides().begin(), x.strides().begin() + d)};
  r.shape.push_back(run);
  r.strides.push_back(1);
  return r;
}

// Calls f(offset) with the element offset of each contiguous run of row `row` of x.
template <class F>
void for_each_run(const Tensor& x, const RowRuns& rr, int64_t row, F&& f) {
  for (int64_t k = 0, n = rr.runs(); k < n; ++k)
    f(x.offset() + row * x.strides()[0] + kern::run_offset(rr.shape, rr.strides, k, 1));
}
}  // namespace

void select_rows_(const Tensor& x, const Tensor& idx) {
  check_defined("select_rows_", x);
  check_defined("select_rows_", idx);
  auto rows_overlap = [&] {
    int64_t row_extent = 1;  // elements from a row's first to its last, +1
    for (int64_t d = 1; d < x.dim(); ++d) row_extent += (x.shape()[d] - 1) * x.strides()[d];
    return x.numel() > 0 && x.shape()[0] > 1 && x.strides()[0] < row_extent;
  };
  if (x.dim() < 2 || x.strides().back() != 1 || rows_overlap())
    fail("select_rows_: x " + describe(x) +
         " needs >= 2 dims, a contiguous last dim and rows that do not overlap");
  const int64_t B = x.shape()[0];
  if (idx.dtype() != DType::i64 || idx.dim() != 1 || idx.numel() != B)
    fail("select_rows_: index must be a 1-D int64 tensor of " + std::to_string(B) +
         " entries, got " + describe(idx) + " (x " + describe(x) + ")");
  const std::vector<int64_t> from = idx.to_vector<int64_t>();
  std::vector<int64_t> moved;
  for (int64_t i = 0; i < B; ++i) {
    if (from[i] < 0 || from[i] >= B)
      fail("select_rows_: index " + std::to_string(from[i]) + " (position " + std::to_string(i) +
           ") out of range for " + std::to_string(B) + " rows (x " + describe(x) + ")");
    if (from[i] != i) moved.push_back(i);
  }
  if (moved.empty() || x.numel() == 0) return;
  const RowRuns rr = row_runs(x);
  const size_t es = dtype_size(x.dtype()), run = (size_t)rr.run() * es;
  const int64_t row_elems = x.numel() / B;
  std::unique_ptr<char[]> held(
      new char[(size_t)moved.size() * row_elems * es]);  // the source rows, read first
  char* base = static_cast<char*>(x.impl()->storage->data);
  const int64_t m = (int64_t)moved.size();
  const bool parallel = m * row_elems > kern::kParallelGrain;
  detail::parallel_for(m, parallel, [&](int64_t j) {
    char* out = held.get() + (size_t)j * row_elems * es;
    for_each_run(x, rr, from[moved[j]],
                 [&](int64_t off) { std::memcpy(out, base + off * es, run), out += run; });
  });
  detail::parallel_for(m, parallel, [&](int64_t j) {
    const char* in = held.get() + (size_t)j * row_elems * es;
    for_each_run(x, rr, moved[j],
                 [&](int64_t off) { std::memcpy(base + off * es, in, run), in += run; });
  });
  x.bump_version();
}

// ---------------------------------------------------------------------------------------------
// embedding: dweight (V, C) = dout's rows scatter-added at their ids, padding_idx rows skipped
// (ids are never negative, so -1 skips nothing when there is no padding).
Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t V, int64_t C,
                          int64_t padding_idx) {
  return index_select_backward(dout, ids, {V, C}, Split3{1, V, C},
                               padding_idx < 0 ? -1 : padding_idx);
}

// The adjoint of embedding_backward: g's rows at ids, zero where the id is padding_idx (whose
// rows the backward skips). Records nothing.
Tensor embedding_gather_adjoint(const Tensor& g, const Tensor& ids, int64_t padding_idx) {
  Tensor out = embedding(g, ids);
  if (padding_idx < 0) return out;
  const int64_t* pi = ids.data<int64_t>();
  const size_t row = (size_t)g.shape()[1] * dtype_size(out.dtype());
  char* po = static_cast<char*>(out.raw());
  // All-zero bits are +0 in every float dtype.
  for (int64_t j = 0; j < ids.numel(); ++j)
    if (pi[j] == padding_idx) std::memset(po + j * row, 0, row);
  return out;
}

namespace {

// embedding of a table kept for inference (or a slice of its rows), float32 rows looked up in its
// kept form: made int8 (quantize_weight_int8: rows dequantized) or kept for float32 inference
// (keep_weight_fp32: rows read out of the blocked form); nullopt for a table that holds its own
// values. Nothing to train: recording it is refused.
std::optional<Tensor> embedding_kept(const Tensor& weight, const int64_t* ids, int64_t N,
                                     const Shape& shape) {
  const kern::KeptForm* f32 = kern::kept_form(weight, DType::f32);
  if (!f32 && !kern::has_int8_form(weight)) return std::nullopt;
  if (autograd::needs_record({weight}))
    fail("embedding: weight " + describe(weight) + " was " +
         (f32 ? "kept for float32 inference" : "quantized to int8 for inference") +
         " and cannot be trained (run it under NoGrad)");
  Tensor out = Tensor::empty(shape, DType::f32);
  if (f32) kern::gather_kept_rows(*f32, weight.offset() / f32->IN, ids, N, out.data<float>());
  else kern::gather_int8_rows(weight, ids, N, out.data<float>());
  return out;
}

}  // namespace

// embedding: weight (V, C), ids int64 (...) in [0, V) -> out (..., C), out[.., :] = weight[id].
// Backward scatter-adds dout rows into dweight, skipping ids equal to padding_idx (their
// forward row is still returned, as in PyTorch, but never trained).
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx) {
  check_defined("embedding", weight);
  check_defined("embedding", ids);
  kern::check_float("embedding", weight);
  if (weight.dim() != 2) fail("embedding: weight must be 2-D (V, C), got " + describe(weight));
  if (ids.dtype() != DType::i64)
    fail("embedding: ids must be int64, got " + describe(ids) + " (weight " + describe(weight) +
         ")");
  const int64_t V = weight.shape()[0], C = weight.shape()[1];
  if (padding_idx >= V)
    fail("embedding: padding_idx " + std::to_string(padding_idx) + " out of range for weight " +
         describe(weight));
  Tensor ic = kern::contig(ids);
  const int64_t* pi = ic.data<int64_t>();
  const int64_t N = ids.numel();
  for (int64_t j = 0; j < N; ++j)
    if (pi[j] < 0 || pi[j] >= V)
      fail("embedding: id " + std::to_string(pi[j]) + " out of range [0, " + std::to_string(V) +
           ") for weight " + describe(weight) + " (ids " + describe(ids) + ")");
  Shape shape = ids.shape();
  shape.push_back(C);
  if (std::optional<Tensor> kept = embedding_kept(weight, pi, N, shape)) return *kept;
  Tensor out = Tensor::empty(shape, weight.dtype());
  Tensor wc = kern::contig(weight);
  gather_rows(static_cast<const char*>(wc.raw()), static_cast<char*>(out.raw()), pi, 1, V, N,
              C * dtype_size(weight.dtype()));
  if (autograd::needs_record({weight})) {
    autograd::record(
        "embedding", {weight}, {out}, {ic}, [V, C, padding_idx](const Ctx& c, const Tensors& dout) {
          const Tensor ids = c.saved[0];
          auto scatter = [=](const Tensor& g) {
            return embedding_backward(g, ids, V, C, padding_idx);
          };
          if (!c.create_graph) return Tensors{scatter(dout[0])};
          auto gather = [=](const Tensor& g) {
            return embedding_gather_adjoint(g, ids, padding_idx);
          };
          return Tensors{
              kern::apply_linear("embedding_backward", "embedding", dout[0], scatter, gather)};
        });
  }
  return out;
}

}  // namespace graft
