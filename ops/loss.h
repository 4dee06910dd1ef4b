// cross_entropy from logits with label smoothing and ignore_index, PyTorch
// CrossEntropyLoss(label_smoothing=eps, ignore_index=) semantics, reduction mean:
//   q = (1 - eps) * onehot(t) + eps / C;  loss_n = -sum_c q_c log_softmax(x_n)_c
//   loss = sum over non-ignored n of loss_n / (number of non-ignored targets)
// logits (N, C) float, target (N) int64 -> scalar. All targets ignored gives 0 (not NaN).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);

// linear_cross_entropy(x, w, target) = cross_entropy(linear(x, w), target) without the (N, V)
// logits: rows are taken chunk_rows at a time (default: about 2M logits per chunk); each chunk's
// logits are made, turned into the loss and, when a gradient is wanted, into d loss / d logits
// in the same buffer, which goes straight into dx (N, d) and dw (V, d) through two matmuls. The
// tape keeps dx and dw, scaled by the upstream gradient in backward. For a tied output
// projection (x the decoder's (N, d) output, w the embedding (V, d)): the same matmul FLOPs as
// linear + cross_entropy, and (N, V) never in memory. x (N, d), w (V, d) float, target (N) int64.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target,
                            double label_smoothing = 0.0, int64_t ignore_index = -100,
                            int64_t chunk_rows = 0);

}  // namespace graft
