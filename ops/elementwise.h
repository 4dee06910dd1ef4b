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

namespace graft {

// ---- unary ops: one table row each ----------------------------------------------------------
/// What a unary op's derivative reads, and so what its tape entry saves: the input x, the
/// output y = f(x), or nothing (affine, whose derivative is a constant).
enum class Saves { input, output, nothing };
/// The oneDNN eltwise algorithm that runs a unary op in float32 (none: the reference loop runs
/// it). Each value's formula is oneDNN's: pow is a * x^b, linear is a * x + b, logistic is the
/// sigmoid.
enum class Eltwise { none, exp, log, sqrt, pow, tanh, logistic, relu, gelu_erf, gelu_tanh, linear };
/// One row of the unary-op table: everything about an elementwise op y = f(x; a, b).
///
/// An elementwise op y = f(x; a, b) is one row: its name, the float64 reference f and derivative,
/// what the derivative reads, the oneDNN algorithm that runs it in float32 (or none: then float32
/// runs the reference loop too), and the input range and kinks of its default gradcheck cases.
/// unary(row, x, a, b) runs it (forward, and backward dx = dout * df(x, y, a, b)); the row's op is
/// declared by its first recorded use or by register_unary_cases(row), which also registers its
/// two default gradcheck cases: "<name>/contiguous" (3, 4) and "<name>/transposed" (a (3, 4)
/// view of (4, 3) storage). The tape and the cases keep copies of the row, so it may be a
/// temporary; its name must be a string literal. See exp, relu, affine in elementwise.cpp, and
/// examples/custom_op.
struct UnaryOp {
  const char* name;  ///< the op name on the tape and in errors; a string literal
  double (*f)(double x, double a, double b);  ///< the float64 reference y = f(x; a, b)
  double (*df)(double x, double y, double a, double b);  ///< dy/dx at x, given y = f(x)
  Saves saves = Saves::input;  ///< what df reads
  Eltwise onednn = Eltwise::none;  ///< oneDNN eltwise algorithm (f = its formula), or none
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
};
/// Runs the unary op `op` on x with parameters a and b: x (...) -> y (...), same dtype;
/// recorded with backward dx = dout * df(x, y, a, b).
/// @throws graft::Error when x is undefined or not float.
Tensor unary(const UnaryOp& op, const Tensor& x, double a = 0, double b = 0);
/// Declares the row's op and registers its two default gradcheck cases (see UnaryOp).
/// @throws graft::Error when the cases are already registered.
void register_unary_cases(const UnaryOp& op);

/// out = a + b, broadcast.
Tensor add(const Tensor& a, const Tensor& b);
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
/// gelu: x * Phi(x) (erf form), or the tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
/// (recorded as op "gelu_tanh").
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
/// never requires grad), such as a padding mask from token ids.
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
inline Tensor operator+(const Tensor& a, double c) { return affine(a, 1.0, c); }
inline Tensor operator+(double c, const Tensor& a) { return affine(a, 1.0, c); }
inline Tensor operator-(const Tensor& a, double c) { return affine(a, 1.0, -c); }
inline Tensor operator-(double c, const Tensor& a) { return affine(a, -1.0, c); }
inline Tensor operator*(const Tensor& a, double c) { return affine(a, c, 0.0); }
inline Tensor operator*(double c, const Tensor& a) { return affine(a, c, 0.0); }
inline Tensor operator/(const Tensor& a, double c) { return affine(a, 1.0 / c, 0.0); }
///@}

}  // namespace graft
