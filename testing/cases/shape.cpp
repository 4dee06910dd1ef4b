// The op records of ops/shape.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_shape_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {

Tensor int64_ids(std::vector<int64_t> v, const Shape& shape) { return from_vector(v, shape); }

// ---- the bad inputs of each op and the errors they raise ----

std::vector<ErrorInput> reshape_error_inputs() {
  return {{"(4, 2) for 6 elements",
           [] {
             reshape(zeros({2, 3}), {4, 2});
           },
           "reshape: cannot reshape f32 (2, 3) (6 elements) into (4, 2) (8 elements)"},
          {"(4, -1) for 6 elements",
           [] {
             reshape(zeros({2, 3}), {4, -1});
           },
           "reshape: cannot reshape f32 (2, 3) (6 elements) into (4, -1)"},
          {"two -1 dims",
           [] {
             reshape(zeros({2, 3}), {-1, -1});
           },
           "reshape: f32 (2, 3) to (-1, -1): only one dimension can be -1"},
          {"a dim below -1",
           [] {
             reshape(zeros({2, 3}), {-2, -3});
           },
           "reshape: f32 (2, 3) to (-2, -3): invalid dimension -2"},
          {"-1 beside a 0 dim of an empty input",
           [] {
             reshape(zeros({0, 3}), {0, -1});
           },
           "reshape: cannot reshape f32 (0, 3) (0 elements) into (0, -1)"}};
}

std::vector<ErrorInput> permute_error_inputs() {
  const std::string rule = " are not a permutation of the 3 axes of f32 (2, 3, 4)";
  return {{"a repeated axis",
           [] {
             permute(zeros({2, 3, 4}), {0, 0, 1});
           },
           "permute: dims (0, 0, 1)" + rule},
          {"too few dims",
           [] {
             permute(zeros({2, 3, 4}), {0, 1});
           },
           "permute: dims (0, 1)" + rule},
          {"an axis out of range",
           [] {
             permute(zeros({2, 3, 4}), {0, 1, 3});
           },
           "permute: dims (0, 1, 3)" + rule}};
}

std::vector<ErrorInput> transpose_error_inputs() {
  return {{"axis 3 of a rank-3 input",
           [] {
             transpose(zeros({2, 3, 4}), 0, 3);
           },
           "transpose: axis 3 out of range for input f32 (2, 3, 4)"},
          {"axis -4 of a rank-3 input",
           [] {
             transpose(zeros({2, 3, 4}), -4, 0);
           },
           "transpose: axis -4 out of range for input f32 (2, 3, 4)"}};
}

std::vector<ErrorInput> slice_error_inputs() {
  return {{"step 0",
           [] {
             slice(zeros({3, 4}), 0, 0, 2, 0);
           },
           "slice: step must be >= 1, got 0 (input f32 (3, 4), axis 0)"},
          {"a negative step",
           [] {
             slice(zeros({3, 4}), 0, 2, 0, -1);
           },
           "slice: step must be >= 1, got -1 (input f32 (3, 4), axis 0)"},
          {"axis 2 of a rank-2 input",
           [] {
             slice(zeros({3, 4}), 2, 0, 1);
           },
           "slice: axis 2 out of range for input f32 (3, 4)"}};
}

std::vector<ErrorInput> unsqueeze_error_inputs() {
  return {{"axis 3 of a rank-2 input",
           [] {
             unsqueeze(zeros({2, 1}), 3);
           },
           "unsqueeze: axis 3 out of range for input f32 (2, 1)"},
          {"axis -4 of a rank-2 input",
           [] {
             unsqueeze(zeros({2, 1}), -4);
           },
           "unsqueeze: axis -4 out of range for input f32 (2, 1)"}};
}

std::vector<ErrorInput> squeeze_error_inputs() {
  return {{"an axis of size 2",
           [] {
             squeeze(zeros({2, 1}), 0);
           },
           "squeeze: axis 0 of f32 (2, 1) has size 2, expected 1"},
          {"axis 2 of a rank-2 input",
           [] {
             squeeze(zeros({2, 1}), 2);
           },
           "squeeze: axis 2 out of range for input f32 (2, 1)"}};
}

std::vector<ErrorInput> broadcast_to_error_inputs() {
  const std::string rule = "broadcast_to: cannot broadcast f32 (2, 3) to ";
  return {{"a dim of another size",
           [] {
             broadcast_to(zeros({2, 3}), {4, 3});
           },
           rule + "(4, 3)"},
          {"fewer dims",
           [] {
             broadcast_to(zeros({2, 3}), {3});
           },
           rule + "(3)"},
          {"a negative dim",
           [] {
             broadcast_to(zeros({2, 3}), {-1, 2, 3});
           },
           rule + "(-1, 2, 3)"}};
}

std::vector<ErrorInput> to_dtype_error_inputs() {
  return {{"an undefined tensor", [] { to_dtype(Tensor(), DType::f32); },
           "to_dtype: got an undefined tensor"}};
}

std::vector<ErrorInput> concat_error_inputs() {
  return {{"no tensors", [] { concat({}, 0); }, "concat: needs at least one tensor"},
          {"mixed dtypes",
           [] {
             concat({zeros({2, 3}), zeros({2, 3}, DType::f64)}, 0);
           },
           "concat: dtype mismatch, input 0 is f32 (2, 3) and input 1 is f64 (2, 3)"},
          {"another size outside the axis",
           [] {
             concat({zeros({2, 3}), zeros({3, 3})}, 1);
           },
           "concat: input 1 f32 (3, 3) does not match input 0 f32 (2, 3) outside axis 1"},
          {"another rank",
           [] {
             concat({zeros({2, 3}), zeros({2, 3, 1})}, 0);
           },
           "concat: input 1 f32 (2, 3, 1) does not match input 0 f32 (2, 3) outside axis 0"},
          {"axis 2 of rank-2 inputs",
           [] {
             concat({zeros({2, 3}), zeros({2, 3})}, 2);
           },
           "concat: axis 2 out of range for input f32 (2, 3)"},
          {"0-d inputs",
           [] {
             concat({scalar(1), scalar(2)}, 0);
           },
           "concat: cannot concatenate 0-d tensors, got f32 ()"}};
}

std::vector<ErrorInput> split_error_inputs() {
  return {{"sizes that do not sum to the axis",
           [] {
             split(zeros({2, 4}), {1, 2}, 1);
           },
           "split: sizes (1, 2) sum to 3 but axis 1 of f32 (2, 4) has size 4"},
          {"a negative size",
           [] {
             split(zeros({2, 4}), {5, -1}, 1);
           },
           "split: negative size in (5, -1) for input f32 (2, 4)"},
          {"axis 2 of a rank-2 input",
           [] {
             split(zeros({2, 4}), {2}, 2);
           },
           "split: axis 2 out of range for input f32 (2, 4)"}};
}

std::vector<ErrorInput> index_select_error_inputs() {
  const std::string input = " (input f32 (5, 3))";
  return {{"an index past the axis",
           [] {
             index_select(zeros({5, 3}), 0, int64_ids({1, 5}, {2}));
           },
           "index_select: index 5 (position 1) out of range for axis 0 of size 5" + input},
          {"a negative index",
           [] {
             index_select(zeros({5, 3}), 1, int64_ids({-1}, {1}));
           },
           "index_select: index -1 (position 0) out of range for axis 1 of size 3" + input},
          {"a float index",
           [] {
             index_select(zeros({5, 3}), 0, zeros({2}));
           },
           "index_select: index must be a 1-D int64 tensor, got f32 (2)" + input},
          {"a 2-D index",
           [] {
             index_select(zeros({5, 3}), 0, int64_ids({0, 1}, {1, 2}));
           },
           "index_select: index must be a 1-D int64 tensor, got i64 (1, 2)" + input},
          {"axis 2 of a rank-2 input",
           [] {
             index_select(zeros({5, 3}), 2, int64_ids({0}, {1}));
           },
           "index_select: axis 2 out of range for input f32 (5, 3)"}};
}

std::vector<ErrorInput> embedding_error_inputs() {
  return {{"an id past the vocabulary",
           [] {
             embedding(zeros({5, 3}), int64_ids({0, 7}, {2}));
           },
           "embedding: id 7 out of range [0, 5) for weight f32 (5, 3) (ids i64 (2))"},
          {"a negative id",
           [] {
             embedding(zeros({5, 3}), int64_ids({-2}, {1}));
           },
           "embedding: id -2 out of range [0, 5) for weight f32 (5, 3) (ids i64 (1))"},
          {"float ids",
           [] {
             embedding(zeros({5, 3}), zeros({2}));
           },
           "embedding: ids must be int64, got f32 (2) (weight f32 (5, 3))"},
          {"a 1-D weight", [] { embedding(zeros({5}), int64_ids({0}, {1})); },
           "embedding: weight must be 2-D (V, C), got f32 (5)"},
          {"an int64 weight",
           [] {
             embedding(zeros({5, 3}, DType::i64), int64_ids({0}, {1}));
           },
           "embedding: expected a float tensor, got i64 (5, 3)"},
          {"padding_idx past the vocabulary",
           [] {
             embedding(zeros({5, 3}), int64_ids({0}, {1}), 5);
           },
           "embedding: padding_idx 5 out of range for weight f32 (5, 3)"}};
}

void view_samples(Samples& s) {
  add_sample(s, one_input_case("reshape/infer", "reshape", {2, 3, 4}, /*transposed=*/false,
                               [](const Tensor& x) {
                                 return reshape(x, {4, -1});
                               }));
  add_sample(s, one_input_case("reshape/noncontiguous_copy", "reshape", {2, 3, 4},
                               /*transposed=*/true, [](const Tensor& x) {
                                 return reshape(x, {6, 4});
                               }));
  add_sample(s, one_input_case("reshape/noncontiguous_view", "reshape", {2, 3, 4},
                               /*transposed=*/true, [](const Tensor& x) {
                                 return reshape(x, {2, 1, 3, 2, 2});
                               }));
  add_sample(s, one_input_case("permute/3d", "permute", {2, 3, 4}, /*transposed=*/false,
                               [](const Tensor& x) {
                                 return permute(x, {2, 0, 1});
                               }));
  add_sample(s, one_input_case("permute/noncontiguous", "permute", {2, 3, 4}, /*transposed=*/true,
                               [](const Tensor& x) {
                                 return permute(x, {1, -1, 0});
                               }));
  add_sample(s, one_input_case("transpose/last_two", "permute", {2, 3, 4}, /*transposed=*/true,
                               [](const Tensor& x) { return transpose(x, -1, -2); }));
  add_sample(s, backward_op_case("slice_backward/step", "slice_backward", {5, 4}, {2, 4},
                                 [](const Tensor& x) { return slice(x, 0, 1, 5, 2); }));
  add_sample(s, one_input_case("slice/step", "slice", {5, 4}, /*transposed=*/false,
                               [](const Tensor& x) { return slice(x, 0, 1, 5, 2); }));
  add_sample(s, one_input_case("slice/negative_clamped_noncontiguous", "slice", {3, 4, 5},
                               /*transposed=*/true,
                               [](const Tensor& x) { return slice(x, -1, -4, 100); }));
  add_sample(s, one_input_case("unsqueeze/noncontiguous", "unsqueeze", {3, 4}, /*transposed=*/true,
                               [](const Tensor& x) { return unsqueeze(x, 1); }));
  add_sample(s, one_input_case("unsqueeze/last", "unsqueeze", {3, 4}, /*transposed=*/false,
                               [](const Tensor& x) { return unsqueeze(x, -1); }));
  add_sample(s, one_input_case("squeeze/noncontiguous", "squeeze", {4, 1, 3}, /*transposed=*/true,
                               [](const Tensor& x) { return squeeze(x, -2); }));
  add_sample(s, one_input_case("broadcast_to/lead_and_inner", "broadcast_to", {3, 1},
                               /*transposed=*/false, [](const Tensor& x) {
                                 return broadcast_to(x, {2, 3, 4});
                               }));
  add_sample(s, one_input_case("broadcast_to/noncontiguous", "broadcast_to", {1, 3, 2},
                               /*transposed=*/true, [](const Tensor& x) {
                                 return broadcast_to(x, {4, 3, 2});
                               }));
}

void copy_samples(Samples& s) {
  add_sample(s, one_input_case("contiguous/transposed", "contiguous", {3, 4}, /*transposed=*/true,
                               [](const Tensor& x) { return contiguous(x); }));
  // The round trip through float32 rounds x; with a wide central difference (eps 0.1 on a linear
  // function) the rounding error (~1e-7) stays far below atol.
  add_sample(s, OpCase{.name = "to_dtype/round_trip",
                       .op = "to_dtype",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({3, 4}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             const DType other =
                                 case_dtype(x[0]) == DType::f32 ? DType::f64 : DType::f32;
                             return to_dtype(to_dtype(x[0], other), case_dtype(x[0]));
                           },
                       .opt = {.eps = 0.1}});
  add_sample(s, OpCase{.name = "concat/inner_axis_noncontiguous",
                       .op = "concat",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3}, dt, g), case_input_t({2, 1}, dt, g),
                                            case_input_t({2, 4}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return concat(x, -1); }});
  add_sample(
      s, OpCase{.name = "concat/outer_axis",
                .op = "concat",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input({1, 2, 3}, dt, g), case_input_t({2, 2, 3}, dt, g)};
                    },
                .fn = [](const Tensors& x) { return concat(x, 0); }});
  add_sample(s, one_input_case("split/one_piece_used", "split", {3, 6}, /*transposed=*/true,
                               [](const Tensor& x) {
                                 return split(x, {1, 3, 2}, 1)[1];
                               }));
  add_sample(s, OpCase{.name = "split/all_pieces_reordered",
                       .op = "split",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({5, 2, 2}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             Tensors p = split(x[0], {2, 0, 3}, 0);
                             return concat({p[2], p[1], p[0]}, 0);
                           }});
}

void gather_samples(Samples& s) {
  add_sample(s,
             backward_op_case(
                 "index_select_backward/repeated_rows", "index_select_backward", {5, 3}, {5, 3},
                 [](const Tensor& x) {
                   return index_select(x, 0, from_vector(std::vector<int64_t>{4, 0, 4, 2, 4}, {5}));
                 }));
  add_sample(
      s, backward_op_case(
             "embedding_backward/padding_idx", "embedding_backward", {5, 3}, {2, 3, 3},
             [](const Tensor& x) {
               return embedding(x, from_vector(std::vector<int64_t>{3, 0, 3, 1, 0, 4}, {2, 3}), 0);
             }));
  add_sample(
      s,
      OpCase{
          .name = "index_select/repeated_rows",
          .op = "index_select",
          .make_inputs =
              [](DType dt, Generator& g) {
                return Tensors{case_input({5, 3}, dt, g)};
              },
          .fn =
              [](const Tensors& x) {
                return index_select(x[0], 0, from_vector(std::vector<int64_t>{4, 0, 4, 2, 4}, {5}));
              }});
  add_sample(
      s,
      OpCase{.name = "index_select/inner_axis_noncontiguous",
             .op = "index_select",
             .make_inputs =
                 [](DType dt, Generator& g) {
                   return Tensors{case_input_t({2, 3, 4}, dt, g)};
                 },
             .fn =
                 [](const Tensors& x) {
                   return index_select(x[0], 1, from_vector(std::vector<int64_t>{2, 2, 0, 1}, {4}));
                 }});
}

// embedding: repeated ids, a non-contiguous weight, padding_idx.
void embedding_samples(Samples& s) {
  add_sample(
      s,
      OpCase{
          .name = "embedding/repeated_ids",
          .op = "embedding",
          .make_inputs =
              [](DType dt, Generator& g) {
                return Tensors{case_input({6, 4}, dt, g)};
              },
          .fn =
              [](const Tensors& x) {
                return embedding(x[0], from_vector(std::vector<int64_t>{1, 5, 1, 0, 2, 1}, {2, 3}));
              }});
  add_sample(
      s, OpCase{.name = "embedding/noncontiguous_weight",
                .op = "embedding",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input_t({5, 3}, dt, g)};
                    },
                .fn =
                    [](const Tensors& x) {
                      return embedding(x[0], from_vector(std::vector<int64_t>{4, 4, 0, 3}, {4}));
                    }});
  // padding_idx rows get no gradient although the forward reads them, which central differences
  // would see; so the case drops the padded positions (flat 1 and 4) from the output and checks
  // the non-padded rows, repeated ids included. tests/test_shape.cpp checks the padded row's zero.
  add_sample(s, OpCase{.name = "embedding/padding_idx",
                       .op = "embedding",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({5, 3}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             Tensor out = embedding(
                                 x[0], from_vector(std::vector<int64_t>{3, 0, 3, 1, 0, 4}, {2, 3}),
                                 /*padding_idx=*/0);
                             return index_select(
                                 reshape(out, {6, 3}), 0,
                                 from_vector(std::vector<int64_t>{0, 2, 3, 5}, {4}));
                           }});
}

void shape_samples(Samples& s) {
  view_samples(s);
  copy_samples(s);
  gather_samples(s);
  embedding_samples(s);
}

void record_reshape(Samples& s) {
  register_op(OpRecord{.name = "reshape",
                       .family = "shape",
                       .forward = "reshape",
                       .backward = "reshape_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "reshape"),
                       .error_inputs = reshape_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_permute(Samples& s) {
  register_op(OpRecord{.name = "permute",
                       .family = "shape",
                       .forward = "permute",
                       .backward = "permute_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "permute"),
                       .error_inputs = joined({permute_error_inputs(), transpose_error_inputs()}),
                       .nonfinite = nan_propagates()});
}

void record_slice_backward(Samples& s) {
  register_op(
      OpRecord{.name = "slice_backward",
               .family = "shape",
               .forward = "slice",
               .backward = "slice",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "slice_backward"),
               .error_inputs = {freed_graph_error(
                   "slice_backward", {2, 3}, [](const Tensor& x) { return slice(x, 1, 0, 2); })},
               .nonfinite = nan_propagates()});
}

void record_slice(Samples& s) {
  register_op(OpRecord{.name = "slice",
                       .family = "shape",
                       .forward = "slice",
                       .backward = "slice_backward",
                       .double_backward = DoubleBackward::backward_op,
                       .double_backward_op = "slice_backward",
                       .samples = take(s, "slice"),
                       .error_inputs = slice_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_unsqueeze(Samples& s) {
  register_op(OpRecord{.name = "unsqueeze",
                       .family = "shape",
                       .forward = "unsqueeze",
                       .backward = "reshape_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "unsqueeze"),
                       .error_inputs = unsqueeze_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_squeeze(Samples& s) {
  register_op(OpRecord{.name = "squeeze",
                       .family = "shape",
                       .forward = "squeeze",
                       .backward = "reshape_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "squeeze"),
                       .error_inputs = squeeze_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_broadcast_to(Samples& s) {
  register_op(OpRecord{.name = "broadcast_to",
                       .family = "shape",
                       .forward = "broadcast_to",
                       .backward = "broadcast_to_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "broadcast_to"),
                       .error_inputs = broadcast_to_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_contiguous(Samples& s) {
  register_op(OpRecord{.name = "contiguous",
                       .family = "shape",
                       .forward = "contiguous",
                       .backward = "contiguous_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "contiguous"),
                       .error_inputs = {{"an undefined tensor", [] { contiguous(Tensor()); },
                                         "contiguous: got an undefined tensor"}},
                       .nonfinite = nan_propagates()});
}

void record_to_dtype(Samples& s) {
  register_op(OpRecord{.name = "to_dtype",
                       .family = "shape",
                       .forward = "to_dtype",
                       .backward = "to_dtype_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "to_dtype"),
                       .error_inputs = to_dtype_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_concat(Samples& s) {
  register_op(OpRecord{.name = "concat",
                       .family = "shape",
                       .forward = "concat",
                       .backward = "concat_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "concat"),
                       .error_inputs = concat_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_split(Samples& s) {
  register_op(OpRecord{.name = "split",
                       .family = "shape",
                       .forward = "split",
                       .backward = "split_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "split"),
                       .error_inputs = split_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_index_select_backward(Samples& s) {
  register_op(OpRecord{
      .name = "index_select_backward",
      .family = "shape",
      .forward = "index_select",
      .backward = "index_select",
      .double_backward = DoubleBackward::composed,
      .samples = take(s, "index_select_backward"),
      .error_inputs = {freed_graph_error(
          "index_select_backward", {3, 2},
          [](const Tensor& x) {
            return index_select(x, 0, from_vector(std::vector<int64_t>{2, 0}, {2}, DType::i64));
          })},
      .nonfinite = nan_propagates()});
}

void record_embedding_backward(Samples& s) {
  register_op(
      OpRecord{.name = "embedding_backward",
               .family = "shape",
               .forward = "embedding",
               .backward = "embedding",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "embedding_backward"),
               .error_inputs = {freed_graph_error(
                   "embedding_backward", {5, 4},
                   [](const Tensor& x) {
                     return embedding(x, from_vector(std::vector<int64_t>{1, 3}, {2}, DType::i64));
                   })},
               .nonfinite = nan_propagates()});
}

void record_index_select(Samples& s) {
  register_op(OpRecord{.name = "index_select",
                       .family = "shape",
                       .forward = "index_select",
                       .backward = "index_select_backward",
                       .double_backward = DoubleBackward::backward_op,
                       .double_backward_op = "index_select_backward",
                       .samples = take(s, "index_select"),
                       .error_inputs = index_select_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_embedding(Samples& s) {
  register_op(OpRecord{.name = "embedding",
                       .family = "shape",
                       .forward = "embedding",
                       .backward = "embedding_backward",
                       .double_backward = DoubleBackward::backward_op,
                       .double_backward_op = "embedding_backward",
                       .samples = take(s, "embedding"),
                       .error_inputs = embedding_error_inputs(),
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_shape_cases() {
  Samples s;
  shape_samples(s);
  record_reshape(s);
  record_permute(s);
  record_slice_backward(s);
  record_slice(s);
  record_unsqueeze(s);
  record_squeeze(s);
  record_broadcast_to(s);
  record_contiguous(s);
  record_to_dtype(s);
  record_concat(s);
  record_split(s);
  record_index_select_backward(s);
  record_embedding_backward(s);
  record_index_select(s);
  record_embedding(s);
  check_all_taken(s, "shape");
}

}  // namespace graft
