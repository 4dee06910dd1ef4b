// The op records of ops/loss.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_loss_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {
Tensor targets(std::vector<int64_t> t) {
  const int64_t n = (int64_t)t.size();
  return from_vector(t, {n});
}

// cross_entropy's bad inputs: targets out of range or of another dtype, shape or rank, logits
// that are not (N, C) floats, label smoothing outside [0, 1].
std::vector<ErrorInput> cross_entropy_error_inputs() {
  return {{"a target of C",
           [] {
             cross_entropy(zeros({3, 4}), targets({0, 4, 1}));
           },
           "cross_entropy: target 4 at position 1 is out of range [0, 4) for logits f32 (3, 4) "
           "(ignore_index -100)"},
          {"a negative target that is not ignore_index",
           [] {
             cross_entropy(zeros({3, 4}), targets({0, -1, 1}));
           },
           "cross_entropy: target -1 at position 1 is out of range [0, 4) for logits f32 (3, 4) "
           "(ignore_index -100)"},
          {"float targets",
           [] {
             cross_entropy(zeros({3, 4}), from_vector(std::vector<float>{0, 1, 2}, {3}));
           },
           "cross_entropy: target must be int64 class indices, got f32 (3)"},
          {"rank-3 logits",
           [] {
             cross_entropy(zeros({2, 3, 4}), targets({0, 1}));
           },
           "cross_entropy: logits must be (N, C), got f32 (2, 3, 4)"},
          {"fewer targets than rows",
           [] {
             cross_entropy(zeros({3, 4}), targets({0, 1}));
           },
           "cross_entropy: logits f32 (3, 4) need target (N) = (3), got i64 (2)"},
          {"targets of rank 2",
           [] {
             cross_entropy(zeros({3, 4}), from_vector(std::vector<int64_t>{0, 1, 2}, {3, 1}));
           },
           "cross_entropy: logits f32 (3, 4) need target (N) = (3), got i64 (3, 1)"},
          {"int64 logits",
           [] {
             cross_entropy(from_vector(std::vector<int64_t>{0, 1}, {1, 2}), targets({0}));
           },
           "cross_entropy: expected a float tensor, got i64 (1, 2)"},
          {"label smoothing 1.5",
           [] {
             cross_entropy(zeros({3, 4}), targets({0, 1, 2}), 1.5);
           },
           "cross_entropy: label_smoothing must be in [0, 1], got 1.500000"}};
}

// linear_cross_entropy's bad inputs: x and w of other widths, a target count or class out of
// range, label smoothing outside [0, 1], a negative chunk size.
std::vector<ErrorInput> linear_cross_entropy_error_inputs() {
  return {
      {"w of another width",
       [] {
         linear_cross_entropy(ones({3, 4}), ones({5, 3}), targets({0, 1, 2}));
       },
       "linear_cross_entropy: needs x (N, d) and w (V, d) of one dtype, got x f32 (3, 4), w f32 "
       "(5, 3)"},
      {"fewer targets than rows",
       [] {
         linear_cross_entropy(ones({3, 4}), ones({5, 4}), targets({0, 1}));
       },
       "linear_cross_entropy: x f32 (3, 4), w f32 (5, 4) need target (N) = (3) int64, got i64 (2)"},
      {"a target of C",
       [] {
         linear_cross_entropy(ones({3, 4}), ones({5, 4}), targets({0, 5, 1}));
       },
       "linear_cross_entropy: target 5 at position 1 is out of range [0, 5) for x f32 (3, 4), w "
       "f32 (5, 4) (ignore_index -100)"},
      {"label smoothing 2",
       [] {
         linear_cross_entropy(ones({3, 4}), ones({5, 4}), targets({0, 1, 2}), 2.0);
       },
       "linear_cross_entropy: label_smoothing must be in [0, 1], got 2.000000"},
      {"chunk_rows -1",
       [] {
         linear_cross_entropy(ones({3, 4}), ones({5, 4}), targets({0, 1, 2}), 0.0, -100, -1);
       },
       "linear_cross_entropy: chunk_rows must be >= 0"}};
}

void cross_entropy_samples(Samples& s) {
  add_sample(s,
             OpCase{.name = "cross_entropy/plain",
                    .op = "cross_entropy",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input({4, 5}, dt, g, -2, 2), targets({0, 3, 1, 4})};
                        },
                    .fn = [](const Tensors& x) { return cross_entropy(x[0], x[1]); }});
  add_sample(s,
             OpCase{.name = "cross_entropy/smoothing",
                    .op = "cross_entropy",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input({4, 5}, dt, g, -2, 2), targets({2, 2, 0, 4})};
                        },
                    .fn = [](const Tensors& x) { return cross_entropy(x[0], x[1], 0.1); }});
  add_sample(
      s,
      OpCase{.name = "cross_entropy/ignored_targets",
             .op = "cross_entropy",
             .make_inputs =
                 [](DType dt, Generator& g) {
                   return Tensors{case_input({5, 4}, dt, g, -2, 2), targets({1, -100, 3, -100, 0})};
                 },
             .fn = [](const Tensors& x) { return cross_entropy(x[0], x[1], 0.2); }});
  // ignore_index may be a real class id (PyTorch allows it): rows with target 1 drop out.
  add_sample(s,
             OpCase{.name = "cross_entropy/ignore_index_in_range",
                    .op = "cross_entropy",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input({4, 3}, dt, g, -2, 2), targets({1, 2, 1, 0})};
                        },
                    .fn = [](const Tensors& x) { return cross_entropy(x[0], x[1], 0.0, 1); }});
  add_sample(s,
             OpCase{.name = "cross_entropy/all_ignored",
                    .op = "cross_entropy",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input({2, 3}, dt, g, -2, 2), targets({-100, -100})};
                        },
                    .fn = [](const Tensors& x) { return cross_entropy(x[0], x[1], 0.1); }});
  add_sample(
      s,
      OpCase{.name = "cross_entropy/noncontig",
             .op = "cross_entropy",
             .make_inputs =
                 [](DType dt, Generator& g) {
                   return Tensors{case_input_t({6, 4}, dt, g, -2, 2), targets({3, 0, 2, 1, 1, 3})};
                 },
             .fn = [](const Tensors& x) { return cross_entropy(x[0], x[1], 0.1); }});
}

void linear_cross_entropy_samples(Samples& s) {
  // Three chunks of 2 rows (the last one short), an ignored target, label smoothing.
  add_sample(s, OpCase{.name = "linear_cross_entropy/chunks",
                       .op = "linear_cross_entropy",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({5, 3}, dt, g, -1, 1),
                                            case_input({6, 3}, dt, g, -1, 1),
                                            targets({4, 0, 5, 1, 2})};
                           },
                       .fn =
                           [](const Tensors& x) {
                             return linear_cross_entropy(x[0], x[1], x[2], 0.1, 0, 2);
                           }});
  // x as a transposed view, one chunk.
  add_sample(s,
             OpCase{.name = "linear_cross_entropy/transposed_x",
                    .op = "linear_cross_entropy",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input_t({4, 3}, dt, g, -1, 1),
                                         case_input({5, 3}, dt, g, -1, 1), targets({4, 0, 3, 1})};
                        },
                    .fn = [](const Tensors& x) { return linear_cross_entropy(x[0], x[1], x[2]); }});
  // x a constant: the forward makes dw alone, and the backward under create_graph records the
  // composed form instead of linear_cross_entropy_backward.
  add_sample(
      s,
      OpCase{.name = "linear_cross_entropy/constant_x",
             .op = "linear_cross_entropy",
             .make_inputs =
                 [](DType dt, Generator& g) {
                   return Tensors{rand({4, 3}, dt, g, -1, 1), case_input({5, 3}, dt, g, -1, 1),
                                  targets({4, 0, 3, 1})};
                 },
             .fn = [](const Tensors& x) { return linear_cross_entropy(x[0], x[1], x[2], 0.1); }});
  // The op linear_cross_entropy's backward records under create_graph: its outputs are the
  // gradients (dx, dw), here flattened into one vector; three chunks, an ignored target.
  add_sample(
      s, OpCase{.name = "linear_cross_entropy_backward/chunks",
                .op = "linear_cross_entropy_backward",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input({5, 3}, dt, g, -1, 1),
                                     case_input({6, 3}, dt, g, -1, 1), targets({4, 0, 5, 1, 2})};
                    },
                .fn =
                    [](const Tensors& x) {
                      const bool record = autograd::grad_enabled();  // off for central differences
                      autograd::EnableGrad on;
                      const Tensor loss = linear_cross_entropy(x[0], x[1], x[2], 0.1, 0, 2);
                      const Tensors g =
                          autograd::grad({loss}, {x[0], x[1]}, {}, {.create_graph = record});
                      return concat({reshape(g[0], {-1}), reshape(g[1], {-1})}, 0);
                    }});
}

void loss_samples(Samples& s) {
  cross_entropy_samples(s);
  linear_cross_entropy_samples(s);
}

void record_cross_entropy(Samples& s) {
  register_op(OpRecord{.name = "cross_entropy",
                       .family = "loss",
                       .forward = "cross_entropy",
                       .backward = "cross_entropy_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "cross_entropy"),
                       .error_inputs = cross_entropy_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_linear_cross_entropy(Samples& s) {
  register_op(OpRecord{.name = "linear_cross_entropy",
                       .family = "loss",
                       .forward = "linear_cross_entropy",
                       .backward = "linear_cross_entropy_backward",
                       .double_backward = DoubleBackward::backward_op,
                       .double_backward_op = "linear_cross_entropy_backward",
                       .samples = take(s, "linear_cross_entropy"),
                       .error_inputs = linear_cross_entropy_error_inputs(),
                       .nonfinite = nan_propagates()});
}

void record_linear_cross_entropy_backward(Samples& s) {
  register_op(OpRecord{.name = "linear_cross_entropy_backward",
                       .family = "loss",
                       .forward = "linear_cross_entropy",
                       .backward = "lce_second_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "linear_cross_entropy_backward"),
                       .error_inputs = {freed_graph_error(
                           "linear_cross_entropy_backward", {2, 3},
                           [](const Tensor& x) {
                             return linear_cross_entropy(
                                 x, ones({4, 3}, DType::f64).requires_grad_(),
                                 from_vector(std::vector<int64_t>{1, 2}, {2}, DType::i64));
                           })},
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_loss_cases() {
  Samples s;
  loss_samples(s);
  record_cross_entropy(s);
  record_linear_cross_entropy(s);
  record_linear_cross_entropy_backward(s);
  check_all_taken(s, "loss");
}

}  // namespace graft
