// The op records of ops/norm.cpp (graft/testing/registry.h): the samples first, by op, then one
// record_<op>() per op taking them; register_norm_cases() registers them all.
#include "testing/cases/cases.h"

namespace graft {

namespace {
void rms_norm_samples(Samples& s) {
  add_sample(s, OpCase{.name = "rms_norm/weighted",
                       .op = "rms_norm",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3, 5}, dt, g, -2, 2),
                                            case_input({5}, dt, g, 0.5, 1.5)};
                           },
                       .fn = [](const Tensors& x) { return rms_norm(x[0], x[1], 1e-6); }});
  // A transposed (non-contiguous) x, its rows broadcast against one weight vector.
  add_sample(s, OpCase{.name = "rms_norm/weighted_transposed",
                       .op = "rms_norm",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({3, 4, 6}, dt, g, -2, 2),
                                            case_input({6}, dt, g, -1.5, 1.5)};
                           },
                       .fn = [](const Tensors& x) { return rms_norm(x[0], x[1], 1e-6); }});
  add_sample(s, one_input_case(
                    "rms_norm/plain_many_rows_eps", "rms_norm", {37, 4}, /*transposed=*/false,
                    [](const Tensor& x) { return rms_norm(x, Tensor(), 0.1); }, -2, 2));
}

void add_layer_norm_samples(Samples& s) {
  // add_layer_norm with a non-contiguous residual: xhat rebuilt from y (shift within the scale),
  // and from the kept sum (every shift over kMaxShiftOverScale = 64 times its scale <= 1.5).
  for (bool kept : {false, true})
    add_sample(
        s,
        OpCase{
            .name = kept ? "add_layer_norm/kept_sum" : "add_layer_norm/from_output",
            .op = "add_layer_norm",
            .make_inputs =
                [kept](DType dt, Generator& g) {
                  return Tensors{case_input({2, 3, 5}, dt, g), case_input_t({2, 3, 5}, dt, g),
                                 case_input({5}, dt, g, 0.5, 1.5),
                                 kept ? case_input({5}, dt, g, 100, 200) : case_input({5}, dt, g)};
                },
            .fn = [](const Tensors& x) { return add_layer_norm(x[0], x[1], x[2], x[3], 1e-5); }});
  add_sample(
      s,
      OpCase{
          .name = "add_layer_norm/constant_residual",
          .op = "add_layer_norm",
          .make_inputs =
              [](DType dt, Generator& g) {
                Tensor r = case_input({4, 6}, dt, g);
                r.requires_grad_(false);
                return Tensors{case_input({4, 6}, dt, g), r, case_input({6}, dt, g, 0.5, 1.5)};
              },
          .fn = [](const Tensors& x) { return add_layer_norm(x[0], x[1], x[2], Tensor(), 1e-5); }});
}

// layer_norm's bad inputs: a weight or bias of another shape or dtype, a 0-dim x.
std::vector<ErrorInput> layer_norm_error_inputs() {
  return {{"a weight of another width",
           [] {
             layer_norm(zeros({2, 4}), zeros({5}), Tensor());
           },
           "layer_norm: x f32 (2, 4), w f32 (5): w must be (4)"},
          {"a bias of x's shape",
           [] {
             layer_norm(zeros({2, 4}), zeros({4}), zeros({2, 4}));
           },
           "layer_norm: x f32 (2, 4), w f32 (4), b f32 (2, 4): b must be (4)"},
          {"a weight of another dtype",
           [] {
             layer_norm(zeros({2, 4}), zeros({4}, DType::f64), Tensor());
           },
           "layer_norm: x f32 (2, 4), w f64 (4): dtype mismatch"},
          {"a 0-dim x", [] { layer_norm(scalar(1.0), Tensor(), Tensor()); },
           "layer_norm: x f32 (): x needs at least 1 dim"}};
}

// The cases whose backward reads x instead of rebuilding xhat from y (xhat_from_output).
void layer_norm_keeps_x_samples(Samples& s) {
  // Backward from x (not y): a zero scale, and a shift over kMaxShiftOverScale times its scale.
  add_sample(
      s,
      OpCase{.name = "layer_norm/zero_weight_keeps_x",
             .op = "layer_norm",
             .make_inputs =
                 [](DType dt, Generator& g) {
                   Tensor w = from_vector(std::vector<double>{0.7, 0.0, 1.2, -0.9, 1.1}, {5}, dt);
                   return Tensors{case_input({3, 5}, dt, g, -2, 2), w, case_input({5}, dt, g)};
                 },
             .fn = [](const Tensors& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
  add_sample(
      s, OpCase{.name = "layer_norm/large_shift_keeps_x",
                .op = "layer_norm",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      Tensor b = from_vector(std::vector<double>{0.1, 200.0, -0.3, 0.2}, {4}, dt);
                      return Tensors{case_input({3, 4}, dt, g, -2, 2),
                                     case_input({4}, dt, g, 0.5, 1.5), b};
                    },
                .fn = [](const Tensors& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
}

void norm_samples(Samples& s) {
  add_layer_norm_samples(s);
  rms_norm_samples(s);
  layer_norm_keeps_x_samples(s);
  // Inputs on [-2, 2] with C >= 4 keep the rows' variance well away from 0 (and from eps).
  add_sample(s, OpCase{.name = "layer_norm/affine",
                       .op = "layer_norm",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({2, 3, 5}, dt, g, -2, 2),
                                            case_input({5}, dt, g, 0.5, 1.5),
                                            case_input({5}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }});
  add_sample(
      s, OpCase{.name = "layer_norm/plain_transposed",
                .op = "layer_norm",
                .make_inputs =
                    [](DType dt, Generator& g) {
                      return Tensors{case_input_t({4, 6}, dt, g, -2, 2)};
                    },
                .fn = [](const Tensors& x) { return layer_norm(x[0], Tensor(), Tensor(), 1e-5); }});
  add_sample(s,
             OpCase{.name = "layer_norm/weight_only_transposed",
                    .op = "layer_norm",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input_t({3, 2, 5}, dt, g, -2, 2),
                                         case_input({5}, dt, g, 0.5, 1.5)};
                        },
                    .fn = [](const Tensors& x) { return layer_norm(x[0], x[1], Tensor(), 1e-5); }});
  add_sample(
      s,
      OpCase{
          .name = "layer_norm/bias_only_many_rows",
          .op = "layer_norm",
          .make_inputs =
              [](DType dt, Generator& g) {
                return Tensors{case_input({37, 4}, dt, g, -2, 2), Tensor(), case_input({4}, dt, g)};
              },
          .fn = [](const Tensors& x) { return layer_norm(x[0], Tensor(), x[2], 1e-5); }});
}

void record_rms_norm(Samples& s) {
  register_op(OpRecord{.name = "rms_norm",
                       .family = "norm",
                       .forward = "rms_norm",
                       .backward = "rms_norm_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "rms_norm"),
                       .error_inputs = {{"a weight of another width",
                                         [] {
                                           rms_norm(zeros({2, 4}), zeros({3}));
                                         },
                                         "rms_norm: x f32 (2, 4), w f32 (3): w must be (4)"},
                                        {"a negative eps",
                                         [] {
                                           rms_norm(zeros({2, 4}), Tensor(), -1.0);
                                         },
                                         "rms_norm: x f32 (2, 4): eps -1.000000 must be >= 0"}},
                       .accepts_undefined = {1},  // the weight is optional
                       .nonfinite = nan_propagates()});
}

void record_add_layer_norm(Samples& s) {
  register_op(
      OpRecord{.name = "add_layer_norm",
               .family = "norm",
               .forward = "add_layer_norm",
               .backward = "layer_norm_backward",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "add_layer_norm"),
               .error_inputs =
                   {{"a residual of another shape",
                     [] {
                       add_layer_norm(zeros({2, 4}), zeros({4}), zeros({4}), Tensor());
                     },
                     "add_layer_norm: r f32 (4) must have the dtype and shape of x f32 (2, 4)"},
                    {"a residual of another dtype",
                     [] {
                       add_layer_norm(zeros({2, 4}), zeros({2, 4}, DType::f64), Tensor(), Tensor());
                     },
                     "add_layer_norm: r f64 (2, 4) must have the dtype"},
                    {"an undefined residual",
                     [] {
                       add_layer_norm(zeros({2, 4}), Tensor(), Tensor(), Tensor());
                     },
                     "add_layer_norm: r undefined tensor must have"},
                    {"a weight of another width",
                     [] {
                       add_layer_norm(zeros({2, 4}), zeros({2, 4}), zeros({5}), Tensor());
                     },
                     "add_layer_norm: x f32 (2, 4), w f32 (5): w must be (4)"}},
               .accepts_undefined = {2, 3},  // the weight and bias are optional
               .nonfinite = nan_propagates()});
}

void record_layer_norm(Samples& s) {
  register_op(OpRecord{.name = "layer_norm",
                       .family = "norm",
                       .forward = "layer_norm",
                       .backward = "layer_norm_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "layer_norm"),
                       .error_inputs = layer_norm_error_inputs(),
                       .accepts_undefined = {1, 2},  // the weight and bias are optional
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_norm_cases() {
  Samples s;
  norm_samples(s);
  record_rms_norm(s);
  record_add_layer_norm(s);
  record_layer_norm(s);
  check_all_taken(s, "norm");
}

}  // namespace graft
