/// @file
/// Multi-head attention with nn.MultiheadAttention's parameter layout: a packed
/// in_proj_weight (3d, d) and in_proj_bias (3d) holding [W_Q; W_K; W_V], and out_proj (d, d).
/// @code
///   head_i = softmax(Q_i K_i^T / sqrt(d/h) + masks) V_i;   out = concat(head_1..h) W_O^T + b_O
/// @endcode
/// x (B, Tq, d), memory (B, Tk, d), key_padding_mask (B, Tk) non-zero = pad.
#pragma once

#include "graft/autograd/graph.h"
#include "graft/nn/layers.h"
#include "graft/nn/positions.h"

#include <utility>

namespace graft::nn {

/// Keys and values kept across decoding steps: (B, H, capacity, Dh) buffers of which the first
/// `len` positions are filled. Self-attention appends one step at a time (append(), which a
/// user's own attention block can call too); cross-attention fills it once from the encoder
/// output. A default KVCache is empty; the first append() allocates it.
/// @code
///   auto [k, v] = cache.append(k_new, v_new, 64);   // (B, H, T, Dh) each -> (B, H, len, Dh)
///   Tensor out = scaled_dot_product_attention(q, k, v, {.causal = true}).out;
/// @endcode
struct KVCache {
  /// The key and value buffers, (B, H, capacity, Dh) (self-attention) or (B, H, Tk, Dh)
  /// (cross-attention); undefined until the first step.
  ///@{
  Tensor k, v;
  ///@}
  int64_t len = 0;  ///< positions filled
  /// Appends the keys and values of T new positions, k_new and v_new (B, H, T, Dh), after the
  /// `len` cached ones and returns the filled parts of the buffers, views (B, H, len, Dh) with
  /// len advanced by T (valid until the next append()). The first call allocates buffers of
  /// `capacity` positions (later calls ignore it). Never records on the tape: the cache is for
  /// inference. With causal attention (aligned to the end, as scaled_dot_product_attention()
  /// aligns it) the T new queries then see every cached key up to their own position.
  /// @throws graft::Error naming the shapes when k_new and v_new are not the same (B, H, T, Dh)
  ///         of one dtype, when their B, H, Dh or dtype differ from the cache's, when
  ///         capacity is not positive on the first call, or when len + T exceeds the capacity.
  std::pair<Tensor, Tensor> append(const Tensor& k_new, const Tensor& v_new, int64_t capacity);
  /// Keeps only the batch rows in `rows` (int64), in that order (beam search reordering): in
  /// place when the batch size stays (copies of this cache share its buffers and see it too).
  /// @throws graft::Error when an index is outside [0, B) (see index_select()).
  void select_rows(const Tensor& rows);
};

/// Collects the attention weights of every MultiHeadAttention that runs on this thread while it
/// lives, self- and cross-attention, each under its module path as named_parameters() names it
/// ("encoder.layers.0.self_attn", "decoder.layers.1.multihead_attn"), in the order they ran (a
/// cached decoding step adds one entry per attention per step). Asking for the weights changes
/// nothing in the outputs: the same kernels run with or without them. Nests (an inner recorder
/// collects alone until it ends); per thread. The weights carry no gradient.
/// @code
///   nn::AttentionRecorder rec;
///   Tensor logits = model.forward(src, tgt_in);
///   Tensor w = rec.get("encoder.layers.0.self_attn");   // (B, H, Tq, Tk)
/// @endcode
class AttentionRecorder {
 public:
  /// Starts collecting on this thread (module paths are kept while it lives).
  AttentionRecorder();
  /// Stops collecting; the recorder in force before takes over again.
  ~AttentionRecorder();
  AttentionRecorder(const AttentionRecorder&) = delete;
  AttentionRecorder& operator=(const AttentionRecorder&) = delete;
  /// Every (path, weights (B, H, Tq, Tk)) collected so far, in the order the attentions ran.
  const NamedTensors& weights() const { return weights_; }
  /// The weights most recently collected under `path`.
  /// @throws graft::Error "AttentionRecorder: no attention weights under '<path>'" naming the
  ///         paths collected, when none ran under that path.
  Tensor get(const std::string& path) const;

 private:
  friend class MultiHeadAttention;
  // Adds the weights of the attention now running on this thread to its recorder, if any, under
  // the module path in force.
  static void note(const Tensor& weights);
  autograd::KeepModulePaths keep_;  // the module paths name the weights
  NamedTensors weights_;
  AttentionRecorder* prev_;
};

/// Multi-head attention (see the file's description): xavier-uniform in-projection, zero
/// biases, as nn.MultiheadAttention initialises them.
class MultiHeadAttention : public Module {
 public:
  /// Attention of width d_model with `heads` heads (head size d_model / heads), parameters
  /// drawn from gen.
  /// dropout: on the attention probabilities while training (nn.MultiheadAttention's `dropout`),
  /// masks drawn from *dropout_gen (default: the global generator).
  /// @throws graft::Error when heads does not divide d_model (or is not positive), or dropout is
  ///         outside [0, 1].
  /// kv_heads (0: heads): grouped-query attention, kv_heads dividing heads; K and V are projected
  /// to kv_heads heads and each serves heads / kv_heads consecutive query heads (in_proj_weight is
  /// then (d + 2 kv_heads Dh, d)). bias false: no in_proj_bias and an out_proj without bias.
  /// @throws graft::Error also when kv_heads is negative or does not divide heads.
  MultiHeadAttention(int64_t d_model, int64_t heads, DType dt, Generator& gen, double dropout = 0.0,
                     Generator* dropout_gen = nullptr, int64_t kv_heads = 0, bool bias = true);
  /// x (B, Tq, d) attending to memory (B, Tk, d) -> (B, Tq, d). Self-attention when `memory` is
  /// the same tensor as `x` (one packed projection); `pos` adds the positional terms of
  /// rope/alibi/relative to self-attention (queries and keys at 0..T-1). `weights`, when given,
  /// receives the attention weights (B, H, Tq, Tk) of each head, without gradient.
  /// @throws graft::Error when x or memory is not (B, T, d) with the same B, or the mask is not
  ///         (B, Tk) (see scaled_dot_product_attention()).
  Tensor forward(const Tensor& x, const Tensor& memory, const Tensor& key_padding_mask = Tensor(),
                 bool causal = false, Tensor* weights = nullptr,
                 const AttentionPositions* pos = nullptr) const;
  /// Decoding without recomputation (inference only, runs under NoGrad): the self-attention of
  /// the new positions x (B, T, d) -> (B, T, d) against every cached key, causal, after
  /// appending their keys and values to `cache` (allocated with `capacity` positions on the
  /// first call). New keys are rotated (RoPE) at their absolute positions before they enter the
  /// cache; the bias covers the new queries against every cached key.
  /// @throws graft::Error when the cache would overflow its capacity.
  Tensor forward_self_step(const Tensor& x, KVCache& cache, int64_t capacity,
                           const AttentionPositions* pos = nullptr) const;
  /// Fills `cache` with the keys and values of memory (B, Tk, d), once per source (inference
  /// only, no tape).
  void fill_cross_cache(const Tensor& memory, KVCache& cache) const;
  /// Cross-attention of x (B, T, d) against a cache filled by fill_cross_cache() -> (B, T, d)
  /// (inference only, no tape); key_padding_mask (B, Tk) or undefined; `weights` as in forward().
  /// With group G > 1, x holds G consecutive rows per cache row, one position each (beam
  /// search's beams of one source): x (B G, 1, d), rows b G .. b G + G - 1 attend to cache row
  /// b, whose keys and values are then read once for all G.
  /// @throws graft::Error when x's rows are not group x the cache's, or T > 1 with group > 1.
  Tensor forward_cross_cached(const Tensor& x, const KVCache& cache, const Tensor& key_padding_mask,
                              Tensor* weights = nullptr, int64_t group = 1) const;

  /// The model width, the number of (query) heads and of key/value heads (kv_heads == heads
  /// without grouping).
  ///@{
  int64_t d_model, heads, kv_heads;
  ///@}
  double dropout;  ///< on the attention probabilities while training
  /// The parameters "in_proj_weight" (3d, d) and "in_proj_bias" (3d): [W_Q; W_K; W_V] (with
  /// grouping, W_K and W_V have kv_heads Dh rows each; without bias, in_proj_bias is undefined).
  ///@{
  Tensor in_proj_weight, in_proj_bias;
  ///@}
  std::shared_ptr<Linear> out_proj;  ///< "out_proj", (d, d) with bias

 private:
  // Parts [part, part + parts) (0 Q, 1 K, 2 V) of the packed projection applied to x (B, T, d),
  // as `parts` (B, heads or kv_heads, T, Dh) tensors (split_heads()).
  Tensors project_heads(const Tensor& x, int64_t part, int64_t parts) const;
  // k or v (B, kv_heads, T, Dh) -> (B, heads, T, Dh): each KV head repeated for its query heads
  // (the tensor itself without grouping).
  Tensor repeat_kv(const Tensor& t) const;
  // The fused attention over the heads, heads merged (merge_heads()), then out_proj; steady_kv:
  // k and v are a cross-attention cache's (AttentionOptions::steady_kv).
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                bool causal, const Tensor& bias, Tensor* weights, bool steady_kv = false) const;
  Generator* dropout_gen_;
};

}  // namespace graft::nn
