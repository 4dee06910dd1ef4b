// Multi-head attention with nn.MultiheadAttention's parameter layout: a packed
// in_proj_weight (3d, d) and in_proj_bias (3d) holding [W_Q; W_K; W_V], and out_proj (d, d).
//   head_i = softmax(Q_i K_i^T / sqrt(d/h) + masks) V_i;   out = concat(head_1..h) W_O^T + b_O
// x (B, Tq, d), memory (B, Tk, d), key_padding_mask (B, Tk) non-zero = pad.
#pragma once

#include "graft/nn/layers.h"
#include "graft/nn/positions.h"

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
  // dropout: on the attention probabilities while training (nn.MultiheadAttention's `dropout`),
  // masks drawn from *dropout_gen (default: the global generator).
  MultiHeadAttention(int64_t d, int64_t heads, DType dt, Generator& gen, double dropout = 0.0,
                     Generator* dropout_gen = nullptr);
  // Self-attention when `memory` is the same tensor as `x` (one packed projection); `pos` adds
  // the positional terms of rope/alibi/relative to self-attention (queries and keys at 0..T-1).
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& key_padding_mask = Tensor(),
                 bool causal = false, Tensor* weights = nullptr,
                 const AttentionPositions* pos = nullptr) const;
  // Decoding without recomputation (inference only). New keys are rotated (RoPE) at their
  // absolute positions before they enter the cache; the bias covers the new queries against
  // every cached key.
  Tensor forward_self_step(const Tensor& x, KVCache& cache, int64_t capacity,
                           const AttentionPositions* pos = nullptr) const;
  void fill_cross_cache(const Tensor& memory, KVCache& cache) const;
  Tensor forward_cross_cached(const Tensor& x, const KVCache& cache,
                              const Tensor& key_padding_mask, Tensor* weights = nullptr) const;

  int64_t d, heads;
  double dropout;
  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;

 private:
  // Rows [part, part + parts) * d of the packed projection applied to x (B, T, d), as `parts`
  // (B, H, T, Dh) head views (no copies).
  Tensors project_heads(const Tensor& x, int64_t part, int64_t parts) const;
  // The fused attention over head views, heads merged, then out_proj.
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                bool causal, const Tensor& bias, Tensor* weights) const;
  Generator* dropout_gen_;
};

}  // namespace graft::nn
