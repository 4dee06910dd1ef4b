#include "nn/attention.h"

#include <cmath>

#include "autograd/tape.h"
#include "ops/ops.h"

namespace graft::nn {

MultiHeadAttention::MultiHeadAttention(int64_t d_, int64_t h, DType dt, Generator& gen)
    : d(d_), heads(h) {
  if (d % h != 0)
    fail("MultiHeadAttention: d_model " + std::to_string(d) + " is not divisible by " +
         std::to_string(h) + " heads");
  // nn.MultiheadAttention: xavier_uniform on the packed projection, zero biases.
  Tensor w = Tensor::empty({3 * d, d}, dt);
  xavier_uniform_(w, gen);
  in_proj_weight = register_parameter("in_proj_weight", w);
  in_proj_bias = register_parameter("in_proj_bias", zeros({3 * d}, dt));
  out_proj = register_module("out_proj", std::make_shared<Linear>(d, d, true, dt, gen));
  fill_(out_proj->bias, 0.0);
}

Tensor MultiHeadAttention::project(const Tensor& x, int64_t part, int64_t parts) const {
  if (part == 0 && parts == 3) return linear(x, in_proj_weight, in_proj_bias);
  return linear(x, slice(in_proj_weight, 0, part * d, (part + parts) * d),
                slice(in_proj_bias, 0, part * d, (part + parts) * d));
}

Tensor MultiHeadAttention::split_heads(const Tensor& x) const {
  const int64_t B = x.shape()[0], T = x.shape()[1];
  return permute(reshape(x, {B, T, heads, d / heads}), {0, 2, 1, 3});
}

Tensor MultiHeadAttention::merge_heads(const Tensor& x) const {
  const int64_t B = x.shape()[0], T = x.shape()[2];
  return reshape(permute(x, {0, 2, 1, 3}), {B, T, d});
}

Tensor MultiHeadAttention::forward(const Tensor& x, const Tensor& memory,
                                   const Tensor& key_padding_mask, bool causal,
                                   Tensor* weights) const {
  if (x.dim() != 3 || x.shape()[2] != d || memory.dim() != 3 || memory.shape()[2] != d ||
      memory.shape()[0] != x.shape()[0])
    fail("MultiHeadAttention: x " + describe(x) + " and memory " + describe(memory) +
         " must be (B, T, " + std::to_string(d) + ") with the same B");
  Tensor q, k, v;
  const int64_t B = x.shape()[0], Tq = x.shape()[1], Tk = memory.shape()[1], Dh = d / heads;
  if (x.same_storage(memory) && x.shape() == memory.shape() && x.offset() == memory.offset()) {
    // (B, T, 3d) -> (B, T, 3, H, Dh) -> three (B, H, T, Dh) views, no copies.
    Tensor qkv = reshape(project(x, 0, 3), {B, Tq, 3, heads, Dh});
    Tensor p = permute(qkv, {2, 0, 3, 1, 4});
    Tensors parts = split(p, {1, 1, 1}, 0);
    q = squeeze(parts[0], 0);
    k = squeeze(parts[1], 0);
    v = squeeze(parts[2], 0);
  } else {
    q = split_heads(project(x, 0, 1));
    Tensor kv = permute(reshape(project(memory, 1, 2), {B, Tk, 2, heads, Dh}), {2, 0, 3, 1, 4});
    Tensors parts = split(kv, {1, 1}, 0);
    k = squeeze(parts[0], 0);
    v = squeeze(parts[1], 0);
  }
  AttentionOptions opt;
  opt.causal = causal;
  opt.key_padding_mask = key_padding_mask;
  opt.return_weights = weights != nullptr;
  AttentionResult r = scaled_dot_product_attention(q, k, v, opt);
  if (weights) *weights = r.weights;
  return out_proj->forward(merge_heads(r.out));
}

void KVCache::select_rows(const Tensor& rows) {
  autograd::NoGrad ng;
  if (k.defined()) k = index_select(k, 0, rows);
  if (v.defined()) v = index_select(v, 0, rows);
}

Tensor MultiHeadAttention::forward_self_step(const Tensor& x, KVCache& cache,
                                             int64_t capacity) const {
  autograd::NoGrad ng;
  const int64_t B = x.shape()[0], T = x.shape()[1], Dh = d / heads;
  if (!cache.k.defined()) {
    cache.k = zeros({B, heads, capacity, Dh}, x.dtype());
    cache.v = zeros({B, heads, capacity, Dh}, x.dtype());
    cache.len = 0;
  }
  if (cache.len + T > cache.k.shape()[2])
    fail("MultiHeadAttention: KV cache of capacity " + std::to_string(cache.k.shape()[2]) +
         " is full (" + std::to_string(cache.len) + " + " + std::to_string(T) + ")");
  Tensor qkv = permute(reshape(project(x, 0, 3), {B, T, 3, heads, Dh}), {2, 0, 3, 1, 4});
  Tensors parts = split(qkv, {1, 1, 1}, 0);
  copy_into(slice(cache.k, 2, cache.len, cache.len + T), squeeze(parts[1], 0));
  copy_into(slice(cache.v, 2, cache.len, cache.len + T), squeeze(parts[2], 0));
  cache.len += T;
  AttentionOptions opt;
  opt.causal = true;  // aligned to the end: step t sees cached keys 0..t
  AttentionResult r = scaled_dot_product_attention(squeeze(parts[0], 0),
                                                   slice(cache.k, 2, 0, cache.len),
                                                   slice(cache.v, 2, 0, cache.len), opt);
  return out_proj->forward(merge_heads(r.out));
}

void MultiHeadAttention::fill_cross_cache(const Tensor& memory, KVCache& cache) const {
  autograd::NoGrad ng;
  const int64_t B = memory.shape()[0], Tk = memory.shape()[1], Dh = d / heads;
  Tensor kv = permute(reshape(project(memory, 1, 2), {B, Tk, 2, heads, Dh}), {2, 0, 3, 1, 4});
  Tensors parts = split(kv, {1, 1}, 0);
  cache.k = contiguous(squeeze(parts[0], 0));
  cache.v = contiguous(squeeze(parts[1], 0));
  cache.len = Tk;
}

Tensor MultiHeadAttention::forward_cross_cached(const Tensor& x, const KVCache& cache,
                                                const Tensor& key_padding_mask,
                                                Tensor* weights) const {
  autograd::NoGrad ng;
  AttentionOptions opt;
  opt.key_padding_mask = key_padding_mask;
  opt.return_weights = weights != nullptr;
  AttentionResult r = scaled_dot_product_attention(split_heads(project(x, 0, 1)), cache.k, cache.v, opt);
  if (weights) *weights = r.weights;
  return out_proj->forward(merge_heads(r.out));
}

}  // namespace graft::nn
