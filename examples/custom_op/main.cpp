// Adding an op from outside the library: softplus(x) = log(1 + exp(x)), written as a primitive
// with its own backward (d/dx = sigmoid(x)), declared, given a gradcheck case, and checked by the
// same machinery the library's own ops use (gradcheck in float64, float32 vs float64).
#include <cmath>
#include <cstdio>

#include "autograd/gradcheck.h"
#include "ops/ops.h"

using namespace graft;

GRAFT_DECLARE_OP("softplus", "custom");

// softplus: y = log(1 + exp(x)), elementwise; x (...) -> y (...)
Tensor softplus(const Tensor& x) {
  if (!is_floating(x.dtype())) fail("softplus: expected a float tensor, got " + describe(x));
  Tensor xc = contiguous_copy(x);  // own contiguous buffer: simple loops below
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  GRAFT_DISPATCH_FLOAT(x.dtype(), "softplus", [&] {
    const T* px = xc.data<T>();
    T* py = y.data<T>();
    // log1p(exp(-|x|)) + max(x, 0) avoids overflow for large x.
    for (int64_t i = 0; i < x.numel(); ++i) py[i] = std::log1p(std::exp(-std::fabs(px[i]))) + std::max(px[i], T(0));
  });
  if (autograd::needs_record({x}))
    autograd::record("softplus", {x}, {y}, {xc}, [](const autograd::Ctx& c, const Tensors& dout) -> Tensors {
      return {mul(dout[0], sigmoid(c.saved[0]))};  // dx = dout * sigmoid(x)
    });
  return y;
}

GRAFT_OP_CASE({.name = "custom/softplus", .op = "softplus",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g, -3, 3)}; },
               .fn = [](const Tensors& x) { return softplus(x[0]); }});

int main() {
  int failures = 0;
  for (const OpCase& c : registered_cases()) {
    if (c.op != "softplus") continue;
    Generator g(1);
    GradcheckResult r64 = gradcheck(c.fn, c.make_inputs(DType::f64, g), c.opt);
    GradcheckResult r32 = check_f32_vs_f64(c);
    std::printf("%-16s float64 gradcheck: %s  float32 vs float64: %s\n", c.name.c_str(),
                r64.ok ? "ok" : r64.message.c_str(), r32.ok ? "ok" : r32.message.c_str());
    failures += !r64.ok + !r32.ok;
  }
  // Use it in a computation like any other op.
  Tensor x = from_vector(std::vector<double>{-2, 0, 2}, {3}).requires_grad_();
  sum(softplus(x)).backward();
  std::printf("softplus([-2, 0, 2]) grad = %s (sigmoid)\n", x.grad().str().c_str());
  return failures ? 1 : 0;
}
