// Decoder-only language model (GPT-style, pre-LN by default): a causal self-attention block
// stack (nn::CausalStack), a final LayerNorm and logits through the tied embedding.
// ids (B, T) int64 -> logits (B, T, V); train with cross_entropy on ids shifted by one.
#pragma once

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/models/decoding.h"
#include "graft/nn/transformer.h"

namespace graft::models {

struct LMConfig : StackConfig {
  LMConfig() {
    positions.kind = nn::Positions::learned;
    norm_first = true;
  }
  nlohmann::json to_json() const { return stack_json(); }
  int64_t parameter_count() const { return stack_parameters(/*final_norm=*/true); }
  // Errors name the field (and `where`, e.g. the file) for a missing, mistyped or out-of-range value.
  static LMConfig from_json(const nlohmann::json& j, const std::string& where = "LMConfig");
};

class DecoderOnlyLM : public nn::Module {
 public:
  explicit DecoderOnlyLM(const LMConfig& c);
  Tensor forward(const Tensor& ids) const;                  // logits (B, T, V)
  Tensor embed(const Tensor& ids, int64_t start = 0) const;  // embedding + positions + dropout
  Tensor logits(const Tensor& h) const;                     // through the tied embedding
  LMConfig cfg;
  Generator dropout_gen;
  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::EmbeddingPositions> pos;  // "pos.weight" when learned
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::CausalStack> blocks;  // with the final LayerNorm (and rope/alibi/relative)
};

// Continues each prompt (rows of equal length, no padding) by up to o.max_len tokens: greedy,
// beam or sampling as the options say, through models/decoding with a KV cache (or, with
// o.use_cache false, re-running the whole prefix). Stops a row at eos (eos < 0: never). Each
// result is the generated tokens only.
Sequences generate(DecoderOnlyLM& lm, const std::vector<std::vector<int64_t>>& prompts,
                   int64_t eos, const DecodeOptions& o);

}  // namespace graft::models
