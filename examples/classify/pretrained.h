// The classifier over a pretrained encoder (`classify train --init-from DIR`): a BERT-family
// sentence encoder (models::SentenceEncoder's directory: tokenizer, encoder, pooling,
// normalisation) with dropout and a linear head over the labels.
//
//   e = pool(BertEncoder(ids, pad))  (mean over the real tokens, or [CLS]);  e = e / |e| if
//   normalised logits = head(dropout(e))        head: d -> classes (a normalised e scaled by
//   sqrt(d) first)
//
// Fine-tuning trains every weight; --freeze trains the head alone on embeddings computed once
// (logistic regression on frozen sentence embeddings). Either way the run directory is
// self-contained: config.json ("family": "pretrained", the encoder's config, pooling,
// normalisation, labels), model.safetensors (encoder and head: the best validated weights) and
// tokenizer/ (the directory's tokenizer files, tied to the weights by their checksums).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/classify/classify.h"
#include "graft/models/bert.h"
#include "graft/models/sentence_encoder.h"
#include "graft/nn/text/wordpiece.h"

namespace graft::classify {

// The classifier's config: the encoder's (models::BertConfig) plus what sits on top of it.
struct PretrainedConfig : models::BertConfig {
  int64_t classes = 2;  // output classes
  models::Pooling pooling = models::Pooling::mean;
  bool normalize = false;        // L2-normalise the pooled vector before the head
  double head_dropout = 0.1;     // on the pooled vector, while training
  int64_t max_seq_length = 256;  // a text is cut to this many ids, [CLS] and [SEP] included
  // The field table: models::bert_fields() plus the above.
  static const models::ConfigFields<PretrainedConfig>& fields();
  nlohmann::json to_json() const;
  // Reads to_json()'s form and validates it.
  // @throws graft::Error naming `where` and the field.
  static PretrainedConfig from_json(const nlohmann::json& j,
                                    const std::string& where = "PretrainedConfig");
  // BertConfig::validate() plus classes in [1, kMaxLabels], head_dropout in [0, 1] and
  // max_seq_length in [2, max_len].
  // @throws graft::Error `<where>: field "<name>" ...`.
  void validate(const std::string& where = "PretrainedConfig") const;
  int64_t parameter_count() const;  // the encoder's and the head's
};

class PretrainedClassifier : public nn::Module {
 public:
  // A classifier of config c over `encoder` (its config must be c's encoder part), or over a
  // fresh encoder built from c when encoder is null; the head is initialised from c.seed.
  // @throws graft::Error when c.validate() refuses c.
  explicit PretrainedClassifier(const PretrainedConfig& c,
                                std::shared_ptr<models::BertEncoder> encoder = nullptr);
  // ids (B, T), pad (B, T) non-zero = padding -> the pooled (and normalised) embeddings (B, d).
  Tensor embed(const Tensor& ids, const Tensor& pad) const;
  // embeddings (B, d) -> logits (B, classes), through dropout while training (normalised
  // embeddings are scaled by sqrt(d) first: components of about 1, as the head expects).
  Tensor logits(const Tensor& embeddings) const;
  Tensor forward(const Tensor& ids, const Tensor& pad) const { return logits(embed(ids, pad)); }
  PretrainedConfig cfg;
  Generator dropout_gen;                         // the head's dropout masks
  std::shared_ptr<models::BertEncoder> encoder;  // "encoder"
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Linear> head;  // "head", d -> classes
};

// A loaded pretrained classifier and the tokenizer it reads text with.
struct PretrainedRun {
  std::unique_ptr<PretrainedClassifier> model;  // in eval mode
  std::unique_ptr<text::WordPiece> tokenizer;
};

// The tokenizer files a pretrained directory may hold, copied into a run's tokenizer/.
const std::vector<std::string>& tokenizer_files();
// The tokenizer files of `dir` that exist (full paths).
std::vector<std::string> tokenizer_files_in(const std::string& dir);

// evaluate()/predict() of classify.h for the pretrained family.
Metrics evaluate(const PretrainedRun& run, const std::vector<std::string>& labels,
                 const std::vector<Example>& data);
std::vector<std::pair<std::string, double>> predict(const PretrainedRun& run,
                                                    const std::vector<std::string>& labels,
                                                    const std::vector<std::string>& texts);

// classify::train() for o.init_from (or a resumed pretrained run).
// @throws graft::Error naming o.init_from/config.json when that is not a pretrained directory.
TrainResult train_pretrained(const TrainOptions& o);

// The run directory's model (config.json, model.safetensors tied to config.json and the tokenizer
// files) and tokenizer.
// @throws graft::Error naming the file at fault.
PretrainedRun load_pretrained_run(const std::string& run_dir);

}  // namespace graft::classify
