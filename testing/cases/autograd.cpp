// The op records of the engine's own ops (autograd/tape.h: accumulate_grad, reduce_grad,
// expand_grad), one record_<op>() each.
#include <mutex>

#include "testing/cases/cases.h"

namespace graft {

namespace {

void record_accumulate_grad() {
  register_op(
      OpRecord{.name = "accumulate_grad",
               .family = "autograd",
               .forward = "accumulate_grad",
               .backward = "accumulate_grad",
               .double_backward = DoubleBackward::composed,
               .samples = {OpCase{
                   .name = "accumulate_grad/same_shape",
                   .make_inputs =
                       [](DType dt, Generator& g) {
                         return Tensors{case_input({3, 4}, dt, g), case_input_t({3, 4}, dt, g)};
                       },
                   .fn = [](const Tensors& x) { return autograd::accumulate_grad(x[0], x[1]); }}},
               .error_inputs = {{"gradients of two shapes",
                                 [] {
                                   autograd::accumulate_grad(ones({2, 3}), ones({3}));
                                 },
                                 "accumulate_grad: f32 (2, 3) + f32 (3): shapes or dtypes differ"}},
               .nonfinite = nan_propagates()});
}

void record_reduce_grad() {
  register_op(OpRecord{.name = "reduce_grad",
                       .family = "autograd",
                       .forward = "reduce_grad",
                       .backward = "expand_grad",
                       .double_backward = DoubleBackward::backward_op,
                       .double_backward_op = "expand_grad",
                       .samples = {OpCase{.name = "reduce_grad/broadcast",
                                          .make_inputs =
                                              [](DType dt, Generator& g) {
                                                return Tensors{case_input_t({2, 3, 4}, dt, g)};
                                              },
                                          .fn =
                                              [](const Tensors& x) {
                                                return autograd::reduce_grad(x[0], {3, 1});
                                              }}},
                       .error_inputs = {{"a shape the gradient does not broadcast from",
                                         [] {
                                           autograd::reduce_grad(ones({2, 3}), {4});
                                         },
                                         "reduce_grad: cannot reduce f32 (2, 3) to shape (4)"}},
                       .nonfinite = nan_propagates()});
}

void record_expand_grad() {
  register_op(OpRecord{.name = "expand_grad",
                       .family = "autograd",
                       .forward = "expand_grad",
                       .backward = "reduce_grad",
                       .double_backward = DoubleBackward::backward_op,
                       .double_backward_op = "reduce_grad",
                       .samples = {OpCase{.name = "expand_grad/broadcast",
                                          .make_inputs =
                                              [](DType dt, Generator& g) {
                                                return Tensors{case_input({3, 1}, dt, g)};
                                              },
                                          .fn =
                                              [](const Tensors& x) {
                                                return autograd::expand_grad(x[0], {2, 3, 4});
                                              }}},
                       .error_inputs = {{"a shape the gradient does not broadcast to",
                                         [] {
                                           autograd::expand_grad(ones({2, 3}), {4});
                                         },
                                         "expand_grad: cannot broadcast f32 (2, 3) to shape (4)"}},
                       .nonfinite = nan_propagates()});
}

}  // namespace

void register_autograd_cases() {
  static std::once_flag once;
  std::call_once(once, [] {
    record_accumulate_grad();
    record_reduce_grad();
    record_expand_grad();
  });
}

}  // namespace graft
