// The op records of ops/dropout.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_dropout_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {
// The bad inputs of dropout and relu_dropout (`op`, applied by `fn`): p outside [0, 1] whether
// training or not, NaN, an integer x.
std::vector<ErrorInput> dropout_error_inputs(const std::string& op,
                                             Tensor (*fn)(const Tensor&, double, bool,
                                                          Generator&)) {
  const std::string p_rule = op + ": p must be in [0, 1], got p = ";
  return {{"p = 1.5",
           [fn] {
             fn(zeros({2, 3}), 1.5, true, default_generator());
           },
           p_rule + "1.500000 for x f32 (2, 3)"},
          {"p = -0.1 in eval mode",
           [fn] {
             fn(zeros({2, 3}), -0.1, false, default_generator());
           },
           p_rule + "-0.100000"},
          {"p = NaN", [fn] { fn(zeros({2}), std::nan(""), true, default_generator()); }, p_rule},
          {"an integer x",
           [fn] {
             fn(from_vector(std::vector<int64_t>{1, 2}, {2}), 0.5, true, default_generator());
           },
           op + ": expected a float tensor, got i64 (2)"}};
}

void dropout_samples(Samples& s) {
  // A fresh Generator per call so every forward of the gradcheck draws the same mask.
  add_sample(s, OpCase{.name = "dropout/p0.4",
                       .op = "dropout",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({4, 6}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             Generator g(5);
                             return dropout(x[0], 0.4, true, g);
                           }});
  add_sample(s, OpCase{.name = "dropout/noncontig",
                       .op = "dropout",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({5, 4}, dt, g)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             Generator g(5);
                             return dropout(x[0], 0.25, true, g);
                           }});
  // relu has a kink at 0: inputs are drawn from [0.1, 1] and negated in half the entries.
  add_sample(s, OpCase{.name = "relu_dropout/p0.3",
                       .op = "relu_dropout",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({4, 6}, dt, g, 0.1, 1)};
                           },
                       .fn =
                           [](const Tensors& x) {
                             Generator g(7);
                             Tensor sign = from_vector(std::vector<double>{1, -1, -1, 1}, {4, 1},
                                                       case_dtype(x[0]));
                             return relu_dropout(mul(x[0], sign), 0.3, true, g);
                           }});
}

void record_dropout(Samples& s) {
  register_op(OpRecord{.name = "dropout",
                       .family = "dropout",
                       .forward = "dropout",
                       .backward = "dropout_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "dropout"),
                       .error_inputs = dropout_error_inputs("dropout", dropout),
                       .nonfinite = nan_propagates()});
}

void record_relu_dropout(Samples& s) {
  register_op(OpRecord{.name = "relu_dropout",
                       .family = "dropout",
                       .forward = "relu_dropout",
                       .backward = "relu_dropout_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "relu_dropout"),
                       .error_inputs = dropout_error_inputs("relu_dropout", relu_dropout),
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_dropout_cases() {
  Samples s;
  dropout_samples(s);
  record_dropout(s);
  record_relu_dropout(s);
  check_all_taken(s, "dropout");
}

}  // namespace graft
