// Encoder-only classifier (BERT-style without pre-training): Encoder over the tokens, mean over
// the non-pad positions, then a linear head. ids (B, T) -> logits (B, classes).
#pragma once

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/nn/transformer.h"

namespace graft::models {

struct ClassifierConfig : StackConfig {
  int64_t classes = 2;
  nlohmann::json to_json() const;
  int64_t parameter_count() const;
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
