// The op records of ops/elementwise.cpp (graft/testing/registry.h): the samples first, by op, then
// one record_<op>() per op taking them; register_elementwise_cases() registers them all.
#include "testing/cases/cases.h"

#include <cmath>

#include "ops/internal/unary_rows.h"

namespace graft {

namespace {
// Case inputs: uniform on [lo, hi], pushed 10% of the range away from every kink.
Tensor unary_case_input(const UnaryOp& op, DType dt, Generator& g, bool transposed) {
  Tensor x = transposed ? case_input_t({3, 4}, dt, g, op.lo, op.hi)
                        : case_input({3, 4}, dt, g, op.lo, op.hi);
  const double margin = 0.1 * (op.hi - op.lo);
  std::vector<double> v = x.to_vector<double>();  // in float64, then rounded once to dt
  for (double& e : v)
    for (double k : op.kinks)
      if (std::fabs(e - k) < margin) e = e >= k ? k + margin : k - margin;
  copy_into(x, from_vector(v, x.shape(), DType::f64));
  return x;
}

// The bad inputs every row has: an int64 input.
ErrorInput int64_input(const UnaryOp& row) {
  return {"an int64 input", [row] { unary(row, ones({2}, DType::i64)); },
          std::string(row.name) + ": expected a float tensor, got i64 (2)"};
}

// A row's record: its two samples, an int64 input among its bad inputs.
OpRecord row_record(const UnaryOp& row, std::vector<ErrorInput> more_errors,
                    NonFiniteRule nonfinite) {
  OpRecord r{.name = row.name,
             .family = row.family,
             .forward = row.name,
             .backward = "unary_backward",
             .double_backward = row.df_op ? DoubleBackward::composed : DoubleBackward::none,
             .error_inputs = joined({{int64_input(row)}, more_errors}),
             .nonfinite = std::move(nonfinite)};
  for (bool transposed : {false, true})
    r.samples.push_back(
        OpCase{.name = std::string(row.name) + (transposed ? "/transposed" : "/contiguous"),
               .make_inputs =
                   [row, transposed](DType dt, Generator& g) {
                     return Tensors{unary_case_input(row, dt, g, transposed)};
                   },
               .fn = [row](const Tensors& x) { return unary(row, x[0], row.case_a, row.case_b); }});
  return r;
}

// The library's rows: gelu's two rows are both recorded by gelu(x, tanh_approx), erf by gelu's
// backward; clamp refuses a NaN bound.
void record_library_rows() {
  for (const UnaryOp* row : unary_rows()) {
    OpRecord r = row_record(*row, {}, nan_propagates());
    if (r.name == "gelu_tanh" || r.name == "erf") r.forward = "gelu";  // erf: gelu's backward
    if (r.name == "clamp")
      r.error_inputs.push_back({"a NaN lower bound", [] { clamp(ones({2}), std::nan(""), 0); },
                                "clamp: a NaN bound (lo nan, hi 0.000000)"});
    autograd::declare_op(row->name, row->family, row->df_op != nullptr);
    register_op(std::move(r));
  }
}

Tensors one(const Shape& s, DType dt, Generator& g, double lo = -1, double hi = 1) {
  return {case_input(s, dt, g, lo, hi)};
}

// add, sub, mul, div: broadcasting, non-contiguous operands, one tensor twice.
void arithmetic_samples(Samples& s) {
  add_sample(s,
             OpCase{.name = "add/broadcast",
                    .op = "add",
                    .make_inputs =
                        [](DType dt, Generator& g) {
                          return Tensors{case_input({2, 3, 4}, dt, g), case_input({3, 1}, dt, g)};
                        },
                    .fn = [](const Tensors& x) { return add(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "add/noncontig_lhs_broadcast",
                       .op = "add",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({4}, dt, g), case_input_t({3, 4}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return add(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "sub/broadcast",
                       .op = "sub",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({3, 1}, dt, g), case_input_t({3, 4}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return sub(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "mul/broadcast",
                       .op = "mul",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({2, 3, 4}, dt, g), case_input({4}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return mul(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "mul/same_tensor",
                       .op = "mul",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return one({3, 4}, dt, g);
                           },
                       .fn = [](const Tensors& x) { return mul(x[0], x[0]); }});
  add_sample(
      s,
      OpCase{.name = "div/broadcast",
             .op = "div",
             .make_inputs =
                 [](DType dt, Generator& g) {
                   return Tensors{case_input_t({2, 3}, dt, g), case_input({2, 1}, dt, g, 0.5, 2.0)};
                 },
             .fn = [](const Tensors& x) { return div(x[0], x[1]); }});
}

// maximum, minimum: broadcasting against a transposed operand.
void extremum_samples(Samples& s) {
  add_sample(s, OpCase{.name = "maximum/broadcast",
                       .op = "maximum",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input_t({3, 4}, dt, g), case_input({4}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return maximum(x[0], x[1]); }});
  add_sample(s, OpCase{.name = "minimum/broadcast",
                       .op = "minimum",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{case_input({3, 1}, dt, g), case_input_t({3, 4}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return minimum(x[0], x[1]); }});
}

// where, masked_fill: integer conditions and masks broadcast over the values.
void select_samples(Samples& s) {
  add_sample(s, OpCase{.name = "where/broadcast",
                       .op = "where",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{
                                 from_vector(std::vector<int64_t>{1, 0, 0, 1}, {4}, DType::i64),
                                 case_input_t({3, 4}, dt, g), case_input({1}, dt, g)};
                           },
                       .fn = [](const Tensors& x) { return where(x[0], x[1], x[2]); }});
  add_sample(s, OpCase{.name = "masked_fill/broadcast",
                       .op = "masked_fill",
                       .make_inputs =
                           [](DType dt, Generator& g) {
                             return Tensors{
                                 case_input_t({2, 3, 4}, dt, g),
                                 from_vector(std::vector<int64_t>{0, 1, 0}, {3, 1}, DType::i64)};
                           },
                       .fn = [](const Tensors& x) { return masked_fill(x[0], x[1], -7.0); }});
}

void elementwise_samples(Samples& s) {
  arithmetic_samples(s);
  extremum_samples(s);
  select_samples(s);
}

void record_add(Samples& s) {
  register_op(
      OpRecord{.name = "add",
               .family = "elementwise",
               .forward = "add",
               .backward = "add_backward",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "add"),
               .error_inputs = {{"shapes that do not broadcast",
                                 [] {
                                   add(ones({2, 3}), ones({4}));
                                 },
                                 "add: shapes (2, 3) and (4) cannot be broadcast (dim 1: 3 vs 4)"}},
               .nonfinite = nan_propagates()});
}

void record_sub(Samples& s) {
  register_op(
      OpRecord{.name = "sub",
               .family = "elementwise",
               .forward = "sub",
               .backward = "sub_backward",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "sub"),
               .error_inputs = {{"shapes that do not broadcast",
                                 [] {
                                   sub(ones({2, 3}), ones({4}));
                                 },
                                 "sub: shapes (2, 3) and (4) cannot be broadcast (dim 1: 3 vs 4)"}},
               .nonfinite = nan_propagates()});
}

void record_mul(Samples& s) {
  register_op(OpRecord{.name = "mul",
                       .family = "elementwise",
                       .forward = "mul",
                       .backward = "mul_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "mul"),
                       .error_inputs = {{"an f32 and an f64 input",
                                         [] {
                                           mul(ones({2, 3}), ones({2, 3}, DType::f64));
                                         },
                                         "mul: dtype mismatch, f32 (2, 3) vs f64 (2, 3)"}},
                       .nonfinite = nan_propagates()});
}

void record_div(Samples& s) {
  register_op(OpRecord{.name = "div",
                       .family = "elementwise",
                       .forward = "div",
                       .backward = "div_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "div"),
                       .error_inputs = {{"an f32 and an f64 input",
                                         [] {
                                           div(ones({2, 3}), ones({2, 3}, DType::f64));
                                         },
                                         "div: dtype mismatch, f32 (2, 3) vs f64 (2, 3)"}},
                       .nonfinite = nan_propagates()});
}

void record_maximum(Samples& s) {
  register_op(OpRecord{
      .name = "maximum",
      .family = "elementwise",
      .forward = "maximum",
      .backward = "extremum_backward",
      .double_backward = DoubleBackward::composed,
      .samples = take(s, "maximum"),
      .error_inputs = {{"shapes that do not broadcast",
                        [] {
                          maximum(ones({2, 3}), ones({4}));
                        },
                        "maximum: shapes (2, 3) and (4) cannot be broadcast (dim 1: 3 vs 4)"}},
      .nonfinite = nan_propagates()});
}

void record_minimum(Samples& s) {
  register_op(OpRecord{.name = "minimum",
                       .family = "elementwise",
                       .forward = "minimum",
                       .backward = "extremum_backward",
                       .double_backward = DoubleBackward::composed,
                       .samples = take(s, "minimum"),
                       .error_inputs = {{"an f32 and an f64 input",
                                         [] { minimum(ones({2}), ones({2}, DType::f64)); },
                                         "minimum: dtype mismatch, f32 (2) vs f64 (2)"}},
                       .nonfinite = nan_propagates()});
}

void record_where(Samples& s) {
  register_op(
      OpRecord{.name = "where",
               .family = "elementwise",
               .forward = "where",
               .backward = "where_backward",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "where"),
               .error_inputs = {{"a condition that does not broadcast with the values",
                                 [] { where(ones({2}), ones({3}), ones({3})); },
                                 "where: shapes (2) and (3) cannot be broadcast (dim 0: 2 vs 3)"}},
               .nonfinite = nan_propagates()});
}

void record_masked_fill(Samples& s) {
  register_op(
      OpRecord{.name = "masked_fill",
               .family = "elementwise",
               .forward = "masked_fill",
               .backward = "masked_fill_backward",
               .double_backward = DoubleBackward::composed,
               .samples = take(s, "masked_fill"),
               .error_inputs = {{"a mask that does not broadcast to x",
                                 [] {
                                   masked_fill(ones({3}), ones({2, 3}), 0);
                                 },
                                 "masked_fill: mask f32 (2, 3) does not broadcast to x f32 (3)"}},
               .nonfinite = nan_propagates()});
}

}  // namespace

void register_unary_cases(const UnaryOp& row) { register_unary_cases(row, {}, nan_propagates()); }

void register_unary_cases(const UnaryOp& row, std::vector<ErrorInput> more_errors,
                          NonFiniteRule nonfinite) {
  autograd::declare_op(row.name, row.family, row.df_op != nullptr);
  register_op(row_record(row, std::move(more_errors), std::move(nonfinite)));
}

void register_elementwise_cases() {
  record_library_rows();
  Samples s;
  elementwise_samples(s);
  record_add(s);
  record_sub(s);
  record_mul(s);
  record_div(s);
  record_maximum(s);
  record_minimum(s);
  record_where(s);
  record_masked_fill(s);
  check_all_taken(s, "elementwise");
}

}  // namespace graft
