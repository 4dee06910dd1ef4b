// The op records of ops/rope.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_rope_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {
void rope_samples(Samples& s) {
  // Heads as a permuted view of a (B, T, H, D) projection, positions not starting at 0.
  add_sample(
      s,
      one_input_case(
          "rope/head_view_offset", "rope", {2, 3, 2, 6}, /*transposed=*/false, [](const Tensor& x) {
            return rope(permute(x, {0, 2, 1, 3}), from_vector(std::vector<int64_t>{5, 6, 7}, {3}));
          }));
  add_sample(
      s, backward_op_case("rope_backward/offset", "rope_backward", {2, 3, 4}, {2, 3, 4},
                          [](const Tensor& x) {
                            return rope(x, from_vector(std::vector<int64_t>{2, 5, 7}, {3}), 100.0);
                          }));
  // A frequency table of Llama 3's kind: some pairs slowed, one blended, some kept.
  add_sample(s, one_input_case("rope/frequency_table", "rope", {2, 3, 6}, /*transposed=*/false,
                               [](const Tensor& x) {
                                 return rope(x, from_vector(std::vector<int64_t>{0, 4, 9}, {3}),
                                             std::vector<double>{1.0, 0.02, 0.3});
                               }));
  add_sample(
      s, OpCase{.name = "rope/transposed_small_base",
                .op = "rope",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input_t({4, 4}, dt, g)};
                    },
                .fn =
                    [](const Tensors& x) {
                      return rope(x[0], from_vector(std::vector<int64_t>{0, 3, 1, 9}, {4}), 100.0);
                    }});
}

void record_rope(Samples& s) {
  register_op(OpRecord{
      .name = "rope",
      .family = "rope",
      .forward = "rope",
      .backward = "rope_backward",
      .double_backward = DoubleBackward::backward_op,
      .double_backward_op = "rope_backward",
      .samples = take(s, "rope"),
      .error_inputs =
          {{"positions of another length",
            [] {
              rope(zeros({1, 3, 4}), from_vector(std::vector<int64_t>{0, 1}, {2}, DType::i64));
            },
            "rope: x f32 (1, 3, 4), positions i64 (2): positions must be int64 (T) = (3)"},
           {"a frequency table of another length",
            [] {
              rope(zeros({1, 3, 4}), from_vector(std::vector<int64_t>{0, 1, 2}, {3}, DType::i64),
                   std::vector<double>{1.0});
            },
            "rope: x f32 (1, 3, 4), positions i64 (3): inv_freq has 1 entries, D / 2 = 2"}},
      .nonfinite = nan_propagates()});
}

void record_rope_backward(Samples& s) {
  register_op(
      OpRecord{.name = "rope_backward",
               .family = "rope",
               .forward = "rope",
               .backward = "rotate",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "rope_backward"),
               .error_inputs = {freed_graph_error(
                   "rope_backward", {1, 3, 4},
                   [](const Tensor& x) {
                     return rope(x, from_vector(std::vector<int64_t>{0, 1, 2}, {3}, DType::i64));
                   })},
               .nonfinite = nan_propagates()});
}

}  // namespace

void register_rope_cases() {
  Samples s;
  rope_samples(s);
  record_rope(s);
  record_rope_backward(s);
  check_all_taken(s, "rope");
}

}  // namespace graft
