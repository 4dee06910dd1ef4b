// Encoder-only classifier (BERT-style without pre-training): Encoder over the tokens, mean over
// the non-pad positions, then a linear head. ids (B, T) -> logits (B, classes).
#pragma once

#include <nlohmann/json.hpp>

#include "nn/transformer.h"

namespace graft::models {

struct ClassifierConfig {
  int64_t vocab = 1000, classes = 2, d_model = 128, heads = 4, d_ff = 512, layers = 2, max_len = 256;
  double dropout = 0.1;
  nn::PositionOptions positions;  // sinusoidal by default
  bool norm_first = false;
  int64_t pad_id = 0;
  DType dtype = DType::f32;
  uint64_t seed = 1;

  nlohmann::json to_json() const;
  // Errors name the field and `where` (e.g. the file).
  static ClassifierConfig from_json(const nlohmann::json& j, const std::string& where = "ClassifierConfig");
};

class EncoderClassifier : public nn::Module {
 public:
  explicit EncoderClassifier(const ClassifierConfig& c);
  Tensor forward(const Tensor& ids) const;
  ClassifierConfig cfg;
  Generator dropout_gen;
  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::EmbeddingPositions> pos;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Encoder> encoder;
  std::shared_ptr<nn::Linear> head;
};

}  // namespace graft::models
