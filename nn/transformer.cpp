#include "graft/nn/transformer.h"

#include "graft/ops/ops.h"

namespace graft::nn {

LayerConfig layer_config(int64_t d_model, int64_t heads, int64_t d_ff, double dropout,
                         bool norm_first, DType dtype, Activation activation) {
  LayerConfig l;
  l.d_model = d_model;
  l.heads = heads;
  l.d_ff = d_ff;
  l.dropout = dropout;
  l.norm_first = norm_first;
  l.dtype = dtype;
  l.activation = activation;
  return l;
}

namespace {
std::shared_ptr<MultiHeadAttention> make_attention(const LayerConfig& c, Generator& gen,
                                                   Generator* dg) {
  return std::make_shared<MultiHeadAttention>(c.d_model, c.heads, c.dtype, gen, c.attention_dropout,
                                              dg);
}

// The encoder layers' and stacks' norm: LayerNorm, or RMSNorm with c.rms_norm.
std::shared_ptr<LayerNorm> make_norm(const LayerConfig& c) {
  if (c.rms_norm) return std::make_shared<RMSNorm>(c.d_model, c.eps, c.dtype);
  return std::make_shared<LayerNorm>(c.d_model, c.eps, c.dtype);
}
}  // namespace

EncoderLayer::EncoderLayer(const LayerConfig& c, Generator& gen, Generator* dg) : cfg(c) {
  self_attn = register_module("self_attn", std::make_shared<MultiHeadAttention>(
                                               c.d_model, c.heads, c.dtype, gen,
                                               c.attention_dropout, dg, c.kv_heads, c.bias));
  linear1 =
      register_module("linear1", std::make_shared<Linear>(c.d_model, c.d_ff, c.bias, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, dg));
  linear2 =
      register_module("linear2", std::make_shared<Linear>(c.d_ff, c.d_model, c.bias, c.dtype, gen));
  if (c.activation == Activation::swiglu)
    linear3 = register_module("linear3",
                              std::make_shared<Linear>(c.d_model, c.d_ff, c.bias, c.dtype, gen));
  norm1 = register_module("norm1", make_norm(c));
  norm2 = register_module("norm2", make_norm(c));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(c.dropout, dg));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(c.dropout, dg));
}

Tensor EncoderLayer::ffn(const Tensor& x) const {
  return feed_forward(*linear1, *dropout, *linear2, cfg.activation, x, linear3.get());
}

// The two sublayers with residuals; sa(h) is the self-attention, so the full pass and cached
// decoding share the same wiring.
template <class SelfAttn>
Tensor EncoderLayer::block(const Tensor& x, SelfAttn&& sa) const {
  if (cfg.norm_first) {
    Tensor y = add(x, dropout1->forward(sa(norm1->forward(x))));
    return add(y, dropout2->forward(ffn(norm2->forward(y))));
  }
  Tensor y = norm1->forward_add(x, dropout1->forward(sa(x)));
  return norm2->forward_add(y, dropout2->forward(ffn(y)));
}

Tensor EncoderLayer::forward(const Tensor& x, const Tensor& src_pad, bool causal,
                             const AttentionPositions* pos) const {
  const auto named = scope();
  return hooked(block(
      x, [&](const Tensor& h) { return self_attn->forward(h, h, src_pad, causal, nullptr, pos); }));
}

Tensor EncoderLayer::forward_step(const Tensor& x, KVCache& cache, int64_t capacity,
                                  const AttentionPositions* pos) const {
  const auto named = scope();
  return hooked(block(
      x, [&](const Tensor& h) { return self_attn->forward_self_step(h, cache, capacity, pos); }));
}

DecoderLayer::DecoderLayer(const LayerConfig& c, Generator& gen, Generator* dg) : cfg(c) {
  self_attn = register_module("self_attn", make_attention(c, gen, dg));
  multihead_attn = register_module("multihead_attn", make_attention(c, gen, dg));
  linear1 =
      register_module("linear1", std::make_shared<Linear>(c.d_model, c.d_ff, true, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout, dg));
  linear2 =
      register_module("linear2", std::make_shared<Linear>(c.d_ff, c.d_model, true, c.dtype, gen));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(c.d_model, c.eps, c.dtype));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(c.d_model, c.eps, c.dtype));
  norm3 = register_module("norm3", std::make_shared<LayerNorm>(c.d_model, c.eps, c.dtype));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(c.dropout, dg));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(c.dropout, dg));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(c.dropout, dg));
}

Tensor DecoderLayer::ffn(const Tensor& x) const {
  return feed_forward(*linear1, *dropout, *linear2, cfg.activation, x);
}

// The three sublayers with residuals; sa(h) and ca(h) are the two attentions, so training
// (full causal attention) and decoding (cached) share the same wiring.
template <class SelfAttn, class CrossAttn>
Tensor DecoderLayer::block(const Tensor& y, SelfAttn&& sa, CrossAttn&& ca) const {
  if (cfg.norm_first) {
    Tensor x = add(y, dropout1->forward(sa(norm1->forward(y))));
    x = add(x, dropout2->forward(ca(norm2->forward(x))));
    return add(x, dropout3->forward(ffn(norm3->forward(x))));
  }
  Tensor x = norm1->forward_add(y, dropout1->forward(sa(y)));
  x = norm2->forward_add(x, dropout2->forward(ca(x)));
  return norm3->forward_add(x, dropout3->forward(ffn(x)));
}

Tensor DecoderLayer::forward(const Tensor& y, const Tensor& memory, const Tensor& tgt_pad,
                             const Tensor& src_pad, Tensor* cross_weights,
                             const AttentionPositions* pos) const {
  const auto named = scope();
  return hooked(block(
      y, [&](const Tensor& h) { return self_attn->forward(h, h, tgt_pad, true, nullptr, pos); },
      [&](const Tensor& h) {
        return multihead_attn->forward(h, memory, src_pad, false, cross_weights);
      }));
}

Tensor DecoderLayer::forward_step(const Tensor& y, const Tensor& memory, const Tensor& src_pad,
                                  DecoderLayerCache& cache, int64_t capacity, Tensor* cross_weights,
                                  const AttentionPositions* pos, int64_t group) const {
  const auto named = scope();
  if (!cache.cross.k.defined()) multihead_attn->fill_cross_cache(memory, cache.cross);
  return hooked(block(
      y,
      [&](const Tensor& h) { return self_attn->forward_self_step(h, cache.self, capacity, pos); },
      [&](const Tensor& h) {
        return multihead_attn->forward_cross_cached(h, cache.cross, src_pad, cross_weights, group);
      }));
}

// The stack's positional module, registered under T5's name when it has parameters.
static std::shared_ptr<AttentionPositions> stack_positions(Module& stack, const LayerConfig& c,
                                                           const PositionOptions& pos, bool causal,
                                                           Generator& gen) {
  auto p = make_attention_positions(pos, c.heads, causal, c.dtype, gen);
  if (pos.kind == Positions::relative) stack.add_module("relative_attention_bias", p);
  return p;
}

namespace {

constexpr const char* kCount = "parameter count";

// Packed in-projection (Q of d rows, K and V of kv Dh rows each) + out-projection (d, d),
// with their biases when `bias`.
int64_t attention_parameters(int64_t d, int64_t heads, int64_t kv_heads, bool bias) {
  const int64_t rows = d + 2 * (kv_heads ? kv_heads : heads) * (d / heads);
  const int64_t w = checked_mul(checked_add(rows, d, kCount), d, kCount);
  return bias ? checked_add(w, rows + d, kCount) : w;
}

// The layers of an encoder (attentions = 1, norms = 2; with c's Llama-style options) or a
// decoder (2, 3; always LayerNorm, biases, no grouping).
int64_t stack_parameters(const LayerConfig& c, int64_t layers, bool final_norm,
                         const PositionOptions& pos, int64_t attentions, int64_t norms) {
  const int64_t d = c.d_model;
  const bool llama = attentions == 1, bias = !llama || c.bias, rms = llama && c.rms_norm;
  const int64_t mats = llama && c.activation == Activation::swiglu ? 3 : 2;
  int64_t ffn = checked_mul(mats, checked_mul(d, c.d_ff, kCount), kCount);
  if (bias) ffn = checked_add(ffn, (mats - 1) * c.d_ff + d, kCount);
  const int64_t attention = attention_parameters(d, c.heads, llama ? c.kv_heads : 0, bias);
  const int64_t norm = rms ? d : 2 * d;
  int64_t layer = checked_add(checked_mul(attentions, attention, kCount), ffn, kCount);
  layer = checked_add(layer, checked_mul(norms, norm, kCount), kCount);
  int64_t n = checked_mul(layers, layer, kCount);
  if (final_norm) n = checked_add(n, norm, kCount);
  if (pos.kind == Positions::relative)
    n = checked_add(n, checked_mul(pos.relative_buckets, c.heads, kCount), kCount);
  return n;
}

}  // namespace

int64_t encoder_parameters(const LayerConfig& c, int64_t layers, bool final_norm,
                           const PositionOptions& pos) {
  return stack_parameters(c, layers, final_norm, pos, 1, 2);
}

int64_t decoder_parameters(const LayerConfig& c, int64_t layers, bool final_norm,
                           const PositionOptions& pos) {
  return stack_parameters(c, layers, final_norm, pos, 2, 3);
}

Encoder::Encoder(const LayerConfig& c, int64_t n, bool final_norm, Generator& gen, Generator* dg,
                 const PositionOptions& pos, bool causal)
    : causal_(causal) {
  for (int64_t i = 0; i < n; ++i) layers.push_back(std::make_shared<EncoderLayer>(c, gen, dg));
  for (int64_t i = 0; i < n; ++i) register_module("layers." + std::to_string(i), layers[i]);
  if (final_norm) norm = register_module("norm", make_norm(c));
  positions = stack_positions(*this, c, pos, causal, gen);
}

Tensor Encoder::forward(const Tensor& x, const Tensor& src_pad) const {
  const auto named = scope();
  Tensor h = x;
  for (auto& l : layers) h = l->forward(h, src_pad, causal_, positions.get());
  return hooked(norm ? norm->forward(h) : h);
}

Tensor Encoder::forward_step(const Tensor& x, std::vector<KVCache>& caches,
                             int64_t capacity) const {
  const auto named = scope();
  if (positions && !causal_)
    fail("Encoder: cached steps need a causal stack; this one is bidirectional");
  if (caches.size() != layers.size()) caches.resize(layers.size());
  Tensor h = x;
  for (size_t i = 0; i < layers.size(); ++i)
    h = layers[i]->forward_step(h, caches[i], capacity, positions.get());
  return hooked(norm ? norm->forward(h) : h);
}

Decoder::Decoder(const LayerConfig& c, int64_t n, bool final_norm, Generator& gen, Generator* dg,
                 const PositionOptions& pos) {
  for (int64_t i = 0; i < n; ++i) layers.push_back(std::make_shared<DecoderLayer>(c, gen, dg));
  for (int64_t i = 0; i < n; ++i) register_module("layers." + std::to_string(i), layers[i]);
  if (final_norm)
    norm = register_module("norm", std::make_shared<LayerNorm>(c.d_model, c.eps, c.dtype));
  positions = stack_positions(*this, c, pos, true, gen);
}

Tensor Decoder::forward(const Tensor& y, const Tensor& memory, const Tensor& tgt_pad,
                        const Tensor& src_pad, Tensors* cross_weights) const {
  const auto named = scope();
  Tensor h = y;
  for (auto& l : layers) {
    Tensor w;
    h = l->forward(h, memory, tgt_pad, src_pad, cross_weights ? &w : nullptr, positions.get());
    if (cross_weights) cross_weights->push_back(w);
  }
  return hooked(norm ? norm->forward(h) : h);
}

Tensor Decoder::forward_step(const Tensor& y, const Tensor& memory, const Tensor& src_pad,
                             std::vector<DecoderLayerCache>& caches, int64_t capacity,
                             Tensors* cross_weights, int64_t group) const {
  const auto named = scope();
  if (caches.size() != layers.size()) caches.resize(layers.size());
  Tensor h = y;
  for (size_t i = 0; i < layers.size(); ++i) {
    Tensor w;
    h = layers[i]->forward_step(h, memory, src_pad, caches[i], capacity,
                                cross_weights ? &w : nullptr, positions.get(), group);
    if (cross_weights) cross_weights->push_back(w);
  }
  return hooked(norm ? norm->forward(h) : h);
}

}  // namespace graft::nn
