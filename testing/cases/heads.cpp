// The op records of ops/heads.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_heads_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {
// ---- gradcheck cases -------------------------------------------------------------------------

void heads_samples(Samples& s) {
  // Every part used, one of them twice, so each part's gradient differs.
  add_sample(s, OpCase{.name = "split_heads/qkv",
                       .op = "split_heads",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3, 12}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             Tensors p = split_heads(x[0], 3, 2);
                             return add(mul(p[0], p[1]), mul(p[2], p[2]));
                           }});
  // A part without gradient, from a non-contiguous input.
  add_sample(s, one_input_case("split_heads/unused_part_noncontiguous", "split_heads", {2, 3, 4},
                               /*transposed=*/true,
                               [](const Tensor& x) { return split_heads(x, 2, 1)[1]; }));
  add_sample(s,
             one_input_case("merge_heads/noncontiguous", "merge_heads", {2, 3, 2, 4},
                            /*transposed=*/true, [](const Tensor& x) { return merge_heads(x); }));
}

void record_split_heads(Samples& s) {
  register_op(OpRecord{.name = "split_heads",
                       .family = "shape",
                       .forward = "split_heads",
                       .backward = "split_heads_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "split_heads"),
                       .error_inputs = {{"parts * heads not dividing the width",
                                         [] {
                                           split_heads(zeros({2, 5, 24}), 5, 2);
                                         },
                                         "split_heads: y f32 (2, 5, 24) must be (B, T, parts * "
                                         "heads * Dh) with parts 5 > 0 and heads 2 > 0"},
                                        {"a rank-2 y",
                                         [] {
                                           split_heads(zeros({2, 3}), 1, 1);
                                         },
                                         "split_heads: y f32 (2, 3) must be (B, T, parts * heads "
                                         "* Dh) with parts 1 > 0 and heads 1 > 0"}},
                       .nonfinite = nan_propagates()});
}

void record_merge_heads(Samples& s) {
  register_op(OpRecord{.name = "merge_heads",
                       .family = "shape",
                       .forward = "merge_heads",
                       .backward = "merge_heads_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "merge_heads"),
                       .error_inputs = {{"a rank-3 x",
                                         [] {
                                           merge_heads(zeros({2, 5, 24}));
                                         },
                                         "merge_heads: x f32 (2, 5, 24) must be (B, H, T, Dh)"}},
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_heads_cases() {
  Samples s;
  heads_samples(s);
  record_split_heads(s);
  record_merge_heads(s);
  check_all_taken(s, "heads");
}

}  // namespace graft
