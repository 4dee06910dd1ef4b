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

std::vector<OpCase>& cases() {
  static std::vector<OpCase> c;
  return c;
}

}  // namespace

GradcheckResult gradcheck(const OpFn& fn, const Tensors& inputs, const GradcheckOptions& opt) {
  GradcheckResult res;
  for (auto& x : inputs)
    if (x.defined() && x.requires_grad() && x.dtype() != DType::f64)
      fail("gradcheck: input " + describe(x) + " must be float64");
  for (auto& x : inputs)
    if (x.defined()) const_cast<Tensor&>(x).zero_grad();

  Tensor out = fn(inputs);
  if (!is_floating(out.dtype())) fail("gradcheck: output " + describe(out) + " is not float");
  Generator gen(opt.seed);
  std::vector<double> g(out.numel());
  for (auto& v : g) v = 2.0 * gen.uniform() - 1.0;
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
    std::vector<double> analytic(x.numel(), 0.0);
    if (x.grad().defined()) analytic = x.grad().to_vector<double>();
    std::vector<int64_t> offs;
    for_each_offset(x.shape(), x.strides(), [&](int64_t o) { offs.push_back(o); });
    double* p = x.data<double>();
    autograd::NoGrad ng;
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double orig = p[offs[j]];
      p[offs[j]] = orig + opt.eps;
      const double fp = weighted_sum(fn(inputs), g);
      p[offs[j]] = orig - opt.eps;
      const double fm = weighted_sum(fn(inputs), g);
      p[offs[j]] = orig;
      const double numeric = (fp - fm) / (2 * opt.eps);
      const double err = std::fabs(analytic[j] - numeric);
      const double excess = err - (opt.atol + opt.rtol * std::fabs(numeric));
      res.max_abs_err = std::max(res.max_abs_err, err);
      if (excess > 0 && excess > worst_excess) {
        worst_excess = excess;
        std::ostringstream os;
        os.precision(10);
        os << "input " << k << " " << describe(x) << " at " << index_str(x.shape(), j)
           << ": analytic " << analytic[j] << ", numeric " << numeric << " (|diff| " << err
           << ")";
        res.message = os.str();
        res.ok = false;
      }
    }
    const_cast<Tensor&>(x).zero_grad();
  }
  return res;
}

void register_case(OpCase c) {
  static std::mutex m;
  std::lock_guard<std::mutex> lk(m);
  for (auto& e : cases())
    if (e.name == c.name) fail("register_case: duplicate case name '" + c.name + "'");
  cases().push_back(std::move(c));
}

const std::vector<OpCase>& registered_cases() { return cases(); }

Tensor case_input(const Shape& shape, DType dt, Generator& g, double lo, double hi) {
  return rand(shape, dt, g, lo, hi).requires_grad_();
}

Tensor case_input_t(const Shape& shape, DType dt, Generator& g, double lo, double hi) {
  if (shape.size() < 2) fail("case_input_t: needs rank >= 2, got " + shape_str(shape));
  Shape st = shape;
  std::swap(st[st.size() - 1], st[st.size() - 2]);
  Tensor base = rand(st, dt, g, lo, hi);
  Shape strides = base.strides();
  std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
  return Tensor::view_of(base, shape, strides, 0).requires_grad_();
}

GradcheckResult check_f32_vs_f64(const OpCase& c) {
  GradcheckResult res;
  Generator g64(7), g32(7);
  Tensors x64 = c.make_inputs(DType::f64, g64);
  Tensors x32 = c.make_inputs(DType::f32, g32);
  // Same values in both precisions: the f32 inputs are the f64 ones rounded (keeping any
  // non-contiguous layout the case built).
  for (size_t k = 0; k < x64.size(); ++k) {
    if (!x64[k].defined() || !is_floating(x64[k].dtype())) continue;
    copy_into(x32[k], x64[k]);
    copy_into(x64[k], x32[k]);
    x32[k].zero_grad();
    x64[k].zero_grad();
  }
  Tensor y64 = c.fn(x64), y32 = c.fn(x32);
  auto compare = [&](const std::string& what, const Tensor& a32, const Tensor& a64) {
    auto va = a32.to_vector<double>(), vb = a64.to_vector<double>();
    if (va.size() != vb.size()) {
      res.ok = false;
      res.message = what + ": float32 has " + std::to_string(va.size()) + " elements, float64 " +
                    std::to_string(vb.size());
      return;
    }
    double scale = 0;
    for (double v : vb) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < va.size(); ++i) {
      const double err = std::fabs(va[i] - vb[i]);
      res.max_abs_err = std::max(res.max_abs_err, err);
      if (!(err <= c.f32_atol * std::max(1.0, scale) + c.f32_rtol * std::fabs(vb[i]))) {
        if (res.ok) {
          std::ostringstream os;
          os.precision(8);
          os << what << " at " << index_str(a64.shape(), i) << ": float32 " << va[i]
             << ", float64 " << vb[i];
          res.message = os.str();
        }
        res.ok = false;
      }
    }
  };
  if (y32.dtype() != DType::f32 || y64.dtype() != DType::f64) {
    res.ok = false;
    res.message = "output dtypes are " + std::string(dtype_name(y32.dtype())) + " and " +
                  dtype_name(y64.dtype());
    return res;
  }
  compare("output", y32, y64);
  if (!y64.requires_grad()) return res;
  Generator gg(99);
  std::vector<double> up(y64.numel());
  for (auto& v : up) v = 2.0 * gg.uniform() - 1.0;
  y64.backward(from_vector(up, y64.shape(), DType::f64));
  y32.backward(from_vector(up, y32.shape(), DType::f32));
  for (size_t k = 0; k < x64.size(); ++k) {
    if (!x64[k].defined() || !x64[k].requires_grad()) continue;
    if (!x32[k].grad().defined() || !x64[k].grad().defined()) {
      if (x32[k].grad().defined() != x64[k].grad().defined()) {
        res.ok = false;
        res.message = "grad of input " + std::to_string(k) + " defined in one precision only";
      }
      continue;
    }
    compare("grad of input " + std::to_string(k), x32[k].grad(), x64[k].grad());
  }
  return res;
}

}  // namespace graft
