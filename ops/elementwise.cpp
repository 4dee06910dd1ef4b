// Elementwise ops. float32 runs on oneDNN eltwise/binary primitives (forward and backward);
// float64 runs the plain reference loops of the same formulas.
#include "ops/elementwise.h"

#include <cmath>

#include "autograd/gradcheck.h"
#include "ops/kernels.h"
#include "ops/onednn/dnnl_utils.h"
#include "ops/reduce.h"

namespace graft {

using autograd::Ctx;
using dnnl::algorithm;

namespace {

// ---------------------------------------------------------------------------------------------
// Unary ops: one table row per op: the oneDNN algorithm (with alpha, beta), whether its backward
// reads the output (y) or the input (x), and the float64 reference f(x) and f'(x, y).
struct Unary {
  const char* name;
  algorithm alg;
  bool use_dst;  // backward needs y (saved) rather than x
  double (*f)(double x, double a, double b);
  double (*df)(double x, double y, double a, double b);
};

constexpr double kSqrt2OverPi = 0.7978845608028654;

double gelu_tanh_f(double x) {
  return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_df(double x) {
  const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
}

const Unary kExp{"exp", algorithm::eltwise_exp_use_dst_for_bwd, true,
                 [](double x, double, double) { return std::exp(x); },
                 [](double, double y, double, double) { return y; }};
const Unary kLog{"log", algorithm::eltwise_log, false,
                 [](double x, double, double) { return std::log(x); },
                 [](double x, double, double, double) { return 1 / x; }};
const Unary kSqrt{"sqrt", algorithm::eltwise_sqrt_use_dst_for_bwd, true,
                  [](double x, double, double) { return std::sqrt(x); },
                  [](double, double y, double, double) { return 0.5 / y; }};
// oneDNN eltwise_pow computes alpha * x^beta.
const Unary kPow{"pow", algorithm::eltwise_pow, false,
                 [](double x, double a, double b) { return a * std::pow(x, b); },
                 [](double x, double, double a, double b) { return a * b * std::pow(x, b - 1); }};
const Unary kTanh{"tanh", algorithm::eltwise_tanh_use_dst_for_bwd, true,
                  [](double x, double, double) { return std::tanh(x); },
                  [](double, double y, double, double) { return 1 - y * y; }};
const Unary kSigmoid{"sigmoid", algorithm::eltwise_logistic_use_dst_for_bwd, true,
                     [](double x, double, double) { return 1 / (1 + std::exp(-x)); },
                     [](double, double y, double, double) { return y * (1 - y); }};
const Unary kRelu{"relu", algorithm::eltwise_relu, false,
                  [](double x, double, double) { return x > 0 ? x : 0.0; },
                  [](double x, double, double, double) { return x > 0 ? 1.0 : 0.0; }};
const Unary kGeluErf{"gelu", algorithm::eltwise_gelu_erf, false,
                     [](double x, double, double) { return 0.5 * x * (1 + std::erf(x / M_SQRT2)); },
                     [](double x, double, double, double) {
                       return 0.5 * (1 + std::erf(x / M_SQRT2)) +
                              x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
                     }};
const Unary kGeluTanh{"gelu_tanh", algorithm::eltwise_gelu_tanh, false,
                      [](double x, double, double) { return gelu_tanh_f(x); },
                      [](double x, double, double, double) { return gelu_tanh_df(x); }};
// oneDNN eltwise_linear computes alpha * x + beta.
const Unary kAffine{"affine", algorithm::eltwise_linear, false,
                    [](double x, double a, double b) { return a * x + b; },
                    [](double, double, double a, double) { return a; }};

GRAFT_DECLARE_OP("exp", "elementwise");
GRAFT_DECLARE_OP("log", "elementwise");
GRAFT_DECLARE_OP("sqrt", "elementwise");
GRAFT_DECLARE_OP("pow", "elementwise");
GRAFT_DECLARE_OP("tanh", "elementwise");
GRAFT_DECLARE_OP("sigmoid", "elementwise");
GRAFT_DECLARE_OP("relu", "elementwise");
GRAFT_DECLARE_OP("gelu", "elementwise");
GRAFT_DECLARE_OP("gelu_tanh", "elementwise");
GRAFT_DECLARE_OP("affine", "elementwise");

Tensor eltwise_fwd_f32(const Unary& u, const Tensor& x, double a, double b) {
  using namespace onednn;
  Tensor xc = kern::contig(x);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  if (x.numel() == 0) return y;
  auto d = md_contiguous(x.shape());
  dnnl::eltwise_forward::desc desc(dnnl::prop_kind::forward_training, u.alg, d, (float)a,
                                   (float)b);
  dnnl::eltwise_forward::primitive_desc pd(desc, engine());
  dnnl::eltwise_forward(pd).execute(stream(), {{DNNL_ARG_SRC, mem(d, xc)}, {DNNL_ARG_DST, mem(d, y)}});
  stream().wait();
  return y;
}

Tensor eltwise_bwd_f32(const Unary& u, const Tensor& data, const Tensor& dy, double a, double b) {
  using namespace onednn;
  Tensor dx = Tensor::empty(dy.shape(), DType::f32);
  if (dy.numel() == 0) return dx;
  Tensor dc = kern::contig(data);
  auto d = md_contiguous(dy.shape());
  dnnl::eltwise_forward::desc fdesc(dnnl::prop_kind::forward_training, u.alg, d, (float)a,
                                    (float)b);
  dnnl::eltwise_forward::primitive_desc fpd(fdesc, engine());
  dnnl::eltwise_backward::desc bdesc(u.alg, d, d, (float)a, (float)b);
  dnnl::eltwise_backward::primitive_desc bpd(bdesc, engine(), fpd);
  dnnl::eltwise_backward(bpd).execute(
      stream(), {{u.use_dst ? DNNL_ARG_DST : DNNL_ARG_SRC, mem(d, dc)},
                 {DNNL_ARG_DIFF_DST, mem(d, dy)},
                 {DNNL_ARG_DIFF_SRC, mem(d, dx)}});
  stream().wait();
  return dx;
}

template <class T>
void unary_ref(const Unary& u, const Tensor& x, const Tensor& y, double a, double b) {
  const T* px = x.data<T>();
  T* py = y.data<T>();
  kern::for_each_strided(x.shape(), x.strides(),
                         [&](int64_t i, int64_t o) { py[i] = (T)u.f(px[o], a, b); });
}

template <class T>
void unary_bwd_ref(const Unary& u, const Tensor& x, const Tensor& y, const Tensor& dy,
                   const Tensor& dx, double a, double b) {
  const T* px = x.defined() ? x.data<T>() : nullptr;
  const T* py = y.defined() ? y.data<T>() : nullptr;
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  const int64_t n = dy.numel();
#pragma omp parallel for if (n > kern::kParallelGrain)
  for (int64_t i = 0; i < n; ++i)
    pdx[i] = pdy[i] * (T)u.df(px ? px[i] : 0.0, py ? py[i] : 0.0, a, b);
}

Tensor unary(const Unary& u, const Tensor& x, double a = 0, double b = 0) {
  kern::check_float(u.name, x);
  Tensor y;
  if (x.dtype() == DType::f32) {
    y = eltwise_fwd_f32(u, x, a, b);
  } else {
    y = Tensor::empty(x.shape(), x.dtype());
    unary_ref<double>(u, x, y, a, b);
  }
  if (autograd::needs_record({x})) {
    // affine's gradient is alpha * dout: nothing to keep.
    if (&u == &kAffine) {
      autograd::record(u.name, {x}, {y}, {}, [a](const Ctx&, const Tensors& dout) -> Tensors {
        return {unary(kAffine, dout[0], a, 0.0)};
      });
      return y;
    }
    const Unary* up = &u;
    autograd::record(u.name, {x}, {y}, {u.use_dst ? y : x},
                     [up, a, b](const Ctx& c, const Tensors& dout) -> Tensors {
                       const Tensor& data = c.saved[0];
                       if (data.dtype() == DType::f32)
                         return {eltwise_bwd_f32(*up, data, dout[0], a, b)};
                       Tensor dc = kern::contig(data);
                       Tensor dx = Tensor::empty(dout[0].shape(), DType::f64);
                       unary_bwd_ref<double>(*up, up->use_dst ? Tensor() : dc,
                                             up->use_dst ? dc : Tensor(), dout[0], dx, a, b);
                       return {dx};
                     });
  }
  return y;
}

// ---------------------------------------------------------------------------------------------
// Binary ops with broadcasting.
enum class BinOp { add, sub, mul, div };

template <class T>
void binary_ref(BinOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const Shape sa = kern::broadcast_strides(a, out.shape()), sb = kern::broadcast_strides(b, out.shape());
  switch (op) {
    case BinOp::add:
      kern::for_each_bcast2(out.shape(), sa, sb, [&](int64_t i, int64_t x, int64_t y) { po[i] = pa[x] + pb[y]; });
      break;
    case BinOp::sub:
      kern::for_each_bcast2(out.shape(), sa, sb, [&](int64_t i, int64_t x, int64_t y) { po[i] = pa[x] - pb[y]; });
      break;
    case BinOp::mul:
      kern::for_each_bcast2(out.shape(), sa, sb, [&](int64_t i, int64_t x, int64_t y) { po[i] = pa[x] * pb[y]; });
      break;
    case BinOp::div:
      kern::for_each_bcast2(out.shape(), sa, sb, [&](int64_t i, int64_t x, int64_t y) { po[i] = pa[x] / pb[y]; });
      break;
  }
}

algorithm binary_alg(BinOp op) {
  switch (op) {
    case BinOp::add: return algorithm::binary_add;
    case BinOp::sub: return algorithm::binary_sub;
    case BinOp::mul: return algorithm::binary_mul;
    case BinOp::div: return algorithm::binary_div;
  }
  return algorithm::binary_add;
}

// oneDNN binary broadcasts only its second source, so it runs when a already has the output
// shape; b is described with leading 1s and its own strides.
bool binary_f32(BinOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using namespace onednn;
  if (a.shape() != out.shape() || !usable(a) || b.dtype() != DType::f32 || b.numel() == 0) return false;
  const size_t r = out.shape().size();
  Shape bs(r, 1);
  Tensor bc = kern::contig(b);
  for (size_t i = 0; i < (size_t)b.dim(); ++i) bs[r - b.dim() + i] = b.shape()[i];
  // Dense strides for the padded shape, size-1 dims included: any other stride there makes
  // oneDNN 2.6 see a permuted layout and run its reference kernel (the (B, T, d) + (T, d)
  // positional-encoding add took 18-30 ms instead of 0.2).
  auto amd = md(a), bmd = md(bs, contiguous_strides(bs)), omd = md(out);
  dnnl::binary::desc d(binary_alg(op), amd, bmd, omd);
  dnnl::binary::primitive_desc pd(d, engine());
  dnnl::binary(pd).execute(stream(), {{DNNL_ARG_SRC_0, mem(amd, a)},
                                      {DNNL_ARG_SRC_1, mem(bmd, bc)},
                                      {DNNL_ARG_DST, mem(omd, out)}});
  stream().wait();
  return true;
}

Tensor binary_raw(const char* name, BinOp op, const Tensor& a, const Tensor& b) {
  kern::check_float(name, a);
  kern::check_float(name, b);
  kern::check_same_dtype(name, a, b);
  Tensor out = Tensor::empty(kern::broadcast_shapes(name, a.shape(), b.shape()), a.dtype());
  if (out.numel() == 0) return out;
  if (a.dtype() == DType::f32) {
    if (binary_f32(op, a, b, out)) return out;
    if ((op == BinOp::add || op == BinOp::mul) && binary_f32(op, b, a, out)) return out;
    binary_ref<float>(op, a, b, out);
  } else {
    binary_ref<double>(op, a, b, out);
  }
  return out;
}

GRAFT_DECLARE_OP("add", "elementwise");
GRAFT_DECLARE_OP("sub", "elementwise");
GRAFT_DECLARE_OP("mul", "elementwise");
GRAFT_DECLARE_OP("div", "elementwise");
GRAFT_DECLARE_OP("where", "elementwise");
GRAFT_DECLARE_OP("masked_fill", "elementwise");

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("add", BinOp::add, a, b);
  if (autograd::needs_record({a, b})) {
    autograd::record("add", {a, b}, {out}, {},
                     [sa = a.shape(), sb = b.shape()](const Ctx& c, const Tensors& dout) -> Tensors {
                       return {c.needs[0] ? sum_to(dout[0], sa) : Tensor(),
                               c.needs[1] ? sum_to(dout[0], sb) : Tensor()};
                     });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("sub", BinOp::sub, a, b);
  if (autograd::needs_record({a, b})) {
    autograd::record("sub", {a, b}, {out}, {},
                     [sa = a.shape(), sb = b.shape()](const Ctx& c, const Tensors& dout) -> Tensors {
                       return {c.needs[0] ? sum_to(dout[0], sa) : Tensor(),
                               c.needs[1] ? neg(sum_to(dout[0], sb)) : Tensor()};
                     });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("mul", BinOp::mul, a, b);
  if (autograd::needs_record({a, b})) {
    autograd::record("mul", {a, b}, {out}, {a, b}, [](const Ctx& c, const Tensors& dout) -> Tensors {
      const Tensor &a = c.saved[0], &b = c.saved[1];
      return {c.needs[0] ? sum_to(mul(dout[0], b), a.shape()) : Tensor(),
              c.needs[1] ? sum_to(mul(dout[0], a), b.shape()) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("div", BinOp::div, a, b);
  if (autograd::needs_record({a, b})) {
    // d(a/b)/db = -out / b, so the output is saved instead of a.
    autograd::record("div", {a, b}, {out}, {b, out}, [sa = a.shape()](const Ctx& c, const Tensors& dout) -> Tensors {
      const Tensor &b = c.saved[0], &out = c.saved[1];
      Tensor g = div(dout[0], b);
      return {c.needs[0] ? sum_to(g, sa) : Tensor(),
              c.needs[1] ? neg(sum_to(mul(g, out), b.shape())) : Tensor()};
    });
  }
  return out;
}

Tensor affine(const Tensor& x, double alpha, double beta) { return unary(kAffine, x, alpha, beta); }
Tensor neg(const Tensor& x) { return unary(kAffine, x, -1.0, 0.0); }
Tensor exp(const Tensor& x) { return unary(kExp, x); }
Tensor log(const Tensor& x) { return unary(kLog, x); }
Tensor sqrt(const Tensor& x) { return unary(kSqrt, x); }
Tensor pow(const Tensor& x, double p) { return unary(kPow, x, 1.0, p); }
Tensor tanh(const Tensor& x) { return unary(kTanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(kSigmoid, x); }
Tensor relu(const Tensor& x) { return unary(kRelu, x); }
Tensor gelu(const Tensor& x, bool tanh_approx) { return unary(tanh_approx ? kGeluTanh : kGeluErf, x); }

// ---------------------------------------------------------------------------------------------
// where / masked_fill: a 0/1 byte mask of the output shape decides which input each element
// comes from; the backward routes dout through the same mask.
namespace {

std::vector<uint8_t> bool_mask(const Tensor& cond, const Shape& out) {
  std::vector<uint8_t> m(shape_numel(out));
  const Shape sc = kern::broadcast_strides(cond, out);
  switch (cond.dtype()) {
    case DType::f32: {
      const float* p = cond.data<float>();
      kern::for_each_strided(out, sc, [&](int64_t i, int64_t o) { m[i] = p[o] != 0; });
      break;
    }
    case DType::f64: {
      const double* p = cond.data<double>();
      kern::for_each_strided(out, sc, [&](int64_t i, int64_t o) { m[i] = p[o] != 0; });
      break;
    }
    case DType::i64: {
      const int64_t* p = cond.data<int64_t>();
      kern::for_each_strided(out, sc, [&](int64_t i, int64_t o) { m[i] = p[o] != 0; });
      break;
    }
  }
  return m;
}

template <class T>
void select_ref(const std::vector<uint8_t>& m, const Tensor& a, const Tensor& b, const Tensor& out) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  kern::for_each_bcast2(out.shape(), kern::broadcast_strides(a, out.shape()),
                        kern::broadcast_strides(b, out.shape()),
                        [&](int64_t i, int64_t x, int64_t y) { po[i] = m[i] ? pa[x] : pb[y]; });
}

// dout where keep[i] == want else 0 (a fresh tensor).
Tensor route(const Tensor& dout, const std::shared_ptr<std::vector<uint8_t>>& m, bool want) {
  Tensor g = Tensor::empty(dout.shape(), dout.dtype());
  GRAFT_DISPATCH_FLOAT(dout.dtype(), "where", [&] {
    const T* pd = dout.data<T>();
    T* pg = g.data<T>();
    const auto& mm = *m;
    for (int64_t i = 0; i < dout.numel(); ++i) pg[i] = (mm[i] != 0) == want ? pd[i] : T(0);
  });
  return g;
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  kern::check_float("where", a);
  kern::check_float("where", b);
  kern::check_same_dtype("where", a, b);
  Shape out_shape = kern::broadcast_shapes("where", cond.shape(),
                                           kern::broadcast_shapes("where", a.shape(), b.shape()));
  auto m = std::make_shared<std::vector<uint8_t>>(bool_mask(cond, out_shape));
  Tensor out = Tensor::empty(out_shape, a.dtype());
  GRAFT_DISPATCH_FLOAT(a.dtype(), "where", [&] { select_ref<T>(*m, a, b, out); });
  if (autograd::needs_record({a, b})) {
    autograd::record("where", {a, b}, {out}, {},
                     [m, sa = a.shape(), sb = b.shape()](const Ctx& c, const Tensors& dout) -> Tensors {
                       return {c.needs[0] ? sum_to(route(dout[0], m, true), sa) : Tensor(),
                               c.needs[1] ? sum_to(route(dout[0], m, false), sb) : Tensor()};
                     });
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  kern::check_float("masked_fill", x);
  if (kern::broadcast_shapes("masked_fill", x.shape(), mask.shape()) != x.shape())
    fail("masked_fill: mask " + describe(mask) + " does not broadcast to x " + describe(x));
  auto m = std::make_shared<std::vector<uint8_t>>(bool_mask(mask, x.shape()));
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  GRAFT_DISPATCH_FLOAT(x.dtype(), "masked_fill", [&] {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const auto& mm = *m;
    kern::for_each_strided(x.shape(), x.strides(),
                           [&](int64_t i, int64_t o) { po[i] = mm[i] ? (T)value : px[o]; });
  });
  if (autograd::needs_record({x})) {
    autograd::record("masked_fill", {x}, {out}, {}, [m](const Ctx&, const Tensors& dout) -> Tensors {
      return {route(dout[0], m, false)};
    });
  }
  return out;
}

Tensor eq(const Tensor& a, double v) {
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  auto vals = a.to_vector<double>();
  switch (a.dtype()) {
    case DType::f32: for (size_t i = 0; i < vals.size(); ++i) out.data<float>()[i] = vals[i] == v; break;
    case DType::f64: for (size_t i = 0; i < vals.size(); ++i) out.data<double>()[i] = vals[i] == v; break;
    case DType::i64: for (size_t i = 0; i < vals.size(); ++i) out.data<int64_t>()[i] = vals[i] == v; break;
  }
  return out;
}

Tensor argmax(const Tensor& x, int64_t axis) {
  kern::check_float("argmax", x);
  const int64_t ax = norm_axis("argmax", axis, x.dim());
  Shape os = x.shape();
  os.erase(os.begin() + ax);
  Tensor out = Tensor::empty(os, DType::i64);
  Tensor xc = kern::contig(x);
  const int64_t n = x.shape()[ax];
  if (n == 0) fail("argmax: axis " + std::to_string(axis) + " of " + describe(x) + " is empty");
  int64_t inner = 1;
  for (int64_t d = ax + 1; d < x.dim(); ++d) inner *= x.shape()[d];
  const int64_t outer = out.numel() / std::max<int64_t>(inner, 1);
  GRAFT_DISPATCH_FLOAT(x.dtype(), "argmax", [&] {
    const T* p = xc.data<T>();
    int64_t* po = out.data<int64_t>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t best = 0;
        for (int64_t k = 1; k < n; ++k)
          if (p[(o * n + k) * inner + i] > p[(o * n + best) * inner + i]) best = k;
        po[o * inner + i] = best;
      }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Gradcheck cases.
namespace {
Tensors one(const Shape& s, DType dt, Generator& g, double lo = -1, double hi = 1) {
  return {case_input(s, dt, g, lo, hi)};
}
}  // namespace

GRAFT_OP_CASE({.name = "add/broadcast", .op = "add",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input({2, 3, 4}, dt, g), case_input({3, 1}, dt, g)}; },
               .fn = [](const Tensors& x) { return add(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "add/noncontig_lhs_broadcast", .op = "add",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input({4}, dt, g), case_input_t({3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return add(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "sub/broadcast", .op = "sub",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input({3, 1}, dt, g), case_input_t({3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return sub(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "mul/broadcast", .op = "mul",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({2, 3, 4}, dt, g), case_input({4}, dt, g)}; },
               .fn = [](const Tensors& x) { return mul(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "mul/same_tensor", .op = "mul",
               .make_inputs = [](DType dt, Generator& g) { return one({3, 4}, dt, g); },
               .fn = [](const Tensors& x) { return mul(x[0], x[0]); }});
GRAFT_OP_CASE({.name = "div/broadcast", .op = "div",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({2, 3}, dt, g), case_input({2, 1}, dt, g, 0.5, 2.0)}; },
               .fn = [](const Tensors& x) { return div(x[0], x[1]); }});
GRAFT_OP_CASE({.name = "affine", .op = "affine",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return 2.5 - x[0] * 0.5; }});
GRAFT_OP_CASE({.name = "exp", .op = "exp",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g)}; },
               .fn = [](const Tensors& x) { return exp(x[0]); }});
GRAFT_OP_CASE({.name = "log", .op = "log",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g, 0.5, 2.0)}; },
               .fn = [](const Tensors& x) { return log(x[0]); }});
GRAFT_OP_CASE({.name = "sqrt", .op = "sqrt",
               .make_inputs = [](DType dt, Generator& g) { return one({3, 4}, dt, g, 0.5, 2.0); },
               .fn = [](const Tensors& x) { return sqrt(x[0]); }});
GRAFT_OP_CASE({.name = "pow", .op = "pow",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g, 0.5, 2.0)}; },
               .fn = [](const Tensors& x) { return pow(x[0], 2.5); }});
GRAFT_OP_CASE({.name = "tanh", .op = "tanh",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g, -2, 2)}; },
               .fn = [](const Tensors& x) { return tanh(x[0]); }});
GRAFT_OP_CASE({.name = "sigmoid", .op = "sigmoid",
               .make_inputs = [](DType dt, Generator& g) { return one({3, 4}, dt, g, -3, 3); },
               .fn = [](const Tensors& x) { return sigmoid(x[0]); }});
// relu has a kink at 0: inputs are drawn from [0.1, 1] and negated in half the entries.
GRAFT_OP_CASE({.name = "relu", .op = "relu",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g, 0.1, 1)}; },
               .fn = [](const Tensors& x) {
                 return relu(mul(x[0], from_vector(std::vector<double>{1, -1, 1, -1}, {4}, x[0].dtype())));
               }});
GRAFT_OP_CASE({.name = "gelu/erf", .op = "gelu",
               .make_inputs = [](DType dt, Generator& g) { return Tensors{case_input_t({3, 4}, dt, g, -3, 3)}; },
               .fn = [](const Tensors& x) { return gelu(x[0]); }});
GRAFT_OP_CASE({.name = "gelu/tanh", .op = "gelu_tanh",
               .make_inputs = [](DType dt, Generator& g) { return one({3, 4}, dt, g, -3, 3); },
               .fn = [](const Tensors& x) { return gelu(x[0], true); }});
GRAFT_OP_CASE({.name = "where/broadcast", .op = "where",
               .make_inputs = [](DType dt, Generator& g) {
                 return Tensors{from_vector(std::vector<int64_t>{1, 0, 0, 1}, {4}, DType::i64),
                                case_input_t({3, 4}, dt, g), case_input({1}, dt, g)};
               },
               .fn = [](const Tensors& x) { return where(x[0], x[1], x[2]); }});
GRAFT_OP_CASE({.name = "masked_fill/broadcast", .op = "masked_fill",
               .make_inputs = [](DType dt, Generator& g) {
                 return Tensors{case_input_t({2, 3, 4}, dt, g),
                                from_vector(std::vector<int64_t>{0, 1, 0}, {3, 1}, DType::i64)};
               },
               .fn = [](const Tensors& x) { return masked_fill(x[0], x[1], -7.0); }});

}  // namespace graft
