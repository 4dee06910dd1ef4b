/// @file
/// Internal: ops that only a backward records (under create_graph) and no public header
/// declares, for graft_testing's records (testing/cases/).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// dw (OUT, IN) = dy^T x over all rows of dy (..., OUT) and x (..., IN): linear's weight gradient
/// as an op of its own (ops/matmul.cpp), recorded as "linear_weight_grad".
Tensor linear_weight_grad(const Tensor& dy, const Tensor& x);

}  // namespace graft
