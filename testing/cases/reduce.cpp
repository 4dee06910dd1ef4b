// The op records of ops/reduce.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_reduce_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {

std::vector<ErrorInput> sum_error_inputs() {
  return {{"axis 2 of a rank-2 input",
           [] {
             sum(ones({2, 3}), {2});
           },
           "sum: axis 2 out of range for rank 2"},
          {"an int64 input", [] { sum(ones({2}, DType::i64)); },
           "sum: expected a float tensor, got i64 (2)"}};
}

void reduce_samples(Samples& s) {
  add_sample(s, one_input_case("sum/axes_keepdim", "sum", {2, 3, 4},
                               /*transposed=*/true, [](const Tensor& x) {
                                 return sum(x, {0, -1}, true);
                               }));
  add_sample(s, one_input_case("sum/all", "sum", {3, 4}, /*transposed=*/false,
                               [](const Tensor& x) { return sum(x); }));
  add_sample(s, one_input_case("sum/size1_axis", "sum", {1, 3, 4}, /*transposed=*/true,
                               [](const Tensor& x) { return sum(x, {0}); }));
  add_sample(s, one_input_case("mean/axis", "mean", {2, 3, 4}, /*transposed=*/true,
                               [](const Tensor& x) { return mean(x, {1}); }));
  add_sample(s, one_input_case("max/axis", "max", {2, 3, 4}, /*transposed=*/true,
                               [](const Tensor& x) { return max(x, 1, true); }));
  add_sample(
      s, one_input_case("amax/axes", "amax", {2, 3, 4}, /*transposed=*/true, [](const Tensor& x) {
        return amax(x, {0, -1});
      }));
  add_sample(s, one_input_case("amax/all_keepdim", "amax", {3, 4}, /*transposed=*/false,
                               [](const Tensor& x) { return amax(x, {}, true); }));
  add_sample(s, one_input_case("var/unbiased", "var", {2, 3, 4}, /*transposed=*/true,
                               [](const Tensor& x) { return var(x, {-1}); }));
  add_sample(s, one_input_case("var/biased_all", "var", {3, 4}, /*transposed=*/false,
                               [](const Tensor& x) { return var(x, {}, false, 0); }));
  add_sample(s, one_input_case("sum_to/broadcast", "sum_to", {2, 3, 4}, /*transposed=*/true,
                               [](const Tensor& x) {
                                 return sum_to(x, {3, 1});
                               }));
}

void record_sum(Samples& s) {
  register_op(OpRecord{.name = "sum",
                       .family = "reduce",
                       .forward = "sum",
                       .backward = "sum_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "sum"),
                       .error_inputs = sum_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_mean(Samples& s) {
  register_op(OpRecord{.name = "mean",
                       .family = "reduce",
                       .forward = "mean",
                       .backward = "mean_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "mean"),
                       .error_inputs = {{"axes 0 and -2 of a rank-2 input (the same axis)",
                                         [] {
                                           mean(ones({2, 3}), {0, -2});
                                         },
                                         "mean: repeated axis in reduction over rank 2"}},
                       .nonfinite = nan_propagates()});
}

void record_max(Samples& s) {
  register_op(OpRecord{.name = "max",
                       .family = "reduce",
                       .forward = "max",
                       .backward = "max_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "max"),
                       .error_inputs = {{"an empty axis",
                                         [] {
                                           max(ones({2, 0}), 1);
                                         },
                                         "max: axis 1 of f32 (2, 0) is empty"}},
                       .nonfinite = nan_propagates()});
}

void record_amax(Samples& s) {
  register_op(OpRecord{.name = "amax",
                       .family = "reduce",
                       .forward = "amax",
                       .backward = "amax_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "amax"),
                       .error_inputs = {{"an empty axis",
                                         [] {
                                           amax(ones({2, 0}), {1});
                                         },
                                         "amax: axis 1 of f32 (2, 0) is empty"}},
                       .nonfinite = nan_propagates()});
}

void record_var(Samples& s) {
  register_op(OpRecord{.name = "var",
                       .family = "reduce",
                       .forward = "var",
                       .backward = "composite",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "var"),
                       .error_inputs = {{"one element per row with correction 1",
                                         [] {
                                           var(ones({2, 1}), {1});
                                         },
                                         "var: 1 elements with correction 1 in f32 (2, 1)"}},
                       .nonfinite = nan_propagates()});
}

void record_sum_to(Samples& s) {
  register_op(OpRecord{.name = "sum_to",
                       .family = "reduce",
                       .forward = "sum_to",
                       .backward = "composite",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "sum_to"),
                       .error_inputs = {{"a shape that x does not broadcast to",
                                         [] {
                                           sum_to(ones({2, 3}), {4});
                                         },
                                         "sum_to: cannot reduce f32 (2, 3) to shape (4)"}},
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_reduce_cases() {
  Samples s;
  reduce_samples(s);
  record_sum(s);
  record_mean(s);
  record_max(s);
  record_amax(s);
  record_var(s);
  record_sum_to(s);
  check_all_taken(s, "reduce");
}

}  // namespace graft
