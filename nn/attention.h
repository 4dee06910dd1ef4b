// Multi-head attention with nn.MultiheadAttention's parameter layout: a packed
// in_proj_weight (3d, d) and in_proj_bias (3d) holding [W_Q; W_K; W_V], and out_proj (d, d).
//   head_i = softmax(Q_i K_i^T / sqrt(d/h) + masks) V_i;   out = concat(head_1..h) W_O^T + b_O
// x (B, Tq, d), memory (B, Tk, d), key_padding_mask (B, Tk) non-zero = pad.
#pragma once

#include "nn/layers.h"

namespace graft::nn {

// Keys and values kept across decoding steps: (B, H, capacity, Dh) buffers of which the first
// `len` positions are filled. Self-attention appends one step at a time; cross-attention fills
// it once from the encoder output.
struct KVCache {
  Tensor k, v;
  int64_t len = 0;
  // Keeps only the batch rows in `rows` (int64), in that order (beam search reordering).
  void select_rows(const Tensor& rows);
};

class MultiHeadAttention : public Module {
 public:
  // No dropout on the attention weights: the fused attention op keeps P un-dropped (residual
  // and FFN dropout still apply in the layers).
  MultiHeadAttention(int64_t d, int64_t heads, DType dt, Generator& gen);
  // Self-attention when `memory` is the same tensor as `x` (one packed projection).
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& key_padding_mask = Tensor(),
                 bool causal = false, Tensor* weights = nullptr) const;
  // Decoding without recomputation (inference only).
  Tensor forward_self_step(const Tensor& x, KVCache& cache, int64_t capacity) const;
  void fill_cross_cache(const Tensor& memory, KVCache& cache) const;
  Tensor forward_cross_cached(const Tensor& x, const KVCache& cache,
                              const Tensor& key_padding_mask, Tensor* weights = nullptr) const;

  int64_t d, heads;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;

 private:
  // (B, T, d) -> (B, H, T, Dh) view
  Tensor split_heads(const Tensor& x) const;
  Tensor merge_heads(const Tensor& x) const;  // (B, H, T, Dh) -> (B, T, d)
  Tensor project(const Tensor& x, int64_t part_begin, int64_t parts) const;
};

}  // namespace graft::nn
