// The language-model example's reusable half: documents from text files, byte-level tokens,
// training through train::train_loop, evaluation in bits per character. main.cpp is the command
// line over these; the tests call them directly.
//
// Tokens are bytes (ids 0..255) plus BOS 256 (a document starts) and EOS 257 (it ends); PAD 258
// never enters a window. Byte tokens need no tokenizer file and make bits per character
// tokenizer-independent: the NLL of every predicted token (bytes and EOS) summed in bits over the
// characters it covers (UTF-8 code points, and one per EOS).
//
// A run directory holds config.json (model + training options), model.safetensors (the weights,
// checksummed), train_state.safetensors and metrics.csv (train::train_loop).
#pragma once

#include <string>
#include <vector>

#include "graft/models/decoder_only_lm.h"
#include "graft/nn/train/trainer.h"

namespace graft::lm {

constexpr int64_t kBOS = 256, kEOS = 257, kPAD = 258, kVocab = 259;

// Documents of text files: a file of fortune cookies (lines holding only "%" separate them) or
// plain text (blank lines separate paragraphs). Leading/trailing whitespace is trimmed; empty
// documents are dropped. Throws naming the file when it cannot be read, is not a regular file
// (/dev/zero), is over kMaxTextFileBytes or is not UTF-8.
constexpr uintmax_t kMaxTextFileBytes = uintmax_t(1) << 30;  // per file
std::vector<std::string> read_documents(const std::vector<std::string>& paths);
// Every k-th document (by a seeded shuffle) goes to validation; both sides non-empty.
void split_documents(const std::vector<std::string>& docs, int64_t valid_every, uint64_t seed,
                     std::vector<std::string>& train, std::vector<std::string>& valid);
// BOS doc EOS BOS doc EOS ... as byte tokens.
std::vector<int64_t> token_stream(const std::vector<std::string>& docs);
std::vector<int64_t> encode(const std::string& text);  // bytes only
// Characters a predicted token covers: a UTF-8 lead byte or an ASCII byte starts one, a
// continuation byte none, EOS one (the document's end), BOS none (never predicted: it follows EOS).
int64_t chars_of(int64_t token);
std::string decode(const std::vector<int64_t>& tokens);  // bytes; specials dropped

// Windows of `len + 1` tokens cut from the stream (the last partial one dropped), `rows` per
// batch: inputs = window[:-1], targets = window[1:].
struct Batch {
  Tensor input, target;  // int64 (rows, len)
  int64_t tokens = 0;
};
std::vector<Batch> make_batches(const std::vector<int64_t>& stream, int64_t len, int64_t rows);

struct Metrics {
  double loss = 0, ppl = 0, bpc = 0;  // mean NLL per token (nats), exp(loss), bits per character
  int64_t tokens = 0, chars = 0;
};
// The metrics of `nll` nats summed over `tokens` predicted tokens covering `chars` characters.
Metrics metrics_of(double nll, int64_t tokens, int64_t chars);
// Scores every token of non-overlapping windows of `context` tokens (the model in eval mode).
Metrics evaluate(models::DecoderOnlyLM& m, const std::vector<int64_t>& stream, int64_t context);

// Presets: lm-mini (d 128, 4 heads, ff 512, 2 layers, context 128), lm-small (d 256, 4 heads,
// ff 1024, 4 layers, context 256), llama-mini (lm-mini's size in the Llama recipe: rope, RMSNorm,
// SwiGLU with ff 384, 2 KV heads, no biases). Throws naming the known presets.
models::LMConfig preset(const std::string& name);

struct TrainOptions {
  std::vector<std::string> text;  // files
  std::string preset = "lm-mini",
              positions;  // positions empty: the preset's (learned; llama-mini rope)
  int64_t context = 0;    // 0: the preset's
  int64_t batch_rows = 16;
  double dropout = 0.0;  // 0: the best measured in make lm's budget (docs/lm.md); the model does
                         // not overfit there
  bool plot = true;      // curves.png
  // run_dir, budget, schedule, validation, early stopping, seed, resume (d_model is the model's)
  train::LoopOptions loop;
  TrainOptions() {
    loop.warmup = 400;
    loop.valid_every = 200;
    loop.log_every = 50;
  }
};
struct TrainResult {
  train::LoopResult loop;
  Metrics valid;           // at the training context
  Metrics baseline_valid;  // the Kneser-Ney baseline's (kneser_ney.h) on the same tokens; rank 0
  int64_t context = 0;
};
TrainResult train(const TrainOptions& o);

struct LoadedRun {
  std::unique_ptr<models::DecoderOnlyLM> model;
  int64_t context = 0;  // the training context
  std::vector<std::string> text;
  uint64_t seed = 1;
};
LoadedRun load_run(const std::string& run_dir);

}  // namespace graft::lm
