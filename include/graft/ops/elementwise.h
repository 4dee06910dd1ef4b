/// @file
/// Elementwise ops with NumPy/PyTorch broadcasting. Inputs of a binary op must share a float
/// dtype; the output has the broadcast shape. Shape legend: a (..), b (..) -> out broadcast(a, b).
///
/// Every op here throws graft::Error, naming the op, when an input is undefined or not float
/// (the masks and conditions excepted), when two inputs differ in dtype, and when shapes do not
/// broadcast ("add: shapes (2, 3) and (4, 3) cannot be broadcast (dim 0: 2 vs 4)").
#pragma once

#include <vector>

#include "graft/autograd/tensor.h"
#include "graft/ops/custom.h"

namespace graft {

// ---- unary ops: one table row each ----------------------------------------------------------
/// What a unary op's derivative reads, and so what its tape entry saves: the input x, the
/// output y = f(x), or nothing (affine, whose derivative is a constant).
enum class Saves { input, output, nothing };
/// The oneDNN eltwise algorithm that runs a unary op in float32 (none: the reference loop runs
/// it). Each value's formula is oneDNN's: pow is a * x^b, linear is a * x + b, logistic is the
/// sigmoid, swish is x * sigmoid(a * x), abs is |x| (derivative 0 at 0).
enum class Eltwise {
  none,
  exp,
  log,
  sqrt,
  pow,
  tanh,
  logistic,
  relu,
  gelu_erf,
  gelu_tanh,
  linear,
  swish,
  abs
};
/// A row's float32 forward over a contiguous run: y[i] = f(x[i]; a, b) for i < n.
using UnaryF32 = void (*)(const float* x, float* y, int64_t n, float a, float b);
/// A row's float32 backward over a contiguous run: dx[i] = dy[i] * df(x[i], y[i]; a, b); x or y
/// is null when the row does not save it.
using UnaryDf32 = void (*)(const float* x, const float* y, const float* dy, float* dx, int64_t n,
                           float a, float b);
/// One row of the unary-op table: everything about an elementwise op y = f(x; a, b).
///
/// An elementwise op y = f(x; a, b) is one row: its name, the float64 reference f and derivative,
/// what the derivative reads, how float32 runs it (the oneDNN algorithm, else the row's float32
/// loops f32/df32, else the float64 functions called per element, which is 5-10 times slower),
/// and the input range and kinks of its default gradcheck cases. unary_row<F, DF>(row) fills f,
/// df, f32 and df32 from one generic formula and derivative, the float32 loops vectorised.
/// unary(row, x, a, b) runs it (forward, and backward dx = dout * df(x, y, a, b)); the row's op is
/// declared by its first recorded use or by register_unary_cases(row) (graft/testing/registry.h,
/// in graft_testing), which also registers its record with
/// two default gradcheck cases: "<name>/contiguous" (3, 4) and "<name>/transposed" (a (3, 4)
/// view of (4, 3) storage). The tape and the cases keep copies of the row, so it may be a
/// temporary; its name must be a string literal. See exp, relu, affine in elementwise.cpp, and
/// examples/custom_op.
struct UnaryOp {
  const char* name;  ///< the op name on the tape and in errors; a string literal
  double (*f)(double x, double a, double b) = nullptr;  ///< the float64 reference y = f(x; a, b)
  double (*df)(double x, double y, double a, double b) = nullptr;  ///< dy/dx at x, given y = f(x)
  Saves saves = Saves::input;                                      ///< what df reads
  Eltwise onednn = Eltwise::none;  ///< oneDNN eltwise algorithm (f = its formula), or none
  UnaryF32 f32 = nullptr;    ///< float32 forward loop when onednn is none (null: f per element)
  UnaryDf32 df32 = nullptr;  ///< float32 backward loop when onednn is none (null: df per element)
  /// Input range of the default cases.
  ///@{
  double lo = -1, hi = 1;
  ///@}
  /// Where f or df is not smooth: case inputs stay 10% of the range away.
  std::vector<double> kinks = {};
  /// a and b of the default cases.
  ///@{
  double case_a = 0, case_b = 0;
  ///@}
  const char* family = "elementwise";  ///< the family it is declared under (declare_op())
  /// The derivative df(x, y; a, b) as recorded graft ops, for the backward under create_graph
  /// (dx = dout * df_op(...), differentiable again): x or y is undefined when the row does not
  /// save it. unary_df_constant serves a row whose df is piecewise constant (relu, abs, clamp).
  /// Null: the row has no double backward, and its op is declared so (declare_op()).
  Tensor (*df_op)(const UnaryOp& row, const Tensor& x, const Tensor& y, double a,
                  double b) = nullptr;
};
/// A df_op for a row whose derivative is piecewise constant: df evaluated elementwise into a
/// tensor that records nothing (its own derivative is zero wherever it is defined).
Tensor unary_df_constant(const UnaryOp& row, const Tensor& x, const Tensor& y, double a, double b);
/// The vectorised float32 loops of unary_row: F(x, a, b) and DF(x, y, a, b) instantiated at
/// float, inlined into loops marked GRAFT_SIMD (unary() splits the elements over threads).
///@{
template <auto F>
void unary_f32_loop(const float* x, float* y, int64_t n, float a, float b) {
  GRAFT_SIMD
  for (int64_t i = 0; i < n; ++i) y[i] = F(x[i], a, b);
}
template <auto DF>
void unary_df32_loop(const float* x, const float* y, const float* dy, float* dx, int64_t n, float a,
                     float b) {
  if (x && y) {
    GRAFT_SIMD
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * DF(x[i], y[i], a, b);
  } else if (x) {
    GRAFT_SIMD
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * DF(x[i], 0.0f, a, b);
  } else {
    GRAFT_SIMD
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * DF(0.0f, y[i], a, b);
  }
}
///@}
/// A row from one formula: F(x, a, b) -> y and DF(x, y, a, b) -> dy/dx, generic lambdas (auto
/// parameters) written once for both precisions; `row` gives the rest (name, saves, case
/// range, ...). Fills row.f and row.df with F and DF at double, row.f32 and row.df32 with
/// vectorised float32 loops of them. Use kern::exp, kern::sin, kern::cos (ops/custom.h) inside:
/// their float versions vectorise, std::exp's do not. For example SiLU:
///
///     constexpr auto silu_f = [](auto x, auto, auto) { return x / (1 + kern::exp(-x)); };
///     constexpr auto silu_df = [](auto x, auto, auto, auto) {
///       const auto s = 1 / (1 + kern::exp(-x));
///       return s * (1 + x * (1 - s));
///     };
///     const UnaryOp kSilu = unary_row<silu_f, silu_df>({.name = "my_silu", .lo = -3, .hi = 3});
template <auto F, auto DF>
UnaryOp unary_row(UnaryOp row) {
  row.f = [](double x, double a, double b) -> double { return F(x, a, b); };
  row.df = [](double x, double y, double a, double b) -> double { return DF(x, y, a, b); };
  row.f32 = unary_f32_loop<F>;
  row.df32 = unary_df32_loop<DF>;
  return row;
}

/// Runs the unary op `op` on x with parameters a and b: x (...) -> y (...), same dtype;
/// recorded with backward dx = dout * df(x, y, a, b).
/// @throws graft::Error when x is undefined or not float.
Tensor unary(const UnaryOp& op, const Tensor& x, double a = 0, double b = 0);

/// out = a + b, broadcast.
Tensor add(const Tensor& a, const Tensor& b);
/// Scalar forms of add, sub, mul and div (affines on the tape): x (...) -> (...).
///@{
Tensor add(const Tensor& x, double c);
Tensor add(double c, const Tensor& x);
Tensor sub(const Tensor& x, double c);
Tensor sub(double c, const Tensor& x);
Tensor mul(const Tensor& x, double c);
Tensor mul(double c, const Tensor& x);
Tensor div(const Tensor& x, double c);
///@}
/// out = max(a, b) and min(a, b) elementwise, broadcast (PyTorch's maximum/minimum): NaN in
/// either gives NaN; where a == b each gets half the gradient.
///@{
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
///@}
/// out = a - b, broadcast.
Tensor sub(const Tensor& a, const Tensor& b);
/// out = a * b, broadcast.
Tensor mul(const Tensor& a, const Tensor& b);
/// out = a / b, broadcast.
Tensor div(const Tensor& a, const Tensor& b);
/// out = x * alpha + beta (scalar affine; covers x + c, x * c, c - x, -x). x (...) -> (...).
Tensor affine(const Tensor& x, double alpha, double beta);
/// out = -x (an affine on the tape).
Tensor neg(const Tensor& x);
/// out = e^x.
Tensor exp(const Tensor& x);
/// out = ln x.
Tensor log(const Tensor& x);
/// out = sqrt(x).
Tensor sqrt(const Tensor& x);
/// out = x^p; d/dx = p x^(p-1).
Tensor pow(const Tensor& x, double p);
/// out = tanh(x).
Tensor tanh(const Tensor& x);
/// out = 1 / (1 + e^-x).
Tensor sigmoid(const Tensor& x);
/// out = max(x, 0); the gradient at 0 is 0.
Tensor relu(const Tensor& x);
/// silu (swish): x * sigmoid(x) = x / (1 + e^-x), float32 through oneDNN's swish.
Tensor silu(const Tensor& x);
/// out = |x|; the gradient at 0 is 0 (PyTorch's sign(0)).
Tensor abs(const Tensor& x);
/// out = min(max(x, lo), hi) (PyTorch's clamp: hi everywhere when lo > hi); the gradient is 1
/// where lo <= x <= hi, bounds included, 0 elsewhere.
/// @throws graft::Error also when lo or hi is NaN.
Tensor clamp(const Tensor& x, double lo, double hi);
/// out = sin x and cos x. float32 runs a vectorised polynomial (kern::sin, kern::cos), accurate
/// for |x| up to about 10^5.
///@{
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
///@}
/// gelu: x * Phi(x) (erf form), or the tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x +
/// 0.044715x^3))) (recorded as op "gelu_tanh").
Tensor gelu(const Tensor& x, bool tanh_approx = false);
/// out = cond ? a : b, cond any dtype (non-zero = true), all three broadcast together.
/// Differentiable in a and b.
/// @throws graft::Error when a tensor is undefined, a or b is not float, a and b differ in
///         dtype, or the three shapes do not broadcast.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// out = mask ? value : x, mask any dtype broadcastable to x; x (...) -> (...). The gradient
/// reaches x where the mask is zero.
/// @throws graft::Error when x or the mask is undefined, x is not float or the mask does not
///         broadcast to x's shape.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

/// 1 where a == v else 0, same shape and dtype as a (any dtype); not differentiable (the result
/// never requires grad), such as a padding mask from token ids. An int64 a against an integral v
/// compares exactly. The other comparisons are in ops/compare.h.
/// @throws graft::Error when a is undefined.
Tensor eq(const Tensor& a, double v);

/// Operator shorthand for add, sub, mul, div, neg or affine: tensor op tensor broadcasts,
/// tensor op scalar is an affine. The same errors as the function it calls.
///@{
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, double c) { return add(a, c); }
inline Tensor operator+(double c, const Tensor& a) { return add(c, a); }
inline Tensor operator-(const Tensor& a, double c) { return sub(a, c); }
inline Tensor operator-(double c, const Tensor& a) { return sub(c, a); }
inline Tensor operator*(const Tensor& a, double c) { return mul(a, c); }
inline Tensor operator*(double c, const Tensor& a) { return mul(c, a); }
inline Tensor operator/(const Tensor& a, double c) { return div(a, c); }
///@}

}  // namespace graft
