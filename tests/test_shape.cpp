// Shape ops: forward values against hand-computed numbers, view/storage semantics, hand-checked
// backward values (scatter-add accumulation, padding_idx), and the misuse checks that are not one
// op's bad inputs (select_rows_, changed saved ids, copy_into). Each op's bad inputs are its
// record's error_inputs (testing/cases/shape.cpp, heads.cpp), run by test_gradcheck_all.
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/ops/heads.h"
#include "graft/ops/reduce.h"
#include "graft/ops/shape.h"

using namespace graft;

namespace {

using V = std::vector<double>;
using I = std::vector<int64_t>;

Tensor f64(const V& v, const Shape& s) { return from_vector(v, s); }
Tensor i64(const I& v, const Shape& s) { return from_vector(v, s); }
// 0, 1, 2, ... in float64
Tensor iota(const Shape& s) {
  return arange(0.0, (double)shape_numel(s), 1.0, DType::f64).detach();
}
Tensor iota_shaped(const Shape& s) { return reshape(iota({shape_numel(s)}), s); }

V vals(const Tensor& t) { return t.to_vector<double>(); }

// The message names every fragment (the op and the shapes involved).
auto mentions(std::vector<std::string> parts) {
  return [parts](const Error& e) {
    const std::string m = e.what();
    for (auto& p : parts)
      if (m.find(p) == std::string::npos) {
        BOOST_TEST_MESSAGE("message '" << m << "' lacks '" << p << "'");
        return false;
      }
    return true;
  };
}

// Runs backward with upstream gradient `g` and returns x's gradient.
V grad_of(const Tensor& x, const Tensor& out, const Tensor& g) {
  out.backward(g);
  V r = vals(x.grad());
  const_cast<Tensor&>(x).zero_grad();
  return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(shape)

// ---- reshape ----
BOOST_AUTO_TEST_CASE(reshape_contiguous_is_a_view) {
  Tensor x = iota_shaped({2, 3});
  Tensor y = reshape(x, {3, -1});
  BOOST_TEST(y.shape() == Shape({3, 2}));
  BOOST_TEST(y.same_storage(x));
  BOOST_TEST(vals(y) == V({0, 1, 2, 3, 4, 5}), boost::test_tools::per_element());
  BOOST_TEST(reshape(x, {-1}).shape() == Shape({6}));
  BOOST_TEST(reshape(scalar(2.0, DType::f64), {1, 1}).shape() == Shape({1, 1}));
  BOOST_TEST(reshape(zeros({0, 3}), {3, 0}).shape() == Shape({3, 0}));
}

BOOST_AUTO_TEST_CASE(reshape_of_transposed_copies) {
  Tensor x = iota_shaped({2, 3});
  Tensor t = transpose(x, 0, 1);  // (3, 2): 0 3 / 1 4 / 2 5
  Tensor y = reshape(t, {6});
  BOOST_TEST(!y.same_storage(x));
  BOOST_TEST(y.is_contiguous());
  BOOST_TEST(vals(y) == V({0, 3, 1, 4, 2, 5}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(reshape_of_viewable_noncontiguous_stays_a_view) {
  // Columns 0..3 of an (4, 6) tensor: rows are strided but each row is contiguous, so
  // splitting the leading or the trailing dim needs no copy; merging them would.
  Tensor x = iota_shaped({4, 6});
  Tensor s = slice(x, 1, 0, 4);
  Tensor a = reshape(s, {2, 2, 2, 2});
  BOOST_TEST(a.same_storage(x));
  BOOST_TEST(vals(a) == vals(s), boost::test_tools::per_element());
  Tensor b = reshape(s, {16});
  BOOST_TEST(!b.same_storage(x));
  BOOST_TEST(vals(b) == vals(s), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(reshape_matches_copy_for_many_layouts) {
  // Every reshape of every layout must read the same elements as reshaping a contiguous copy.
  Tensor base = iota_shaped({2, 3, 4});
  std::vector<Tensor> layouts = {base,
                                 permute(base, {2, 0, 1}),
                                 permute(base, {1, 0, 2}),
                                 slice(base, 2, 1, 3),
                                 slice(base, 0, 1, 2),
                                 slice(base, 2, 0, 4, 2),
                                 unsqueeze(transpose(base, 0, 2), 1)};
  for (auto& x : layouts) {
    const int64_t n = x.numel();
    std::vector<Shape> targets = {{n}, {1, n}, {n, 1}};
    for (int64_t a = 1; a <= n; ++a)
      if (n % a == 0) {
        targets.push_back({a, n / a});
        for (int64_t b = 1; b <= n / a; ++b)
          if ((n / a) % b == 0) targets.push_back({a, b, 1, n / a / b});
      }
    for (auto& s : targets) {
      Tensor y = reshape(x, s);
      BOOST_TEST(vals(y) == vals(x), boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(reshape_backward) {
  Tensor x = iota_shaped({2, 3}).requires_grad_();
  Tensor y = reshape(transpose(x, 0, 1), {6});
  BOOST_TEST(grad_of(x, y, f64({1, 2, 3, 4, 5, 6}, {6})) == V({1, 3, 5, 2, 4, 6}),
             boost::test_tools::per_element());
  BOOST_TEST(autograd::tape_size() == 0u);
}

// ---- permute / transpose ----
BOOST_AUTO_TEST_CASE(transpose_view_shares_storage) {
  Tensor x = iota_shaped({2, 3});
  Tensor t = transpose(x, 0, 1);
  BOOST_TEST(t.shape() == Shape({3, 2}));
  BOOST_TEST(t.same_storage(x));
  BOOST_TEST(!t.is_contiguous());
  BOOST_TEST(vals(t) == V({0, 3, 1, 4, 2, 5}), boost::test_tools::per_element());
  // t[2, 0] is x[0, 2].
  const uint64_t v0 = x.version();
  copy_into(slice(slice(t, 0, 2, 3), 1, 0, 1), f64({100}, {1, 1}));
  BOOST_TEST(vals(x) == V({0, 1, 100, 3, 4, 5}), boost::test_tools::per_element());
  BOOST_TEST(x.version() > v0);  // the version counter is shared with the view
}

BOOST_AUTO_TEST_CASE(permute_values_and_backward) {
  Tensor x = iota_shaped({2, 3, 4}).requires_grad_();
  Tensor y = permute(x, {2, 0, -2});  // (4, 2, 3): y[k, i, j] = x[i, j, k]
  BOOST_TEST(y.shape() == Shape({4, 2, 3}));
  V v = vals(y);
  BOOST_TEST(v[0] == 0);
  BOOST_TEST(v[1] == 4);       // y[0, 0, 1] = x[0, 1, 0]
  BOOST_TEST(v[6] == 1);       // y[1, 0, 0] = x[0, 0, 1]
  BOOST_TEST(v[3 + 2] == 20);  // y[0, 1, 2] = x[1, 2, 0]
  // Upstream gradient = y's own values: dx must be x's values in x's layout.
  Tensor dx_expect = iota({24});
  BOOST_TEST(grad_of(x, y, contiguous_copy(y.detach())) == vals(dx_expect),
             boost::test_tools::per_element());
}

// ---- slice ----
BOOST_AUTO_TEST_CASE(slice_values) {
  Tensor x = iota_shaped({3, 5});
  BOOST_TEST(vals(slice(x, 1, 1, 5, 2)) == V({1, 3, 6, 8, 11, 13}),
             boost::test_tools::per_element());
  BOOST_TEST(vals(slice(x, 0, -1, 100)) == V({10, 11, 12, 13, 14}),
             boost::test_tools::per_element());
  BOOST_TEST(vals(slice(x, -1, -100, 2)) == V({0, 1, 5, 6, 10, 11}),
             boost::test_tools::per_element());
  BOOST_TEST(slice(x, 1, 4, 2).shape() == Shape({3, 0}));
  BOOST_TEST(slice(x, 1, 7, 9).shape() == Shape({3, 0}));
  BOOST_TEST(slice(x, 1, 0, 5, 3).shape() == Shape({3, 2}));
  BOOST_TEST(slice(x, 1, 1, 5, 2).same_storage(x));
}

BOOST_AUTO_TEST_CASE(slice_backward_zero_outside) {
  Tensor x = iota_shaped({2, 4}).requires_grad_();
  Tensor y = slice(x, 1, 1, 4, 2);  // columns 1 and 3
  BOOST_TEST(grad_of(x, y, f64({1, 2, 3, 4}, {2, 2})) == V({0, 1, 0, 2, 0, 3, 0, 4}),
             boost::test_tools::per_element());
}

// ---- unsqueeze / squeeze ----
BOOST_AUTO_TEST_CASE(unsqueeze_squeeze_values) {
  Tensor x = iota_shaped({2, 3});
  BOOST_TEST(unsqueeze(x, 0).shape() == Shape({1, 2, 3}));
  BOOST_TEST(unsqueeze(x, -1).shape() == Shape({2, 3, 1}));
  BOOST_TEST(unsqueeze(x, 1).is_contiguous());
  BOOST_TEST(unsqueeze(x, 1).same_storage(x));
  Tensor t = unsqueeze(transpose(x, 0, 1), 1);  // (3, 1, 2)
  BOOST_TEST(vals(t) == V({0, 3, 1, 4, 2, 5}), boost::test_tools::per_element());
  Tensor s = squeeze(t, 1);
  BOOST_TEST(s.shape() == Shape({3, 2}));
  BOOST_TEST(vals(s) == V({0, 3, 1, 4, 2, 5}), boost::test_tools::per_element());
  BOOST_TEST(squeeze(zeros({1}), 0).dim() == 0);
}

// ---- broadcast_to ----
BOOST_AUTO_TEST_CASE(broadcast_to_view_and_backward) {
  Tensor x = f64({1, 2, 3}, {3, 1}).requires_grad_();
  Tensor y = broadcast_to(x, {2, 3, 2});
  BOOST_TEST(y.same_storage(x));
  BOOST_TEST(y.strides() == Shape({0, 1, 0}));
  BOOST_TEST(vals(y) == V({1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}), boost::test_tools::per_element());
  Tensor g = f64({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
  // dx[i] = sum over the broadcast axes of g[:, i, :]
  BOOST_TEST(grad_of(x, y, g) == V({1 + 2 + 7 + 8, 3 + 4 + 9 + 10, 5 + 6 + 11 + 12}),
             boost::test_tools::per_element());
}

// ---- contiguous / to_dtype ----
BOOST_AUTO_TEST_CASE(contiguous_copies_only_when_needed) {
  Tensor x = iota_shaped({2, 3}).requires_grad_();
  BOOST_TEST(contiguous(x).impl() == x.impl());
  Tensor t = transpose(x, 0, 1);
  Tensor c = contiguous(t);
  BOOST_TEST(c.is_contiguous());
  BOOST_TEST(!c.same_storage(x));
  BOOST_TEST(vals(c) == V({0, 3, 1, 4, 2, 5}), boost::test_tools::per_element());
  BOOST_TEST(grad_of(x, c, f64({1, 2, 3, 4, 5, 6}, {3, 2})) == V({1, 3, 5, 2, 4, 6}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(to_dtype_casts_value_and_gradient) {
  Tensor x = from_vector(std::vector<float>{1.5f, -2.25f}, {2}).requires_grad_();
  Tensor y = to_dtype(x, DType::f64);
  BOOST_TEST((y.dtype() == DType::f64));
  BOOST_TEST(vals(y) == V({1.5, -2.25}), boost::test_tools::per_element());
  y.backward(f64({0.5, 4}, {2}));
  BOOST_TEST((x.grad().dtype() == DType::f32));
  BOOST_TEST(vals(x.grad()) == V({0.5, 4}), boost::test_tools::per_element());
  BOOST_TEST(to_dtype(x, DType::f32).impl() == x.impl());
  BOOST_TEST(vals(to_dtype(i64({3, -1}, {2}), DType::f32)) == V({3, -1}),
             boost::test_tools::per_element());
}

// ---- concat / split ----
BOOST_AUTO_TEST_CASE(concat_values_and_backward) {
  Tensor a = f64({1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor b = transpose(f64({5, 6}, {1, 2}), 0, 1).requires_grad_();  // (2, 1) non-contiguous
  Tensor y = concat({a, b}, 1);
  BOOST_TEST(y.shape() == Shape({2, 3}));
  BOOST_TEST(vals(y) == V({1, 2, 5, 3, 4, 6}), boost::test_tools::per_element());
  y.backward(f64({10, 20, 30, 40, 50, 60}, {2, 3}));
  BOOST_TEST(vals(a.grad()) == V({10, 20, 40, 50}), boost::test_tools::per_element());
  BOOST_TEST(vals(b.grad()) == V({30, 60}), boost::test_tools::per_element());
  BOOST_TEST(vals(concat({i64({1}, {1}), i64({2, 3}, {2})}, 0)) == V({1, 2, 3}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(split_views_and_backward) {
  Tensor x = iota_shaped({2, 5}).requires_grad_();
  Tensors p = split(x, {2, 0, 3}, 1);
  BOOST_TEST(p.size() == 3u);
  BOOST_TEST(p[0].same_storage(x));
  BOOST_TEST(vals(p[0]) == V({0, 1, 5, 6}), boost::test_tools::per_element());
  BOOST_TEST(p[1].shape() == Shape({2, 0}));
  BOOST_TEST(vals(p[2]) == V({2, 3, 4, 7, 8, 9}), boost::test_tools::per_element());
  // Only the last piece gets a gradient; the others count as zeros.
  BOOST_TEST(grad_of(x, p[2], f64({1, 2, 3, 4, 5, 6}, {2, 3})) == V({0, 0, 1, 2, 3, 0, 0, 4, 5, 6}),
             boost::test_tools::per_element());
  BOOST_TEST(autograd::tape_size() == 0u);
}

// ---- index_select ----
BOOST_AUTO_TEST_CASE(index_select_values_and_scatter_add) {
  Tensor x = iota_shaped({3, 2}).requires_grad_();
  Tensor idx = i64({2, 0, 2, 2}, {4});
  Tensor y = index_select(x, 0, idx);
  BOOST_TEST(vals(y) == V({4, 5, 0, 1, 4, 5, 4, 5}), boost::test_tools::per_element());
  // Row 2 is picked three times: its gradient is the sum of three upstream rows.
  BOOST_TEST(grad_of(x, y, f64({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2})) == V({3, 4, 0, 0, 13, 16}),
             boost::test_tools::per_element());
  Tensor z = index_select(iota_shaped({2, 3}), -1, i64({1, 1}, {2}));
  BOOST_TEST(vals(z) == V({1, 1, 4, 4}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(index_select_large_is_deterministic) {
  // Enough work to run the parallel scatter; the sums must not depend on the schedule.
  const int64_t n = 50, k = 4000, c = 300;
  Tensor x = zeros({n, c}, DType::f64).requires_grad_();
  std::vector<int64_t> ids(k);
  for (int64_t j = 0; j < k; ++j) ids[j] = (j * 7) % n;
  Tensor y = index_select(x, 0, i64(ids, {k}));
  y.backward(ones({k, c}, DType::f64));
  V g = vals(x.grad());
  for (int64_t r = 0; r < n; ++r) BOOST_TEST(g[r * c + c - 1] == double(k / n));
}

// select_rows_ on positions 1..3 of a (5, 2, 4, 3) buffer (a view with an offset), as a beam
// reorder of a KV cache: rows repeated and kept, equal to index_select of the view; position 0
// and the version follow. (Each row of the view is 2 runs of 3 x 3 elements; the whole buffer's
// rows, one run each, are in select_rows_on_dense_rows.)
BOOST_AUTO_TEST_CASE(select_rows_in_place_on_a_view) {
  for (int64_t scale : {1, 400}) {  // 400: enough rows to run the parallel copies
    const int64_t B = 5 * scale;
    Tensor buf = iota_shaped({B, 2, 4, 3});
    Tensor view = slice(buf, 2, 1, 4);
    std::vector<int64_t> from(B);
    for (int64_t i = 0; i < B; ++i)
      from[i] = (i % 5 == 1) ? i : (i * 3 + 2) % B;  // repeats, kept rows
    const Tensor idx = i64(from, {B});
    const V want = vals(index_select(contiguous(view), 0, idx));
    const V first = vals(contiguous(slice(buf, 2, 0, 1)));
    const uint64_t v0 = buf.version();
    select_rows_(view, idx);
    BOOST_TEST(vals(contiguous(view)) == want, boost::test_tools::per_element());
    BOOST_TEST(vals(contiguous(slice(buf, 2, 0, 1))) == first, boost::test_tools::per_element());
    BOOST_TEST(buf.version() > v0);
  }
}

BOOST_AUTO_TEST_CASE(select_rows_on_dense_rows) {
  Tensor x = iota_shaped({4, 2, 4, 3});
  const Tensor idx = i64({3, 3, 0, 1}, {4});
  const V want = vals(index_select(x, 0, idx));
  select_rows_(x, idx);
  BOOST_TEST(vals(x) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(select_rows_errors) {
  Tensor x = zeros({5, 3});
  BOOST_CHECK_EXCEPTION(select_rows_(x, i64({0, 1, 2, 3, 5}, {5})), Error,
                        mentions({"select_rows_", "index 5", "5 rows", "(5, 3)"}));
  BOOST_CHECK_EXCEPTION(select_rows_(x, i64({0, 1}, {2})), Error,
                        mentions({"select_rows_", "5 entries", "(2)"}));
  BOOST_CHECK_EXCEPTION(select_rows_(transpose(zeros({3, 5}), 0, 1), i64({0, 1, 2, 3, 4}, {5})),
                        Error, mentions({"select_rows_", "contiguous last dim"}));
  BOOST_CHECK_EXCEPTION(select_rows_(zeros({5}), i64({0, 1, 2, 3, 4}, {5})), Error,
                        mentions({"select_rows_", ">= 2 dims"}));
  BOOST_CHECK_EXCEPTION(
      select_rows_(broadcast_to(zeros({1, 3}), {5, 3}), i64({0, 1, 2, 3, 4}, {5})), Error,
      mentions({"select_rows_", "do not overlap"}));
}

// ---- embedding ----
BOOST_AUTO_TEST_CASE(embedding_values_and_padding_gradient) {
  Tensor w = iota_shaped({4, 2}).requires_grad_();
  Tensor ids = i64({3, 0, 3, 1, 0, 3}, {2, 3});
  Tensor y = embedding(w, ids, /*padding_idx=*/0);
  BOOST_TEST(y.shape() == Shape({2, 3, 2}));
  // The padding row is still looked up (PyTorch does the same).
  BOOST_TEST(vals(y) == V({6, 7, 0, 1, 6, 7, 2, 3, 0, 1, 6, 7}), boost::test_tools::per_element());
  Tensor g = f64({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
  // Row 3: positions 0, 2, 5; row 1: position 3; row 0 (padding): no gradient; row 2: unused.
  BOOST_TEST(grad_of(w, y, g) == V({0, 0, 7, 8, 0, 0, 1 + 5 + 11, 2 + 6 + 12}),
             boost::test_tools::per_element());
  // Without padding, row 0 collects positions 1 and 4.
  Tensor y2 = embedding(w, ids);
  BOOST_TEST(grad_of(w, y2, g)[0] == 3 + 9);
}

BOOST_AUTO_TEST_CASE(embedding_float32_and_saved_ids_checked) {
  Tensor w = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor ids = i64({1, 1}, {2});
  Tensor y = embedding(w, ids);
  BOOST_TEST(vals(y) == V({3, 4, 3, 4}), boost::test_tools::per_element());
  // Changing the ids after the forward would make the scatter wrong: backward refuses.
  fill_(ids, 0);
  BOOST_CHECK_EXCEPTION(y.backward(ones({2, 2})), Error,
                        mentions({"embedding", "modified in place"}));
  autograd::clear_tape();
}

// split_heads against the view it replaces: y (B, T, parts * H * Dh) as (B, T, parts, H, Dh)
// permuted to (parts, B, H, T, Dh); merge_heads undoes it.
BOOST_AUTO_TEST_CASE(split_and_merge_heads_values) {
  Generator g(3);
  const int64_t B = 2, T = 5, P = 3, H = 2, Dh = 4;
  Tensor y = randn({B, T, P * H * Dh}, DType::f32, g);
  Tensors parts = split_heads(y, P, H);
  BOOST_REQUIRE_EQUAL(parts.size(), (size_t)P);
  Tensor want = permute(reshape(y, {B, T, P, H, Dh}), {2, 0, 3, 1, 4});
  for (int64_t p = 0; p < P; ++p) {
    BOOST_CHECK(parts[p].is_contiguous());
    BOOST_CHECK(parts[p].shape() == Shape({B, H, T, Dh}));
    const auto got = parts[p].to_vector<double>();
    const auto ref = contiguous(squeeze(slice(want, 0, p, p + 1), 0)).to_vector<double>();
    BOOST_CHECK(got == ref);
  }
  Tensor one = randn({B, T, H * Dh}, DType::f32, g);
  BOOST_CHECK(merge_heads(split_heads(one, 1, H)[0]).to_vector<double>() ==
              one.to_vector<double>());
}

// Issue 31: copy_into between overlapping views of one storage copies as memmove does (the
// source is read completely first), in either direction and for an in-place transpose.
BOOST_AUTO_TEST_CASE(copy_into_overlapping_views_copies_as_memmove) {
  Tensor base = iota({6});
  copy_into(Tensor::view_of(base, {5}, {1}, 1), Tensor::view_of(base, {5}, {1}, 0));
  BOOST_TEST(vals(base) == (V{0, 0, 1, 2, 3, 4}));
  base = iota({6});
  copy_into(Tensor::view_of(base, {5}, {1}, 0), Tensor::view_of(base, {5}, {1}, 1));
  BOOST_TEST(vals(base) == (V{1, 2, 3, 4, 5, 5}));
  Tensor sq = iota_shaped({2, 2});
  copy_into(sq, transpose(sq, 0, 1));
  BOOST_TEST(vals(sq) == (V{0, 2, 1, 3}));
  // Disjoint views of one storage copy directly (and correctly).
  base = iota({6});
  copy_into(Tensor::view_of(base, {3}, {1}, 3), Tensor::view_of(base, {3}, {1}, 0));
  BOOST_TEST(vals(base) == (V{0, 1, 2, 0, 1, 2}));
}

// A destination whose elements share memory (broadcast_to, stride 0, strides that fold back) is
// refused; an unusual layout whose elements are distinct is accepted.
BOOST_AUTO_TEST_CASE(copy_into_refuses_a_destination_with_overlapping_elements) {
  const Tensor row = iota({1, 3});
  BOOST_CHECK_EXCEPTION(copy_into(broadcast_to(row, {2, 3}), iota_shaped({2, 3})), Error,
                        mentions({"copy_into", "share memory", "(0, 1)"}));
  BOOST_TEST(vals(row) == (V{0, 1, 2}));
  const Tensor three = iota({3});
  BOOST_CHECK_EXCEPTION(copy_into(Tensor::view_of(three, {2, 2}, {1, 1}, 0), iota_shaped({2, 2})),
                        Error, mentions({"copy_into", "share memory"}));
  // Offsets 2i + 3j for (3, 2): 0, 3, 2, 5, 4, 7, all distinct though the strides interleave.
  Tensor eight = zeros({8}, DType::f64);
  copy_into(Tensor::view_of(eight, {3, 2}, {2, 3}, 0), iota_shaped({3, 2}));
  BOOST_TEST(vals(eight) == (V{0, 0, 2, 1, 4, 3, 0, 5}));
}

BOOST_AUTO_TEST_SUITE_END()
