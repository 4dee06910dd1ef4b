/// @file
/// Fused scaled dot-product attention over (batch, heads, T, d). In formulas:
/// @code
///   S = Q K^T * scale + bias + causal mask + key padding mask;  P = softmax(S);  out = P V
/// @endcode
/// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> out (B, H, Tq, Dv).
/// - key_padding_mask: (B, Tk), any dtype, non-zero = this key is padding (not attended).
/// - bias: additive, broadcastable to (B, H, Tq, Tk) (ALiBi, relative positions); differentiable.
/// - causal: query i attends keys j <= i + (Tk - Tq) (aligned to the end, for cached decoding).
///
/// A fully masked row yields zeros (and zero gradients), never NaN.
/// dropout (optional): out = (P * mask / (1 - p)) V, see AttentionOptions.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

/// The optional parts of scaled_dot_product_attention(); the defaults give plain softmax
/// attention with scale 1/sqrt(D).
struct AttentionOptions {
  bool causal = false;      ///< query i attends keys j <= i + (Tk - Tq) only
  Tensor key_padding_mask;  ///< optional: (B, Tk), any dtype, non-zero = padding
  /// Optional: additive, q's dtype, broadcastable to (B, H, Tq, Tk); gets a gradient.
  Tensor bias;
  double scale = 0;  ///< 0: 1/sqrt(D)
  /// Also return P (AttentionResult::weights), the weights before dropout.
  bool return_weights = false;
  /// Dropout on the attention probabilities (nn.MultiheadAttention's `dropout`), in [0, 1]: P is
  /// multiplied by a mask drawn from *generator (kept with probability 1 - dropout) and by
  /// 1/(1 - dropout); the mask is recomputed from the generator state in backward, never stored.
  /// Applied whenever it is > 0: the caller decides (training only).
  double dropout = 0;
  Generator* generator = nullptr;  ///< where the dropout mask comes from; required when dropout > 0
  /// k and v stay the same from call to call (cached decoding's cross-attention keys and values):
  /// without a tape, under bf16, where the batched matmuls run (more than 4 query rows per head,
  /// weights asked for, or a head dim that is not contiguous), their bf16 copies are then kept
  /// until they change, instead of being converted at every call. (At most 4 query rows per head
  /// take the float32 row loop, which reads k and v as they are.)
  bool steady_kv = false;
};

/// What scaled_dot_product_attention() returns.
struct AttentionResult {
  Tensor out;      ///< (B, H, Tq, Dv), recorded on the tape
  Tensor weights;  ///< P (B, H, Tq, Tk) when requested; carries no gradient
};

/// Fused attention (see the file's description): softmax(Q K^T * scale + bias + masks) V, with
/// an optional dropout on the probabilities. q (B, H, Tq, D), k (B, H, Tk, D),
/// v (B, H, Tk, Dv) -> out (B, H, Tq, Dv). Differentiable in q, k, v and opt.bias; float32
/// matmuls follow the precision setting (ops/precision.h).
/// @throws graft::Error "scaled_dot_product_attention: ..." when q, k or v is undefined, not
///         float, not rank 4, or of different dtypes; when B, H, D or the key counts disagree;
///         when the mask is not (B, Tk); when the bias has another dtype or does not broadcast
///         to (B, H, Tq, Tk); when scale is not finite; when dropout is outside [0, 1] or has no
///         generator.
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opt = {});

}  // namespace graft
