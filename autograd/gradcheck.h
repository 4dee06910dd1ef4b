// gradcheck: compares the tape's analytic gradients with central differences in float64,
// and the registry of op cases that the generic tests (tests/test_gradcheck_all.cpp) run.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/tape.h"
#include "graft/autograd/tensor.h"

namespace graft {

using OpFn = std::function<Tensor(const Tensors&)>;

// PyTorch gradcheck's defaults. |analytic - numeric| <= atol + rtol * |numeric| per element.
struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  uint64_t seed = 1234;  // for the random upstream gradient
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the worst element on failure: input, index, analytic, numeric
  double max_abs_err = 0;
};

// Checks d(sum(fn(inputs) * g))/d(input) for every float64 input that requires grad, with g a
// random upstream gradient (all ones would hide transposed-gradient bugs).
GradcheckResult gradcheck(const OpFn& fn, const Tensors& inputs, const GradcheckOptions& opt = {});

// One registered case for the generic tests. make_inputs builds the inputs in the requested
// float dtype (integer inputs such as ids stay int64) from a seeded generator; float inputs
// that should be checked come back with requires_grad set.
struct OpCase {
  std::string name;  // unique, e.g. "add/broadcast"
  std::string op;    // the declared op it covers, e.g. "add"
  std::function<Tensors(DType, Generator&)> make_inputs;
  OpFn fn;
  GradcheckOptions opt{};
  double f32_atol = 1e-4, f32_rtol = 1e-3;  // float32 (oneDNN) path vs float64 path
};

// Adds a case to the registry (names must be unique). The library's own cases are registered by
// register_op_cases() (ops/cases.h); a program adds its own with explicit calls.
void register_case(OpCase c);

// Input helpers for cases: a uniform(lo, hi) leaf that requires grad, and the same stored with
// its last two dims transposed so the op sees a non-contiguous view.
Tensor case_input(const Shape& shape, DType dt, Generator& g, double lo = -1, double hi = 1);
Tensor case_input_t(const Shape& shape, DType dt, Generator& g, double lo = -1, double hi = 1);
const std::vector<OpCase>& registered_cases();

// Runs the case's float32 forward and backward and compares output and input gradients with
// the float64 path (same input values, same upstream gradient).
GradcheckResult check_f32_vs_f64(const OpCase& c);

}  // namespace graft
