/// @file
/// cross_entropy from logits with label smoothing and ignore_index. PyTorch
/// CrossEntropyLoss(label_smoothing=eps, ignore_index=) semantics, reduction mean:
/// @code
///   q = (1 - eps) * onehot(t) + eps / C;  loss_n = -sum_c q_c log_softmax(x_n)_c
///   loss = sum over non-ignored n of loss_n / (number of non-ignored targets)
/// @endcode
/// logits (N, C) float, target (N) int64 -> scalar. All targets ignored gives 0 (not NaN).
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// The mean cross-entropy loss of logits against class indices (see the file's description):
/// logits (N, C) float, target (N) int64 -> scalar of the logits' dtype. Targets equal to
/// ignore_index add nothing; all targets ignored gives 0. Differentiable in the logits.
/// @throws graft::Error "cross_entropy: ..." when the logits are not a float (N, C) with C > 0,
///         the target is undefined, not int64 or not (N), a target is outside [0, C) (and not
///         ignore_index), or label_smoothing is outside [0, 1].
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);

/// linear_cross_entropy(x, w, target) = cross_entropy(linear(x, w), target) without the (N, V)
/// logits: rows are taken chunk_rows at a time (default: about 2M logits per chunk); each chunk's
/// logits are made, turned into the loss and, when a gradient is wanted, into d loss / d logits
/// in the same buffer, which goes straight into dx (N, d) and dw (V, d) through two matmuls. The
/// tape keeps dx and dw, scaled by the upstream gradient in backward. For a tied output
/// projection (x the decoder's (N, d) output, w the embedding (V, d)): the same matmul FLOPs as
/// linear + cross_entropy, and (N, V) never in memory. x (N, d), w (V, d) float, target (N) int64
/// -> scalar. No bias; differentiable in x and w.
/// @throws graft::Error "linear_cross_entropy: ..." when x and w are not float (N, d) and
///         (V, d) of one dtype with V > 0, the target is undefined or not int64 (N), a target is
///         outside [0, V) (and not ignore_index), label_smoothing is outside [0, 1], or
///         chunk_rows < 0.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target,
                            double label_smoothing = 0.0, int64_t ignore_index = -100,
                            int64_t chunk_rows = 0);

}  // namespace graft
