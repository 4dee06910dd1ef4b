#include "graft/autograd/gradcheck.h"

#include <cmath>
#include <mutex>
#include <sstream>

namespace graft {

namespace {

double weighted_sum(const Tensor& out, const std::vector<double>& g) {
  auto v = out.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * g[i];
  return s;
}

std::string index_str(const Shape& shape, int64_t flat) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_str(idx);
}

}  // namespace

namespace {

// Why a second derivative that is exactly 0 where the numeric one is not goes wrong: the usual
// cause is a backward that computes its gradient off the tape under create_graph.
constexpr const char* kZeroSecondDerivative =
    ": the analytic second derivative is exactly 0, so the op's backward may not be "
    "differentiable (it runs untracked kernels or saves untracked copies under create_graph): "
    "build its gradient from recorded ops when Ctx::create_graph is set, or declare the op "
    "GRAFT_DECLARE_OP_ONCE_DIFFERENTIABLE";

// Compares `analytic` (one value per element of x, in row-major order) with central differences
// of f() as each element of x moves by +-eps; the worst excess over the tolerance goes in res.
// `second_order`: analytic holds second derivatives (gradgradcheck), and an exact 0 says why.
template <class F>
void check_against_differences(GradcheckResult& res, double& worst_excess, const std::string& label,
                               const Tensor& x, const std::vector<double>& analytic, F&& f,
                               const GradcheckOptions& opt, bool second_order = false) {
  std::vector<int64_t> offs;
  for_each_offset(x.shape(), x.strides(), [&](int64_t o) { offs.push_back(o); });
  double* p = x.data<double>();
  for (int64_t j = 0; j < x.numel(); ++j) {
    const double orig = p[offs[j]];
    p[offs[j]] = orig + opt.eps;
    const double fp = f();
    p[offs[j]] = orig - opt.eps;
    const double fm = f();
    p[offs[j]] = orig;
    const double numeric = (fp - fm) / (2 * opt.eps);
    const double err = std::fabs(analytic[j] - numeric);
    const double excess = err - (opt.atol + opt.rtol * std::fabs(numeric));
    res.max_abs_err = std::max(res.max_abs_err, err);
    if (excess > 0 && excess > worst_excess) {
      worst_excess = excess;
      std::ostringstream os;
      os.precision(10);
      os << label << " " << describe(x) << " at " << index_str(x.shape(), j) << ": analytic "
         << analytic[j] << ", numeric " << numeric << " (|diff| " << err << ")";
      if (second_order && analytic[j] == 0.0) os << kZeroSecondDerivative;
      res.message = os.str();
      res.ok = false;
    }
  }
}

// The dtype of the low-precision side of a comparison: its first float input's (float32 when
// it has none).
DType low_dtype(const Tensors& x) {
  for (const Tensor& t : x)
    if (t.defined() && is_floating(t.dtype())) return t.dtype();
  return DType::f32;
}

std::vector<double> values_or_zeros(const Tensor& g, int64_t n) {
  return g.defined() ? g.to_vector<double>() : std::vector<double>((size_t)n, 0.0);
}

std::vector<double> random_signs(size_t n, Generator& gen) {
  std::vector<double> g(n);
  for (auto& v : g) v = 2.0 * gen.uniform() - 1.0;
  return g;
}

// The checks differentiate float64 inputs only: `who` names the check in the error.
void check_float64_inputs(const Tensors& inputs, const char* who) {
  for (auto& x : inputs)
    if (x.defined() && x.requires_grad() && x.dtype() != DType::f64)
      fail(std::string(who) + ": input " + describe(x) + " must be float64");
}

}  // namespace

GradcheckResult gradcheck(const OpFn& fn, const Tensors& inputs, const GradcheckOptions& opt) {
  GradcheckResult res;
  check_float64_inputs(inputs, "gradcheck");
  for (auto& x : inputs)
    if (x.defined()) const_cast<Tensor&>(x).zero_grad();

  Tensor out = fn(inputs);
  if (!is_floating(out.dtype())) fail("gradcheck: output " + describe(out) + " is not float");
  Generator gen(opt.seed);
  const std::vector<double> g = random_signs((size_t)out.numel(), gen);
  if (!out.requires_grad()) {
    res.ok = false;
    res.message = "output does not require grad: no input of the op requires grad";
    return res;
  }
  out.backward(from_vector(g, out.shape(), out.dtype()));

  double worst_excess = -1;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    check_against_differences(
        res, worst_excess, "input " + std::to_string(k), x, values_or_zeros(x.grad(), x.numel()),
        [&] {
          autograd::NoGrad ng;
          return weighted_sum(fn(inputs), g);
        },
        opt);
    const_cast<Tensor&>(x).zero_grad();
  }
  return res;
}

namespace {

// What gradgradcheck and its float32 comparison share: the inputs that require grad, the random
// upstream gradient v of the output (a leaf that requires grad) and the random weights u of the
// first gradients.
struct SecondOrder {
  Tensors wrt;  // the inputs that require grad, then v
  Tensor v;
  std::vector<std::vector<double>> u;  // one per input that requires grad
  std::vector<size_t> index;           // the position of each in the op's inputs
};

SecondOrder second_order_setup(const OpFn& fn, const Tensors& inputs, uint64_t seed, DType dt) {
  SecondOrder so;
  Generator gen(seed);
  Tensor out;
  {
    autograd::NoGrad ng;
    out = fn(inputs);
  }
  so.v = from_vector(random_signs((size_t)out.numel(), gen), out.shape(), dt).requires_grad_();
  for (size_t k = 0; k < inputs.size(); ++k)
    if (const Tensor& x = inputs[k]; x.defined() && x.requires_grad()) {
      so.index.push_back(k);
      so.wrt.push_back(x);
      so.u.push_back(random_signs((size_t)x.numel(), gen));
    }
  return so;
}

// The first gradients d(sum(fn(x) * v))/dx, one per input that requires grad (undefined where
// none arrives), recorded when `create`.
Tensors first_gradients(const OpFn& fn, const Tensors& inputs, const SecondOrder& so, bool create) {
  Tensor out = fn(inputs);
  if (!out.requires_grad())
    fail("gradgradcheck: the output does not require grad: no input of the op requires grad");
  Tensors xs(so.wrt.begin(), so.wrt.end() - 1);
  return autograd::grad({out}, xs, {so.v}, {.create_graph = create, .allow_unused = true});
}

// The double backward: d(sum_k G_k * u_k)/d(x, v), zeros where nothing arrives.
std::vector<std::vector<double>> second_gradients(const OpFn& fn, const Tensors& inputs,
                                                  SecondOrder& so) {
  so.wrt.push_back(so.v);
  const Tensors first = first_gradients(fn, inputs, so, true);
  Tensors outs, ups;
  for (size_t k = 0; k < first.size(); ++k)
    if (first[k].defined() && first[k].requires_grad()) {
      outs.push_back(first[k]);
      ups.push_back(from_vector(so.u[k], first[k].shape(), first[k].dtype()));
    }
  std::vector<std::vector<double>> out;
  Tensors second;
  if (!outs.empty()) second = autograd::grad(outs, so.wrt, ups, {.allow_unused = true});
  autograd::clear_tape();  // the first gradients' graph, when nothing reached it
  for (size_t k = 0; k < so.wrt.size(); ++k)
    out.push_back(values_or_zeros(second.empty() ? Tensor() : second[k], so.wrt[k].numel()));
  return out;
}

}  // namespace

GradcheckResult gradgradcheck(const OpFn& fn, const Tensors& inputs, const GradcheckOptions& opt) {
  GradcheckResult res;
  check_float64_inputs(inputs, "gradgradcheck");
  SecondOrder so = second_order_setup(fn, inputs, opt.seed, DType::f64);
  if (so.wrt.empty()) fail("gradgradcheck: no input requires grad");
  const std::vector<std::vector<double>> analytic = second_gradients(fn, inputs, so);
  auto weighted_first = [&] {
    const Tensors g = first_gradients(fn, inputs, so, false);
    double s = 0;
    for (size_t k = 0; k < g.size(); ++k)
      if (g[k].defined()) s += weighted_sum(g[k], so.u[k]);
    return s;
  };
  double worst_excess = -1;
  for (size_t k = 0; k < so.wrt.size(); ++k) {
    const bool is_v = k + 1 == so.wrt.size();
    check_against_differences(res, worst_excess,
                              is_v ? "upstream gradient" : "input " + std::to_string(so.index[k]),
                              so.wrt[k], analytic[k], weighted_first, opt, true);
  }
  return res;
}

namespace {

// Adds to res the elements where a32 and a64 differ by more than the case's float32 tolerances
// (f32_atol relative to the largest float64 value, or 1).
void compare_precisions(GradcheckResult& res, const PrecisionTolerances& tol,
                        const std::string& what, const Tensor& a32, const Tensor& a64) {
  auto va = a32.to_vector<double>(), vb = a64.to_vector<double>();
  if (va.size() != vb.size()) {
    res.ok = false;
    res.message = what + ": " + dtype_name(a32.dtype()) + " has " + std::to_string(va.size()) +
                  " elements, float64 " + std::to_string(vb.size());
    return;
  }
  double scale = 0;
  for (double v : vb) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < va.size(); ++i) {
    const double err = std::fabs(va[i] - vb[i]);
    res.max_abs_err = std::max(res.max_abs_err, err);
    if (!(err <= tol.atol * std::max(1.0, scale) + tol.rtol * std::fabs(vb[i]))) {
      if (res.ok) {
        std::ostringstream os;
        os.precision(8);
        os << what << " at " << index_str(a64.shape(), i) << ": " << dtype_name(a32.dtype()) << " "
           << va[i] << ", float64 " << vb[i];
        res.message = os.str();
      }
      res.ok = false;
    }
  }
}

}  // namespace

GradcheckResult compare_f32_f64(const OpFn& fn, const Tensors& x32, const Tensors& x64,
                                const PrecisionTolerances& tol) {
  GradcheckResult res;
  const DType low = low_dtype(x32);
  Tensor y64 = fn(x64), y32 = fn(x32);
  if (y32.dtype() != low || y64.dtype() != DType::f64) {
    res.ok = false;
    res.message = "output dtypes are " + std::string(dtype_name(y32.dtype())) + " and " +
                  dtype_name(y64.dtype());
    return res;
  }
  compare_precisions(res, tol, "output", y32, y64);
  if (!y64.requires_grad()) return res;
  Generator gg(99);
  // The upstream gradient as the low dtype holds it, the same values on both sides.
  const Tensor up = from_vector(random_signs((size_t)y64.numel(), gg), y32.shape(), low);
  y64.backward(cast_copy(up, DType::f64));
  y32.backward(up);
  for (size_t k = 0; k < x64.size(); ++k) {
    if (!x64[k].defined() || !x64[k].requires_grad()) continue;
    if (!x32[k].grad().defined() || !x64[k].grad().defined()) {
      if (x32[k].grad().defined() != x64[k].grad().defined()) {
        res.ok = false;
        res.message = "grad of input " + std::to_string(k) + " defined in one precision only";
      }
      continue;
    }
    if (x32[k].grad().dtype() != x32[k].dtype()) {
      res.ok = false;
      res.message = "grad of input " + std::to_string(k) + " " + describe(x32[k]) + " is " +
                    dtype_name(x32[k].grad().dtype()) + ", not the input's dtype";
      continue;
    }
    compare_precisions(res, tol, "grad of input " + std::to_string(k), x32[k].grad(),
                       x64[k].grad());
  }
  return res;
}

GradcheckResult compare_f32_f64_double_backward(const OpFn& fn, const Tensors& x32,
                                                const Tensors& x64,
                                                const PrecisionTolerances& tol) {
  GradcheckResult res;
  SecondOrder s32 = second_order_setup(fn, x32, 99, DType::f32);
  SecondOrder s64 = second_order_setup(fn, x64, 99, DType::f64);
  if (s64.wrt.empty()) return res;
  const auto a32 = second_gradients(fn, x32, s32);
  const auto a64 = second_gradients(fn, x64, s64);
  for (size_t k = 0; k < a64.size(); ++k) {
    const Shape& shape = s64.wrt[k].shape();
    compare_precisions(
        res, tol,
        "second-order grad of " + std::string(k + 1 == a64.size()
                                                  ? "the upstream gradient"
                                                  : "input " + std::to_string(s64.index[k])),
        from_vector(a32[k], shape, DType::f64), from_vector(a64[k], shape, DType::f64));
  }
  return res;
}

}  // namespace graft
