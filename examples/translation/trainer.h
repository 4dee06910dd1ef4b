// The reusable half of the toy-translation example: corpus loading, token-budget batching, the
// training loop with exact resume, evaluation (loss / accuracy / perplexity / BLEU), decoding and
// checkpoints. main.cpp is only the command line over these; the tests call them directly.
//
// A run directory holds:
//   spm.model / spm.vocab     the shared SentencePiece model (trained once, kept on resume)
//   config.json               model config + the training options
//   model.safetensors         the weights (what `translate` and `evaluate` load)
//   train_state.safetensors   everything an exact resume needs in ONE atomically written file:
//                             the weights again, the optimizer moments, and in the metadata the
//                             step, every RNG state, the epoch, the epoch's batch order and the
//                             position in it. One file means a crash between two writes can never
//                             pair weights from one step with moments from another.
//   metrics.csv, curves.png   the learning curves
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "examples/translation/bleu.h"
#include "examples/translation/corpus.h"
#include "graft/autograd/tensor.h"
#include "graft/models/run.h"
#include "graft/models/transformer.h"
#include "graft/nn/text/tokenizer.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/precision.h"

namespace graft::translation {

// ---- data ----

// read_tsv over one file, with the skipped/kept tally added to `stats`.
std::vector<text::Pair> load_corpus(const std::string& path, text::CorpusStats& stats);

struct Example {
  std::vector<int64_t> src, tgt;  // piece ids, no BOS/EOS
};
std::vector<Example> encode_pairs(const text::Tokenizer& tok, const std::vector<text::Pair>& pairs);

// One padded batch: tgt_in = BOS + y, tgt_out = y + EOS (teacher forcing), PAD elsewhere.
struct Batch {
  Tensor src, tgt_in, tgt_out;  // int64 (B, S), (B, T), (B, T)
  int64_t tgt_tokens = 0;       // non-PAD entries of tgt_out (what the loss averages over)
};

// Sorts the examples by (target, source) length and cuts the sorted run into batches whose
// padded target size rows * T stays within max_tokens, so a batch wastes little on padding.
// Deterministic: the same examples give the same batches. Examples longer than max_len - 1
// pieces on either side cannot be fed to the model and are dropped (counted in *dropped).
std::vector<Batch> make_batches(const std::vector<Example>& examples, int64_t max_tokens,
                                int64_t max_len, size_t* dropped = nullptr);

// ---- training ----

struct TrainOptions {
  std::string data_dir;
  std::string preset = "tiny";
  int64_t batch_tokens = 4096;
  double label_smoothing = 0.1;
  double dropout = 0.1;
  bool pre_ln = false;
  std::string positions = "sinusoidal";  // sinusoidal, learned, rope, alibi, relative
  double attention_dropout = 0;
  int vocab = 1000;
  int64_t bleu_sentences = 200;
  // For a peer implementation trained on the same data (bench/torch_quality.py): writes every
  // batch's ids, the BLEU sources' ids and then, per step, the batch it trained on, as JSON
  // lines to this file, and the initial weights to <file>.init.safetensors. Not with resume.
  std::string dump_batches;
  bool plot = true;  // write curves.png
  // Also draw the graph of one training step (the first batch) into this file (.svg/.png/.pdf
  // through Graphviz, .dot as text) before training; it leaves the run as without it.
  std::string graph;
  // The weights' storage dtype (--dtype): f32, or bf16/f16 (Module::to after initialisation),
  // trained by the optimizer's float32 masters and moments (the mixed-precision recipe).
  DType dtype = DType::f32;
  // Overrides of the preset (0: keep the preset's value); the tests use tiny models.
  int64_t d_model = 0, heads = 0, d_ff = 0, layers = 0;
  // run_dir, budget, recipe, validation, early stopping (on valid BLEU; stop_at: time to a
  // valid BLEU), seed (initialisation, dropout, batch order), resume (the model config and the
  // recipe/batching/seed come from the run's config.json; the budget and reporting from here),
  // data parallel. The loop's d_model is the model's.
  train::LoopOptions loop;

  nlohmann::json to_json() const;
};

struct ValidMetrics {
  double loss = 0, ppl = 0, acc = 0, bleu = 0;
};

struct TrainResult {
  int64_t first_step = 0;  // steps taken before this call (resume point)
  int64_t last_step = 0;
  std::vector<double> losses;  // losses[i] is the training loss of step first_step + 1 + i
  ValidMetrics last_valid;
  double tokens_per_s = 0;   // target tokens per second of training (this call)
  double train_seconds = 0;  // this call
  bool stopped_early = false;
};

// The dtype a `--dtype` value names (what: the option, for the message): f32, f64, bf16 or f16,
// short or long names. Throws graft::Error "<what>: ..." for an unknown name or int64.
DType parse_train_dtype(const std::string& name, const std::string& what);

// Trains into opts.run_dir (created). Throws graft::Error / std::runtime_error with a message
// naming the file on a bad or inconsistent checkpoint when resuming.
TrainResult train(const TrainOptions& opts);

// ---- evaluation and decoding ----

// Teacher-forced loss (unsmoothed NLL per target token), token accuracy and perplexity; NaN
// when there were no tokens (say so rather than print 0).
struct ForcedMetrics {
  double loss = NAN, ppl = NAN, acc = NAN;
  int64_t tokens = 0;
};
ForcedMetrics teacher_forced(models::Transformer& m, const std::vector<Batch>& batches);

// Translates sentences in length-sorted chunks; output order matches the input. o says greedy,
// beam or sampling; its max_len is replaced by max_len (0: 2 * source length + 10). An empty or
// whitespace-only line gives an empty line; a source longer than the model's max_len is cut to
// it and counted in *truncated.
std::vector<std::string> translate_lines(models::Transformer& m, const text::Tokenizer& tok,
                                         const std::vector<std::string>& lines,
                                         const models::DecodeOptions& o, int64_t max_len = 0,
                                         size_t* truncated = nullptr);
std::vector<std::string> translate_lines(models::Transformer& m, const text::Tokenizer& tok,
                                         const std::vector<std::string>& lines, int beam = 1,
                                         int64_t max_len = 0, size_t* truncated = nullptr);

struct EvalResult {
  ForcedMetrics forced;
  size_t forced_dropped = 0;  // pairs longer than max_len, left out of the teacher-forced metrics
  size_t truncated = 0;       // sources longer than max_len, cut to it for decoding
  text::BleuResult bleu;
  text::BleuResult copy_source;  // the baseline: each source sentence itself as the hypothesis
  std::vector<std::string> hyps;
};
EvalResult evaluate(models::Transformer& m, const text::Tokenizer& tok,
                    const std::vector<text::Pair>& pairs, int beam = 1,
                    int64_t batch_tokens = 4096);

// Cross-attention of the last decoder layer averaged over heads, (generated pieces + EOS) x
// source pieces, recomputed by one teacher-forced decode over the generated output.
struct Attention {
  std::vector<std::vector<double>> weights;
  std::vector<std::string> src_pieces, tgt_pieces;
};
Attention cross_attention(models::Transformer& m, const text::Tokenizer& tok,
                          const std::string& src, const std::string& hyp);

// Corpus BLEU (sacreBLEU defaults, text::corpus_bleu) of hypotheses given as token ids, one
// line of space-separated ids per sentence, decoded with tok, against refs (same count).
text::BleuResult bleu_of_ids(const text::Tokenizer& tok, const std::string& hyp_ids_file,
                             const std::vector<std::string>& refs);

// ---- checkpoints ----

struct LoadedRun {
  std::unique_ptr<models::Transformer> model;
  std::unique_ptr<text::Tokenizer> tok;
  nlohmann::json config;
  std::string weights;  // the weights file loaded: model.safetensors or an export
  std::map<std::string, std::string> metadata;  // that file's metadata as loaded (checksum, step)
};
// config.json + spm.model + model.safetensors, model in eval mode. The weights' checksum and
// their fingerprints of config.json and spm.model are verified, and the config's sizes matched
// against the weights file, before the model is built; errors name the file. With precision int8
// or bf16, the run's export for it (model.int8.safetensors, model.bf16.safetensors: export_run)
// is loaded instead when present, without a float32 copy of a quantized weight (models/run.h);
// `weights` then names it. RunSource::weights reads model.safetensors whatever the precision (for
// int8 in a float32 model), as export_run does.
LoadedRun load_run(const std::string& run_dir, Precision precision = Precision::fp32,
                   models::RunSource source = models::RunSource::export_if_present);

// Writes run_dir's export for inference at `precision` (int8 or bf16) from its model.safetensors:
// run_dir/model.<precision>.safetensors (models/exported.h), tied to config.json, spm.model and
// the weights it was made from. Returns its path.
std::string export_run(const std::string& run_dir, Precision precision);

// The weights with a checksum (and the fingerprints of tied_files) in the metadata, written
// atomically.
void save_model(const models::Transformer& m, const std::string& path, int64_t step,
                const std::vector<std::string>& tied_files = {});
// The side files a run's weights are tied to: its config.json and spm.model.
std::vector<std::string> tied_files(const std::string& run_dir);
// The files of a run directory that its commands read, which no output path may name
// (train::check_output_path), followed by `more`.
std::vector<train::NamedInput> run_inputs(const std::string& run_dir,
                                          std::vector<train::NamedInput> more = {});
// Verifies the checksum; throws "load_model: '<path>': ..." on any problem.
void load_model(models::Transformer& m, const std::string& path);

}  // namespace graft::translation
