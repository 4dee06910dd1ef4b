// Adding ops from outside the library, both ways, checked by the machinery the library's own ops
// use (gradcheck and gradgradcheck in float64, float32 against float64):
//   - softsign(x) = x / (1 + |x|) as one table row (ops/elementwise.h UnaryOp) built by
//     unary_row from one generic formula and derivative: the float64 reference and a vectorised
//     float32 loop come from the same two lambdas (oneDNN has no softsign algorithm; the loop is
//     as fast as oneDNN's own eltwise kernels, see docs/ops.md);
//   - softplus(x) = log(1 + exp(x)) written by hand with the helpers of ops/custom.h (the float
//     checks, kern::contig, kern::parallel_for): forward, a named backward, a recorded tape entry
//     and its op record (graft/testing/registry.h: samples, bad input, double backward, NaN rule).
#include <cmath>
#include <cstdio>

#include "graft/autograd/gradcheck.h"
#include "graft/ops/custom.h"
#include "graft/ops/ops.h"
#include "graft/testing/registry.h"

using namespace graft;

// ---- a row-style op ---------------------------------------------------------------------------

// softsign: y = x / (1 + |x|), dy/dx = 1 / (1 + |x|)^2, which has a corner at 0. The lambdas
// take auto parameters: unary_row instantiates them at double (the reference) and at float (the
// vectorised loop).
constexpr auto softsign_f = [](auto x, auto, auto) { return x / (1 + std::fabs(x)); };
constexpr auto softsign_df = [](auto x, auto, auto, auto) {
  const auto d = 1 + std::fabs(x);
  return 1 / (d * d);
};
// Its derivative as recorded ops too (.df_op), so its backward can be differentiated again
// (autograd::grad with create_graph): 1 / (1 + |x|)^2 = (1 + |x|)^-2.
Tensor softsign_df_op(const UnaryOp&, const Tensor& x, const Tensor&, double, double) {
  return pow(add(abs(x), 1.0), -2.0);
}
const UnaryOp kSoftsign = unary_row<softsign_f, softsign_df>({.name = "softsign",
                                                              .lo = -3,
                                                              .hi = 3,
                                                              .kinks = {0.0},
                                                              .family = "custom",
                                                              .df_op = softsign_df_op});

Tensor softsign(const Tensor& x) { return unary(kSoftsign, x); }

// ---- a hand-written op ------------------------------------------------------------------------

GRAFT_DECLARE_OP("softplus", "custom");

// softplus: dx = dout * sigmoid(x); x is what the forward saved. Built from graft's ops, so it
// has a double backward as it is.
Tensor softplus_backward(const Tensor& dout, const Tensor& x) { return mul(dout, sigmoid(x)); }

// softplus: y = log(1 + exp(x)), elementwise; x (...) -> y (...)
Tensor softplus(const Tensor& x) {
  kern::check_float("softplus", x);   // "softplus: expected a float tensor, got ..."
  const Tensor xc = kern::contig(x);  // x itself when contiguous: simple loops below
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  GRAFT_DISPATCH_FLOAT(x.dtype(), "softplus", [&] {
    const T* px = xc.data<T>();
    T* py = y.data<T>();
    // log1p(exp(-|x|)) + max(x, 0) avoids overflow for large x; chunks over the threads.
    kern::parallel_for(x.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        py[i] = std::log1p(std::exp(-std::fabs(px[i]))) + std::max(px[i], T(0));
    });
  });
  // Saved: x itself, not the contiguous copy xc: under create_graph the backward's sigmoid(x) is
  // differentiated through x's own tape route, which a copy made here would cut.
  if (autograd::needs_record({x}))
    autograd::record("softplus", {x}, {y}, {x}, [](const autograd::Ctx& c, const Tensors& dout) {
      return Tensors{softplus_backward(dout[0], c.saved[0])};
    });
  return y;
}

int main() {
  register_unary_cases(kSoftsign);  // softsign/contiguous and softsign/transposed
  // softplus's record: one sample, its bad input, its double backward (composed of graft's ops:
  // softplus_backward is mul and sigmoid) and its NaN rule.
  register_op({.name = "softplus",
               .family = "custom",
               .forward = "softplus",
               .backward = "softplus_backward",
               .double_backward = DoubleBackward::composed,
               .samples = {{.name = "custom/softplus",
                            .make_inputs =
                                [](DType dt, Generator& g) {
                                  return Tensors{case_input_t({3, 4}, dt, g, -3, 3)};
                                },
                            .fn = [](const Tensors& x) { return softplus(x[0]); }}},
               .error_inputs = {{"an int64 input", [] { softplus(ones({2}, DType::i64)); },
                                 "softplus: expected a float tensor, got i64 (2)"}},
               .nonfinite = nan_propagates()});
  int failures = 0, checked = 0;
  for (const OpRecord& r : registered_records()) {
    for (const std::string& m : missing_fields(r)) std::printf("%s\n", m.c_str());
    for (const ErrorInput& e : r.error_inputs) {
      const std::string complaint = check_error_input(e);
      if (!complaint.empty()) std::printf("%s: %s\n", r.name.c_str(), complaint.c_str());
      failures += !complaint.empty();
    }
    failures += (int)missing_fields(r).size();
  }
  for (const OpCase& c : registered_cases()) {
    if (c.op != "softplus" && c.op != "softsign") continue;
    Generator g(1);
    GradcheckResult r64 = gradcheck(c.fn, c.make_inputs(DType::f64, g), c.opt);
    Generator g2(1);
    GradcheckResult r2 = gradgradcheck(c.fn, c.make_inputs(DType::f64, g2), c.opt);
    GradcheckResult r32 = check_f32_vs_f64(c);
    std::printf("%-20s float64 gradcheck: %s  gradgradcheck: %s  float32 vs float64: %s\n",
                c.name.c_str(), r64.ok ? "ok" : r64.message.c_str(),
                r2.ok ? "ok" : r2.message.c_str(), r32.ok ? "ok" : r32.message.c_str());
    failures += !r64.ok + !r2.ok + !r32.ok;
    ++checked;
  }
  // Use them in a computation like any other op.
  Tensor x = from_vector(std::vector<double>{-2, 0, 2}, {3}).requires_grad_();
  sum(add(softplus(x), softsign(x))).backward();
  std::printf("d/dx [softplus + softsign] at [-2, 0, 2] = %s\n", x.grad().str().c_str());
  return failures || checked != 3 ? 1 : 0;
}
