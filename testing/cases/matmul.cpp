// The op records of ops/matmul.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_matmul_cases() registers them all.
#include "ops/internal/backward_ops.h"
#include "testing/cases/cases.h"

namespace graft {

namespace {
// matmul's bad inputs: inner or batch dims that do not match, two dtypes, a 0-dim or int64
// operand.
std::vector<ErrorInput> matmul_error_inputs() {
  return {{"inner dims that differ",
           [] {
             matmul(zeros({2, 3}), zeros({4, 5}));
           },
           "matmul: (2, 3) @ (4, 5): inner dims 3 != 4"},
          {"operands of two dtypes",
           [] {
             matmul(zeros({2, 3}), zeros({3, 5}, DType::f64));
           },
           "matmul: (2, 3) @ (3, 5): dtype mismatch, f32 (2, 3) vs f64 (3, 5)"},
          {"a 0-dim operand", [] { matmul(scalar(1.0), zeros({3})); },
           "matmul: () @ (3): both operands need at least 1 dim"},
          {"batch dims that do not broadcast",
           [] {
             matmul(zeros({2, 2, 3}), zeros({3, 3, 4}));
           },
           "matmul: (2, 2, 3) @ (3, 3, 4): batch dims (2) and (3) cannot be broadcast"},
          {"int64 operands", [] { matmul(zeros({3}, DType::i64), zeros({3}, DType::i64)); },
           "matmul: expected a float tensor, got i64 (3)"}};
}

// linear's bad inputs: w or b of the wrong width, a 1-D w, a w of another dtype.
std::vector<ErrorInput> linear_error_inputs() {
  return {{"w of other in features",
           [] {
             linear(zeros({2, 3}), zeros({4, 5}));
           },
           "linear: x (2, 3), w (4, 5): in features 3 != w's 5"},
          {"a bias of another width",
           [] {
             linear(zeros({2, 3}), zeros({4, 3}), zeros({3}));
           },
           "linear: x (2, 3), w (4, 3), b (3): b must be (4)"},
          {"a 1-D w",
           [] {
             linear(zeros({2, 3}), zeros({3}));
           },
           "linear: x (2, 3), w (3): w must be 2-D (OUT, IN)"},
          {"a w of another dtype",
           [] {
             linear(zeros({2, 3}), zeros({4, 3}, DType::f64));
           },
           "linear: x (2, 3), w (4, 3): dtype mismatch, f32 (2, 3) vs f64 (4, 3)"}};
}

// matmul: batch broadcasting, transposed operands, vectors on either side.
void matmul_only_samples(Samples& s) {
  add_sample(
      s, OpCase{.name = "matmul/batched_broadcast",
                .op = "matmul",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input({2, 1, 3, 4}, dt, g), case_input({3, 4, 5}, dt, g)};
                    },
                .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
  add_sample(s,
             OpCase{.name = "matmul/batched_2d_transposed",
                    .op = "matmul",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input({2, 3, 4}, dt, g), case_input_t({4, 5}, dt, g)};
                        },
                    .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
  add_sample(
      s, OpCase{.name = "matmul/batched_times_size1_batch",
                .op = "matmul",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input({2, 3, 4}, dt, g), case_input({1, 4, 5}, dt, g)};
                    },
                .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
  add_sample(
      s, OpCase{.name = "matmul/transposed_a_batched",
                .op = "matmul",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input_t({2, 3, 4}, dt, g), case_input({2, 4, 5}, dt, g)};
                    },
                .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "matmul/vec_mat",
                       .op = "matmul",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({4}, dt, g), case_input({4, 5}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "matmul/mat_vec_batched",
                       .op = "matmul",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3, 4}, dt, g), case_input({4}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return matmul(x[0], x[1]); }});
}

// linear: a bias over 3-D x, transposed x and w without bias.
void linear_samples(Samples& s) {
  add_sample(s, OpCase{.name = "linear/bias_3d",
                       .op = "linear",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3, 4}, dt, g), case_input({5, 4}, dt, g),
                                            case_input({5}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return linear(x[0], x[1], x[2]); }});
  add_sample(s,
             OpCase{.name = "linear/no_bias_transposed_x",
                    .op = "linear",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input_t({3, 4}, dt, g), case_input_t({5, 4}, dt, g)};
                        },
                    .fn = [](const Tensors& x) { return linear(x[0], x[1]); }});
  // The op linear's backward records for dw under create_graph: dy (..., OUT), x (..., IN).
  add_sample(
      s, OpCase{.name = "linear_weight_grad/3d",
                .op = "linear_weight_grad",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input({2, 3, 4}, dt, g), case_input({2, 3, 5}, dt, g)};
                    },
                .fn = [](const Tensors& x) { return linear_weight_grad(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "linear_weight_grad/transposed_x",
                       .op = "linear_weight_grad",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({3, 4}, dt, g), case_input_t({3, 5}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return linear_weight_grad(x[0], x[1]); }});
}

void matmul_samples(Samples& s) {
  matmul_only_samples(s);
  linear_samples(s);
}

void record_matmul(Samples& s) {
  register_op(OpRecord{.name = "matmul",
                       .family = "matmul",
                       .forward = "matmul",
                       .backward = "matmul_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "matmul"),
                       .error_inputs = matmul_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_linear(Samples& s) {
  register_op(OpRecord{.name = "linear",
                       .family = "matmul",
                       .forward = "linear",
                       .backward = "linear_backward",
                       .double_backward = DoubleBackward::backward_op,
                       .double_backward_op = "linear_weight_grad",
                       .samples = take(s, "linear"),
                       .error_inputs = linear_error_inputs(),
                       .accepts_undefined = {2},  // the bias (input 2) is optional
                       .nonfinite = nan_propagates()});
}

void record_linear_weight_grad(Samples& s) {
  register_op(
      OpRecord{.name = "linear_weight_grad",
               .family = "matmul",
               .forward = "linear",
               .backward = "linear_weight_grad_backward",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "linear_weight_grad"),
               .error_inputs = {freed_graph_error("linear_weight_grad", {4, 3},
                                                  [](const Tensor& x) {
                                                    return linear(ones({2, 3}, DType::f64), x);
                                                  })},
               .nonfinite = nan_propagates()});
}

}  // namespace

void register_matmul_cases() {
  Samples s;
  matmul_samples(s);
  record_matmul(s);
  record_linear(s);
  record_linear_weight_grad(s);
  check_all_taken(s, "matmul");
}

}  // namespace graft
