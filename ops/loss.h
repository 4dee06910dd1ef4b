// cross_entropy from logits with label smoothing and ignore_index, PyTorch
// CrossEntropyLoss(label_smoothing=eps, ignore_index=) semantics, reduction mean:
//   q = (1 - eps) * onehot(t) + eps / C;  loss_n = -sum_c q_c log_softmax(x_n)_c
//   loss = sum over non-ignored n of loss_n / (number of non-ignored targets)
// logits (N, C) float, target (N) int64 -> scalar. All targets ignored gives 0 (not NaN).
#pragma once

#include "autograd/tensor.h"

namespace graft {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);

}  // namespace graft
