// split_heads / merge_heads: one copy kernel moves whole runs of Dh elements between the row
// layout (B, T, parts, H, Dh) and one part's head layout (B, H, T, Dh). Byte copies, so both
// float dtypes share the path; split_heads' backward is merge's copy and merge_heads' backward is
// split's. split_heads' parts are views of one buffer, so they share one version counter: an
// in-place write to one part counts as a change of all of them for the tape's saved-tensor check.
#include "graft/ops/heads.h"

#include <cstring>

#include "autograd/internal/parallel.h"
#include "graft/autograd/gradcheck.h"
#include "graft/autograd/tape.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/shape.h"
#include "ops/internal/kernels.h"

namespace graft {

using autograd::Ctx;

namespace {

GRAFT_DECLARE_OP("split_heads", "shape");
GRAFT_DECLARE_OP("merge_heads", "shape");

// The row layout's sizes: rows (B, T, parts * H * Dh).
struct HeadGeom {
  int64_t B, T, parts, H, Dh;
  Shape rows() const { return {B, T, parts * H * Dh}; }
  Shape heads() const { return {B, H, T, Dh}; }
};

// t itself when dense, else a dense copy (not recorded).
Tensor dense(const Tensor& t) { return t.is_contiguous() ? t : contiguous_copy(t); }

// Copies part p between rows (dense, g.rows()) and heads (dense, g.heads()), either way.
void move_heads(const Tensor& rows, const Tensor& heads, const HeadGeom& g, int64_t p,
                bool to_heads) {
  const int64_t e = (int64_t)dtype_size(rows.dtype()), run = g.Dh * e;
  const int64_t row_bytes = g.parts * g.H * run;
  auto* r = static_cast<std::byte*>(rows.raw()) + p * g.H * run;
  auto* h = static_cast<std::byte*>(heads.raw());
  detail::parallel_for(g.B * g.H, rows.numel() > kern::kParallelGrain, [&](int64_t bh) {
    const int64_t b = bh / g.H, hh = bh % g.H;
    for (int64_t t = 0; t < g.T; ++t) {
      std::byte* at_rows = r + (b * g.T + t) * row_bytes + hh * run;
      std::byte* at_heads = h + (bh * g.T + t) * run;
      if (to_heads) std::memcpy(at_heads, at_rows, run);
      else std::memcpy(at_rows, at_heads, run);
    }
  });
}

// rows (dense) -> parts dense head tensors (views of one buffer).
Tensors rows_to_heads(const Tensor& rows, const HeadGeom& g) {
  Tensor all = Tensor::empty({g.parts, g.B, g.H, g.T, g.Dh}, rows.dtype());
  Tensors out;
  for (int64_t p = 0; p < g.parts; ++p) {
    const Shape s = g.heads();
    out.push_back(
        Tensor::view_of(all, s, contiguous_strides(s), all.offset() + p * all.numel() / g.parts));
    move_heads(rows, out.back(), g, p, true);
  }
  return out;
}

// parts head tensors (any strides) -> rows (dense).
Tensor heads_to_rows(const Tensors& heads, const HeadGeom& g) {
  Tensor rows = Tensor::empty(g.rows(), heads[0].dtype());
  for (int64_t p = 0; p < g.parts; ++p) move_heads(rows, dense(heads[p]), g, p, false);
  return rows;
}

Tensor split_heads_backward(const Tensors& dout, const HeadGeom& g) {
  return heads_to_rows(dout, g);
}
Tensor merge_heads_backward(const Tensor& dout, const HeadGeom& g) {
  return rows_to_heads(dense(dout), g)[0];
}

}  // namespace

Tensors split_heads(const Tensor& y, int64_t parts, int64_t heads) {
  if (!y.defined()) fail("split_heads: y is undefined");
  kern::check_float("split_heads", y);
  if (y.dim() != 3 || parts <= 0 || heads <= 0 || y.size(2) % (parts * heads) != 0)
    fail("split_heads: y " + describe(y) + " must be (B, T, parts * heads * Dh) with parts " +
         std::to_string(parts) + " > 0 and heads " + std::to_string(heads) + " > 0");
  const HeadGeom g{y.size(0), y.size(1), parts, heads, y.size(2) / (parts * heads)};
  Tensors out = rows_to_heads(dense(y), g);
  if (autograd::needs_record({y}))
    autograd::record("split_heads", {y}, out, {}, [g](const Ctx& c, const Tensors& dout) {
      if (!c.create_graph) return Tensors{split_heads_backward(dout, g)};
      Tensors rows;  // each part's heads merged, the parts side by side: recorded ops
      for (const Tensor& d : dout) rows.push_back(merge_heads(d));
      return Tensors{rows.size() == 1 ? rows[0] : concat(rows, -1)};
    });
  return out;
}

Tensor merge_heads(const Tensor& x) {
  if (!x.defined()) fail("merge_heads: x is undefined");
  kern::check_float("merge_heads", x);
  if (x.dim() != 4) fail("merge_heads: x " + describe(x) + " must be (B, H, T, Dh)");
  const HeadGeom g{x.size(0), x.size(2), 1, x.size(1), x.size(3)};
  Tensor out = heads_to_rows({x}, g);
  if (autograd::needs_record({x}))
    autograd::record("merge_heads", {x}, {out}, {}, [g](const Ctx& c, const Tensors& dout) {
      return Tensors{c.create_graph ? split_heads(dout[0], 1, g.H)[0]
                                    : merge_heads_backward(dout[0], g)};
    });
  return out;
}

}  // namespace graft
