// The op records of ops/softmax.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_softmax_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {
void softmax_samples(Samples& s) {
  // Wide input range so the outputs are far from uniform and the gradient is not trivially small.
  add_sample(s, OpCase{.name = "softmax/last_axis",
                       .op = "softmax",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({3, 5}, dt, g, -2, 2)};
                           },
                       .fn = [](const Tensors& x) { return softmax(x[0], -1); }});
  add_sample(s, OpCase{.name = "softmax/middle_axis_transposed",
                       .op = "softmax",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({2, 4, 3}, dt, g, -2, 2)};
                           },
                       .fn = [](const Tensors& x) { return softmax(x[0], 1); }});
  add_sample(s, OpCase{.name = "log_softmax/last_axis_transposed",
                       .op = "log_softmax",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({3, 5}, dt, g, -2, 2)};
                           },
                       .fn = [](const Tensors& x) { return log_softmax(x[0], -1); }});
  add_sample(s, OpCase{.name = "log_softmax/middle_axis",
                       .op = "log_softmax",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 4, 3}, dt, g, -2, 2)};
                           },
                       .fn = [](const Tensors& x) { return log_softmax(x[0], -2); }});
}

void record_softmax(Samples& s) {
  register_op(OpRecord{.name = "softmax",
                       .family = "softmax",
                       .forward = "softmax",
                       .backward = "softmax_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "softmax"),
                       .error_inputs = {{"axis 2 of a rank-2 input",
                                         [] {
                                           softmax(zeros({2, 3}), 2);
                                         },
                                         "softmax: axis 2 out of range for rank 2"},
                                        {"an int64 input", [] { softmax(zeros({3}, DType::i64)); },
                                         "softmax: expected a float tensor, got i64 (3)"}},
                       .nonfinite = nan_propagates()});
}

void record_log_softmax(Samples& s) {
  register_op(OpRecord{.name = "log_softmax",
                       .family = "softmax",
                       .forward = "log_softmax",
                       .backward = "log_softmax_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "log_softmax"),
                       .error_inputs = {{"axis -3 of a rank-2 input",
                                         [] {
                                           log_softmax(zeros({2, 3}), -3);
                                         },
                                         "log_softmax: axis -3 out of range for rank 2"}},
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_softmax_cases() {
  Samples s;
  softmax_samples(s);
  record_softmax(s);
  record_log_softmax(s);
  check_all_taken(s, "softmax");
}

}  // namespace graft
