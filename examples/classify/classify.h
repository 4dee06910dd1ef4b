// The classifier example's reusable half: TSV data (label<TAB>text), the language-identification
// corpus built from Debian's fortunes packages, byte-level tokens, training through
// train::train_loop and evaluation (accuracy, macro-F1, confusion matrix). main.cpp is the command
// line over these; the tests call them directly.
//
// Two model families share the data, the metrics and the run directory. The byte family:
// tokens are the text's bytes (ids 0..255) and PAD 256. The model is models::EncoderClassifier
// (by default with hashed byte 2..5-gram inputs): masked mean pooling over the non-pad positions,
// so padding never changes a prediction. A run directory holds config.json (model, labels, data,
// the learning-rate schedule), model.safetensors (the best validated weights, checksummed),
// train_state.safetensors (the latest) and metrics.csv. The pretrained family (`--init-from`,
// pretrained.h) is a BERT-family encoder with a linear head; config.json's "family" says which.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "graft/models/encoder_classifier.h"
#include "graft/nn/train/trainer.h"

namespace graft::classify {

// kMaxBytes: the byte model's default input length (TrainOptions::max_bytes); longer texts are
// cut there when the byte model encodes them.
constexpr int64_t kPAD = 256, kVocab = 257, kMaxBytes = 160;
constexpr size_t kMaxLineBytes = 1 << 16;  // a TSV line longer than this is an error

struct Example {
  std::string label, text;
};

// label<TAB>text per line (labels are strings). A path that is not a regular file or is over
// text::kMaxInputFileBytes is refused (check_input_file); empty lines are skipped, any other line
// without exactly one tab or with an empty side, not UTF-8, or over kMaxLineBytes (found while
// reading) is an error naming the file and line. Texts are kept whole (each model cuts them to its
// input length).
std::vector<Example> read_tsv(const std::string& path);
void write_tsv(const std::string& path, const std::vector<Example>& examples);  // atomic

// The language-identification task: lines of 20..160 bytes from the fortunes of eight languages
// (en, de, es, it, pt, pl, cs, ga; see the README for the files), at most `per_language` lines
// each, split 80/10/10 train/valid/test by source fortune (all lines of one fortune in one
// split), seeded. Throws naming the missing directory when a package is not installed.
struct Splits {
  std::vector<Example> train, valid, test;
};
Splits build_langid(const std::string& fortunes_dir, int64_t per_language, uint64_t seed);

// The English topic files of Debian's fortunes package (the topic is the label).
extern const std::vector<std::string> kTopics;
// The topic task: each fortune of the kTopics files (their ".u8" versions) is one example, its
// lines joined by single spaces (control characters dropped); split 80/10/10 by fortune within
// each file, seeded. A text found twice is kept once (the first, in kTopics order), so no
// fortune is in two splits. Throws naming the missing file.
Splits build_topics(const std::string& fortunes_dir, uint64_t seed);

// Cuts s to at most n bytes without splitting a UTF-8 character.
std::string cut_utf8(const std::string& s, size_t n);

std::vector<int64_t> encode(const std::string& text);

// How the programs name the baseline of naive_bayes.h.
constexpr const char* kBaselineName = "byte 1-4-gram Naive Bayes";

struct Metrics {
  double accuracy = 0, macro_f1 = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted]
  int64_t n = 0;
};
// The most distinct labels a run may have. Its confusion matrices hold labels^2 counts and the
// Naive Bayes baseline a row of labels per n-gram, so a TSV of 100,000 distinct labels is
// refused at once rather than after minutes.
constexpr size_t kMaxLabels = 1024;
// The distinct labels of `data`, sorted (one pass through a hash set); throws naming `where`
// (the file) and kMaxLabels when there are more.
std::vector<std::string> labels_of(const std::vector<Example>& data, const std::string& where);
// config.json's "labels": a list of `classes` distinct strings; throws naming cfg_path and the
// field.
std::vector<std::string> config_labels(const nlohmann::json& j, int64_t classes,
                                       const std::string& cfg_path);
// On --resume, the learning-rate schedule config.json's "train" section saved, put into `loop`
// (a run of graft 0.2 saved none: the options given stay); throws naming cfg_path.
void apply_saved_schedule(const nlohmann::json& saved, const std::string& cfg_path,
                          train::LoopOptions& loop);
// Label name -> its index in `labels`, a hash map built once, so that an example's lookup does
// not scan the labels.
class LabelIndex {
 public:
  explicit LabelIndex(const std::vector<std::string>& labels);
  // The index of `label`; throws naming the label when it is not one of them.
  int64_t operator()(const std::string& label) const;

 private:
  std::unordered_map<std::string, int64_t> index_;
};
// Accuracy and macro-F1 (the mean over classes of 2TP / (2TP + FP + FN), 0 for a class never
// right) of a confusion matrix [true][predicted]; throws when it counts no example.
Metrics metrics_of(std::vector<std::vector<int64_t>> confusion);

// label ids index `labels`; an example whose label is not among them is an error naming it.
Metrics evaluate(models::EncoderClassifier& m, const std::vector<std::string>& labels,
                 const std::vector<Example>& data);
// (label, probability) of each text.
std::vector<std::pair<std::string, double>> predict(models::EncoderClassifier& m,
                                                    const std::vector<std::string>& labels,
                                                    const std::vector<std::string>& texts);

struct TrainOptions {
  std::string data_dir, positions = "sinusoidal";
  int64_t max_bytes = kMaxBytes;  // byte model: texts are cut to this many bytes (its max_len)
  // The pretrained family (pretrained.h): a sentence-transformers directory to start from, and
  // whether the encoder stays frozen (the head alone trains). `dropout` is then the head's.
  std::string init_from;
  bool freeze = false;
  int64_t d_model = 64, heads = 4, d_ff = 128, layers = 2,
          batch_rows = 512;  // 512: best of 64..1024 (docs/classify.md)
  // Hashed byte 2..5-gram inputs (models::ClassifierConfig) and dropout 0.3: the best measured
  // (docs/classify.md).
  int64_t ngram_buckets = 262144, ngram_max = 5;
  double dropout = 0.3;
  bool plot = true;  // curves.png
  // run_dir, budget, schedule, validation, early stopping, seed, resume (d_model is the model's)
  train::LoopOptions loop;
  TrainOptions() {
    loop.warmup = 200;
    loop.valid_every = 200;
    loop.log_every = 50;
  }
};
// What every classifier training task reports (the byte model's and the pretrained one's):
// accuracy and macro-F1, early stopping on macro-F1 (higher is better), the best weights into
// model.safetensors ("graft-classifier", tied to `tied`) and the curves with the Naive Bayes
// baseline's lines (unless !o.plot). `model` and `o` outlive the task.
void set_classifier_reporting(train::TrainTask& task, const nn::Module& model,
                              const TrainOptions& o, const Metrics& baseline,
                              const std::vector<std::string>& tied);

struct TrainResult {
  train::LoopResult loop;
  // The saved model's (the best validated weights) and the Naive Bayes baseline's (naive_bayes.h),
  // on rank 0.
  Metrics valid, baseline_valid;
};
TrainResult train(const TrainOptions& o);

struct PretrainedRun;
// A trained run of either family: `model` (byte family) or `pretrained`.
struct LoadedRun {
  std::unique_ptr<models::EncoderClassifier> model;
  std::shared_ptr<PretrainedRun> pretrained;
  std::vector<std::string> labels;
  std::string data_dir;  // config.json's "data": where train.tsv was (empty when not recorded)
};
LoadedRun load_run(const std::string& run_dir);
// evaluate() and predict() of whichever model the run holds.
Metrics evaluate(const LoadedRun& run, const std::vector<Example>& data);
std::vector<std::pair<std::string, double>> predict(const LoadedRun& run,
                                                    const std::vector<std::string>& texts);

}  // namespace graft::classify
