/// @file
/// Encoder-only classifier (BERT-style without pre-training): Encoder over the tokens, mean over
/// the non-pad positions, then a linear head. ids (B, T) -> logits (B, classes).
#pragma once

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/nn/transformer.h"

namespace graft::models {

/// The classifier's config: a StackConfig plus the number of classes. The encoder has a final
/// LayerNorm only when pre-LN (norm_first).
struct ClassifierConfig : StackConfig {
  int64_t classes = 2;  ///< output classes
  nlohmann::json to_json() const;  ///< the fields as JSON (from_json() reads them back)
  /// num_parameters() of the model it builds, without building it.
  /// @throws graft::Error when the count overflows int64.
  int64_t parameter_count() const;
  /// Reads a config written by to_json().
  /// Errors name the field and `where` (e.g. the file).
  /// @throws graft::Error as StackConfig::read_stack(), or for classes outside [1, 2^24].
  static ClassifierConfig from_json(const nlohmann::json& j, const std::string& where = "ClassifierConfig");
};

/// The encoder classifier (see the file's description).
class EncoderClassifier : public nn::Module {
 public:
  /// Builds the model of config c, initialised from c.seed.
  /// @throws graft::Error for a bad config (heads not dividing d_model, bad position settings).
  explicit EncoderClassifier(const ClassifierConfig& c);
  /// ids (B, T) int64 -> logits (B, classes); pad_id positions are masked and left out of the
  /// mean (an all-padding row pools to zeros).
  /// @throws graft::Error when ids is not int64 (B, T), an id is outside [0, V), or (learned
  ///         positions) T > max_len.
  Tensor forward(const Tensor& ids) const;
  ClassifierConfig cfg;  ///< the config it was built from
  Generator dropout_gen;  ///< all dropout masks come from here (saved for exact resume)
  std::shared_ptr<nn::Embedding> embedding;  ///< "embedding", scaled by sqrt(d) on the way in
  std::shared_ptr<nn::EmbeddingPositions> pos;  ///< "pos" (learned or sinusoidal positions)
  std::shared_ptr<nn::Dropout> dropout;  ///< on the embeddings
  std::shared_ptr<nn::Encoder> encoder;  ///< "encoder", bidirectional
  std::shared_ptr<nn::Linear> head;  ///< "head", d -> classes
};

}  // namespace graft::models
