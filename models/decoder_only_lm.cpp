#include "models/decoder_only_lm.h"

#include <cmath>

#include "ops/ops.h"

namespace graft::models {

namespace {
void check_ids(const char* who, const Tensor& ids) {
  if (ids.dtype() != DType::i64 || ids.dim() != 2)
    fail(std::string(who) + ": token ids must be int64 (B, T), got " + describe(ids));
}
}  // namespace

DecoderOnlyLM::DecoderOnlyLM(const LMConfig& c) : cfg(c), dropout_gen(c.seed * 31 + 7) {
  Generator gen(c.seed);
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.pad_id, c.dtype, gen, 0.02));
  pos = register_module("pos", std::make_shared<nn::EmbeddingPositions>(c.positions.kind, c.max_len, c.d_model, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  blocks = register_module("blocks", std::make_shared<nn::Encoder>(
      nn::layer_config(c.d_model, c.heads, c.d_ff, c.dropout, c.norm_first, c.dtype), c.layers, true, gen,
      &dropout_gen, c.positions, /*causal=*/true));
}

Tensor DecoderOnlyLM::forward(const Tensor& ids) const {
  check_ids("DecoderOnlyLM", ids);
  Tensor x = dropout->forward(pos->forward(embedding->forward(ids)));
  return linear(blocks->forward(x, eq(ids, (double)cfg.pad_id), true), embedding->weight);
}

}  // namespace graft::models
