/// @file
/// Encoder-only classifier (BERT-style without pre-training): Encoder over the tokens, mean over
/// the non-pad positions, then a linear head. ids (B, T) -> logits (B, classes). Optionally each
/// position's input also holds hashed embeddings of the n-grams that end there (fastText's
/// subword features), which give the encoder a bag of n-grams from its first layer on.
#pragma once

#include <nlohmann/json.hpp>

#include "graft/models/config_json.h"
#include "graft/nn/transformer.h"

namespace graft::models {

/// The classifier's config: a StackConfig plus the number of classes and the hashed n-gram
/// inputs. The encoder has a final LayerNorm only when pre-LN (norm_first).
struct ClassifierConfig : StackConfig {
  int64_t classes = 2;  ///< output classes
  /// > 0: the n-grams of 2..ngram_max tokens ending at each position are hashed into this many
  /// rows of a second embedding table, added to the token embedding; 0: tokens alone.
  int64_t ngram_buckets = 0;
  int64_t ngram_max = 5;  ///< the longest n-gram hashed, in [2, 8]
  /// The field table (stack_fields() plus the above), which to_json(), from_json() and
  /// validate() follow.
  static const ConfigFields<ClassifierConfig>& fields();
  nlohmann::json to_json() const;  ///< the fields as JSON (from_json() reads them back)
  /// num_parameters() of the model it builds, without building it.
  /// @throws graft::Error when the count overflows int64.
  int64_t parameter_count() const;
  /// Reads a config written by to_json(), then validate()s it. Errors name the field and
  /// `where` (e.g. the file). A config without the n-gram fields (graft 0.2) reads as tokens alone.
  /// @throws graft::Error as read_fields() and validate().
  static ClassifierConfig from_json(const nlohmann::json& j,
                                    const std::string& where = "ClassifierConfig");
  /// Checks every range, the one check both from_json() and EncoderClassifier's constructor
  /// make: stack_fields()', classes in [1, 2^24], ngram_buckets in [0, 2^24], ngram_max in
  /// [2, 8].
  /// @throws graft::Error `<where>: field "<name>" ...` for the first field out of range.
  void validate(const std::string& where = "ClassifierConfig") const;
};

/// The encoder classifier (see the file's description).
class EncoderClassifier : public nn::Module {
 public:
  /// Builds the model of config c, initialised from c.seed.
  /// @throws graft::Error "EncoderClassifier: field ..." when c.validate() refuses c.
  explicit EncoderClassifier(const ClassifierConfig& c);
  /// ids (B, T) int64 -> logits (B, classes); pad_id positions are masked and left out of the
  /// mean (an all-padding row pools to zeros).
  /// @throws graft::Error when ids is not int64 (B, T), an id is outside [0, V), or (learned
  ///         positions) T > max_len.
  Tensor forward(const Tensor& ids) const;
  /// The rows of `ngrams` for ids (B, T): (B, T, ngram_max - 1), the hashed n-gram of 2, 3, ...
  /// tokens ending at each position, or row ngram_buckets ("no n-gram") where the n-gram would
  /// start before the text or hold a pad. The hash (FNV-1a over n and the tokens, splitmix64's
  /// finaliser, modulo ngram_buckets) is part of the saved-model format: frozen, and pinned by a
  /// test.
  /// @throws graft::Error when the config has no n-gram table.
  Tensor ngram_ids(const Tensor& ids) const;
  ClassifierConfig cfg;   ///< the config it was built from
  Generator dropout_gen;  ///< all dropout masks come from here (saved for exact resume)
  std::shared_ptr<nn::Embedding> embedding;  ///< "embedding", scaled by sqrt(d) on the way in
  std::shared_ptr<nn::Embedding>
      ngrams;  ///< "ngrams" (ngram_buckets + 1 rows, the last "no n-gram"), or null
  std::shared_ptr<nn::EmbeddingPositions> pos;  ///< "pos" (learned or sinusoidal positions)
  std::shared_ptr<nn::Dropout> dropout;         ///< on the embeddings
  std::shared_ptr<nn::Encoder> encoder;         ///< "encoder", bidirectional
  std::shared_ptr<nn::Linear> head;             ///< "head", d -> classes
};

}  // namespace graft::models
