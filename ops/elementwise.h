// Elementwise ops with NumPy/PyTorch broadcasting. Inputs of a binary op must share a float
// dtype; the output has the broadcast shape. Shape legend: a (..), b (..) -> out broadcast(a, b).
#pragma once

#include <vector>

#include "graft/autograd/tensor.h"

namespace graft {

// ---- unary ops: one table row each ----------------------------------------------------------
// An elementwise op y = f(x; a, b) is one row: its name, the float64 reference f and derivative,
// what the derivative reads, the oneDNN algorithm that runs it in float32 (or none: then float32
// runs the reference loop too), and the input range and kinks of its default gradcheck cases.
// unary(row, x, a, b) runs it (forward, and backward dx = dout * df(x, y, a, b)); the row's op is
// declared by its first recorded use or by register_unary_cases(row), which also registers its
// (the tape and the cases keep copies of the row, so it may be a temporary; its name must be a
// string literal)
// two default gradcheck cases: "<name>/contiguous" (3, 4) and "<name>/transposed" (a (3, 4)
// view of (4, 3) storage). See exp, relu, affine in elementwise.cpp, and examples/custom_op.
enum class Saves { input, output, nothing };  // what df reads: x, y = f(x), or neither
enum class Eltwise { none, exp, log, sqrt, pow, tanh, logistic, relu, gelu_erf, gelu_tanh, linear };
struct UnaryOp {
  const char* name;
  double (*f)(double x, double a, double b);
  double (*df)(double x, double y, double a, double b);  // dy/dx at x, given y = f(x)
  Saves saves = Saves::input;
  Eltwise onednn = Eltwise::none;  // oneDNN eltwise algorithm (f = its formula), or none
  double lo = -1, hi = 1;          // input range of the default cases
  std::vector<double> kinks = {};  // where f or df is not smooth: case inputs stay 10% of the range away
  double case_a = 0, case_b = 0;   // a and b of the default cases
  const char* family = "elementwise";
};
Tensor unary(const UnaryOp& op, const Tensor& x, double a = 0, double b = 0);
void register_unary_cases(const UnaryOp& op);

// out = a + b, a - b, a * b, a / b
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// out = x * alpha + beta (scalar affine; covers x + c, x * c, c - x, -x)
Tensor affine(const Tensor& x, double alpha, double beta);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double p);  // x^p; d/dx = p x^(p-1)
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// gelu: x * Phi(x) (erf form), or the tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
Tensor gelu(const Tensor& x, bool tanh_approx = false);
// out = cond ? a : b, cond any dtype (non-zero = true), all three broadcast together
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// out = mask ? value : x, mask any dtype broadcastable to x
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// Non-differentiable helpers (results never require grad).
Tensor eq(const Tensor& a, double v);  // 1 where a == v else 0, same dtype as a

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

}  // namespace graft
