// Fused scaled dot-product attention over (batch, heads, T, d):
//   S = Q K^T * scale + bias + causal mask + key padding mask;  P = softmax(S);  out = P V
// q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv) -> out (B, H, Tq, Dv).
// key_padding_mask: (B, Tk), any dtype, non-zero = this key is padding (not attended).
// bias: additive, broadcastable to (B, H, Tq, Tk) (ALiBi, relative positions); differentiable.
// causal: query i attends keys j <= i + (Tk - Tq) (aligned to the end, for cached decoding).
// A fully masked row yields zeros (and zero gradients), never NaN.
// dropout (optional): out = (P * mask / (1 - p)) V, see AttentionOptions.
#pragma once

#include "graft/autograd/tensor.h"

namespace graft {

struct AttentionOptions {
  bool causal = false;
  Tensor key_padding_mask;  // optional
  Tensor bias;              // optional
  double scale = 0;         // 0: 1/sqrt(D)
  bool return_weights = false;  // the weights before dropout
  // Dropout on the attention probabilities (nn.MultiheadAttention's `dropout`): P is multiplied
  // by a mask drawn from *generator (kept with probability 1 - dropout) and by 1/(1 - dropout);
  // the mask is recomputed from the generator state in backward, never stored.
  double dropout = 0;
  Generator* generator = nullptr;
};

struct AttentionResult {
  Tensor out;
  Tensor weights;  // P (B, H, Tq, Tk) when requested; carries no gradient
};

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opt = {});

}  // namespace graft
