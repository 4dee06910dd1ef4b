/// @file
/// Internal: the library's UnaryOp rows, for graft_testing's records
/// (testing/cases/elementwise.cpp).
#pragma once

#include <vector>

#include "graft/ops/elementwise.h"

namespace graft {

/// The rows of exp, log, sqrt, pow, tanh, sigmoid, relu, gelu (both), affine, silu, abs, clamp,
/// sin, cos and erf, in that order.
std::vector<const UnaryOp*> unary_rows();

}  // namespace graft
