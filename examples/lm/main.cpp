// lm: a decoder-only language model on real text, byte-level.
//   lm train --text FILE... --out runs/lm [--preset lm-mini] [--positions rope] [--minutes 5]
//   lm generate --run runs/lm --prompt "A fool" [--max-new 200] [--beam 4 | --sample --top-p 0.9]
//               [--repetition-penalty 1.3] [--stop-id 10]... [--min-new-tokens N] [--stream]
//   lm generate --hf DIR (--ids 1,2,3 | --prompt TEXT) [decoding options]: a Hugging Face
//               checkpoint (--prompt through DIR/tokenizer.json, a byte-level BPE, or else
//               DIR/tokenizer.model, SentencePiece)
//   lm evaluate --run runs/lm [--context N] [--text FILE...]
// Default text: the English fortune cookies of Debian's `fortunes` package.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "examples/common/cli.h"
#include "examples/common/finite.h"
#include "examples/lm/hf_text.h"
#include "examples/lm/kneser_ney.h"
#include "examples/lm/lm.h"
#include "graft/models/hf.h"

using namespace graft;

namespace {

std::vector<std::string> default_text() {
  const std::string dir = "/usr/share/games/fortunes";
  std::vector<std::string> files;
  for (const char* f :
       {"fortunes", "literature", "wisdom", "people", "humorists", "science", "work", "education",
        "food", "politics", "love", "men-women", "miscellaneous"})
    if (std::filesystem::exists(dir + "/" + f)) files.push_back(dir + "/" + f);
  if (files.empty())
    throw std::runtime_error("no --text given and Debian's fortunes are not installed in " + dir +
                             " (apt-get install fortunes, or `make lm` installs it)");
  return files;
}

// lm::evaluate() checks each window's loss; this checks what is printed.
void print_metrics(const char* what, const lm::Metrics& m, int64_t context) {
  const std::string name = std::string(what) + " ";
  cli::check_finite(name + "loss", m.loss);
  cli::check_finite(name + "bits per character", m.bpc);
  std::printf(
      "%s (context %lld): loss %.4f nats/token, perplexity %.3f, %.4f bits/char (%lld tokens, %lld "
      "chars)\n",
      what, (long long)context, m.loss, m.ppl, m.bpc, (long long)m.tokens, (long long)m.chars);
}

// Each subcommand: its options (kept alive by the closure that runs it) and its CLI.

int cmd_train(lm::TrainOptions o) {
  if (o.loop.steps <= 0 && o.loop.minutes <= 0)
    throw std::runtime_error("train: give --steps N or --minutes M");
  if (o.text.empty() && !o.loop.resume) o.text = default_text();
  lm::TrainResult r = lm::train(o);
  if (train::world_communicator().rank() != 0) return 0;  // under mpirun rank 0 reports
  std::printf("trained steps %lld..%lld in %.1f s (%.0f tokens/s)%s\n",
              (long long)r.loop.first_step, (long long)r.loop.last_step, r.loop.train_seconds,
              r.loop.tokens_per_s, r.loop.stopped_early ? ", stopped early" : "");
  print_metrics("valid", r.valid, r.context);
  return 0;
}

// How many bytes at the end of `s` begin a UTF-8 character that is not complete yet.
size_t incomplete_utf8_tail(const std::string& s) {
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const unsigned char c = (unsigned char)s[s.size() - back];
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: its lead is further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return back < need ? back : 0;
  }
  return 0;
}

// --stream: prints each byte token as it is chosen, holding back the first bytes of a UTF-8
// character until it is complete (a terminal would show a broken character).
class StreamPrinter {
 public:
  void add(int64_t token) {
    if (token < 0 || token > 255) return;  // BOS, EOS, PAD: not text
    pending_ += (char)token;
    const size_t ready = pending_.size() - incomplete_utf8_tail(pending_);
    std::cout << pending_.substr(0, ready) << std::flush;
    pending_.erase(0, ready);
  }
  void finish() { std::cout << pending_ << std::endl; }

 private:
  std::string pending_;
};

int cmd_generate(const std::string& run_dir, const std::string& prompt_text,
                 models::DecodeOptions o, bool stream) {
  models::check_decode_options(o);
  models::check_stop_ids(lm::kEOS, o, lm::kVocab);
  lm::LoadedRun run = lm::load_run(run_dir);
  // As translate: each linear weight held once, in the form --precision runs it in.
  models::keep_for_inference(*run.model, matmul_precision());
  std::vector<int64_t> prompt{lm::kBOS};
  for (int64_t t : lm::encode(prompt_text)) prompt.push_back(t);
  StreamPrinter printer;
  if (stream) {
    std::cout << prompt_text << std::flush;
    o.on_token = [&](int64_t token, int64_t) { printer.add(token); };
  }
  auto out = models::generate(*run.model, {prompt}, lm::kEOS, o);
  if (stream) printer.finish();
  else std::cout << prompt_text << lm::decode(out[0]) << std::endl;
  return 0;
}

// --ids "1,2,3": token ids of a vocabulary of `vocab`, named in every error.
std::vector<int64_t> parse_ids(const std::string& text, int64_t vocab) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || id < 0 || id >= vocab)
      throw std::runtime_error("--ids: '" + item + "' is not a token id in [0, " +
                               std::to_string(vocab) + ")");
    ids.push_back(id);
  }
  if (ids.empty()) throw std::runtime_error("--ids: no token ids given");
  return ids;
}

// The prompt's ids: --ids as given, or --prompt through the directory's tokenizer (with its
// BOS). Exactly one of them.
std::vector<int64_t> hf_prompt(const std::string& ids_text, const std::string& text,
                               const lm::HfText* tok, int64_t vocab) {
  if (!ids_text.empty() && !text.empty()) throw std::runtime_error("--hf: give --ids or --prompt");
  if (!tok) return parse_ids(ids_text, vocab);
  std::vector<int64_t> ids = tok->encode(text);
  if (ids.empty()) throw std::runtime_error("--prompt: the text has no tokens");
  for (int64_t id : ids)
    if (id >= vocab)
      throw std::runtime_error("--prompt: the tokenizer's id " + std::to_string(id) +
                               " is outside the model's vocabulary of " + std::to_string(vocab));
  return ids;
}

// With --prompt the text comes out (as it is generated with --stream), with --ids the new ids
// as they are chosen.
void generate_printing(models::HfCausalLM& m, const std::vector<int64_t>& prompt, int64_t eos,
                       models::DecodeOptions o, const lm::HfText* tok, const std::string& text,
                       bool stream) {
  std::optional<lm::HfText::Stream> printer;
  if (tok) printer.emplace(*tok, prompt);
  if (!tok) o.on_token = [](int64_t token, int64_t) { std::cout << token << ' ' << std::flush; };
  else if (stream)
    o.on_token = [&](int64_t t, int64_t) { std::cout << printer->push(t) << std::flush; };
  if (tok) std::cout << text << std::flush;
  const models::Sequences out = models::generate(*m.model, {prompt}, eos, o);
  if (tok && !stream)
    for (const int64_t t : out[0]) std::cout << printer->push(t);
  if (tok) std::cout << printer->finish();
  std::cout << std::endl;
}

// A Hugging Face directory's model continuing a prompt: its eos ids stop a row. 16-bit files run
// in bf16 as stored, or widened once for fp32/int8. --prompt goes through DIR/tokenizer.json or
// DIR/tokenizer.model (lm::HfText).
int cmd_generate_hf(const std::string& dir, const std::string& ids_text, const std::string& text,
                    models::DecodeOptions o, bool stream) {
  models::check_decode_options(o);
  std::optional<lm::HfText> tok;
  if (!text.empty()) tok = lm::HfText::load(dir);
  models::HfCausalLM m = models::load_hf_causal_lm(dir, matmul_precision());
  const int64_t vocab = m.model->cfg.vocab;
  const std::vector<int64_t> prompt = hf_prompt(ids_text, text, tok ? &*tok : nullptr, vocab);
  const int64_t eos = m.hf.eos_ids.empty() ? -1 : m.hf.eos_ids[0];
  for (size_t i = 1; i < m.hf.eos_ids.size(); ++i) o.stop_ids.push_back(m.hf.eos_ids[i]);
  models::check_stop_ids(eos, o, vocab);
  generate_printing(m, prompt, eos, o, tok ? &*tok : nullptr, text, stream);
  return 0;
}

// The run's validation documents, or every document of `text` when given.
// Then the Kneser-Ney baseline trained on the run's training documents, on the same tokens.
int cmd_evaluate(const std::string& run_dir, int64_t context,
                 const std::vector<std::string>& text) {
  lm::LoadedRun run = lm::load_run(run_dir);
  const int64_t ctx = context > 0 ? context : run.context;
  std::vector<std::string> train_docs, valid_docs;
  lm::split_documents(lm::read_documents(run.text), 20, run.seed, train_docs, valid_docs);
  const char* what = text.empty() ? "valid" : "text";
  const std::vector<int64_t> stream =
      lm::token_stream(text.empty() ? valid_docs : lm::read_documents(text));
  print_metrics(what, lm::evaluate(*run.model, stream, ctx), ctx);
  const lm::Metrics b =
      lm::evaluate(lm::KneserNey(lm::token_stream(train_docs), lm::kBaselineOrder), stream, ctx);
  std::printf("baseline (%s, trained on the run's training documents): %.4f bits/char\n",
              lm::kBaselineName, cli::check_finite("the baseline's bits per character", b.bpc));
  return 0;
}

cli::Command add_train(CLI::App& app) {
  auto o = std::make_shared<lm::TrainOptions>();
  auto* sub =
      app.add_subcommand("train", "train (or --resume) a language model into a run directory");
  sub->add_option(
      "--text", o->text,
      "UTF-8 text files (fortune files or paragraphs); default: Debian's English fortunes");
  sub->add_option("--out", o->loop.run_dir, "run directory")->required();
  sub->add_option("--preset", o->preset,
                  "lm-mini, lm-small or llama-mini (rope, RMSNorm, SwiGLU, 2 KV heads, no biases)")
      ->check(CLI::IsMember({"lm-mini", "lm-small", "llama-mini"}));
  sub->add_option("--positions", o->positions,
                  "sinusoidal, learned, rope, alibi, relative (default: the preset's)")
      ->check(CLI::IsMember({"sinusoidal", "learned", "rope", "alibi", "relative"}));
  sub->add_option("--context", o->context, "training context in tokens (default: the preset's)")
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--batch-rows", o->batch_rows, "windows per batch")->check(CLI::Range(1, 4096));
  sub->add_option("--dropout", o->dropout,
                  "dropout (default 0: best in 5 minutes; past ~7 minutes 0.1, docs/lm.md)")
      ->check(cli::range(0.0, 1.0));
  cli::add_loop_options(sub, o->loop, 400, "bpc",
                        "initialisation, dropout, batch order and the split");
  cli::add_precision(sub);
  return {sub, [o, sub] {
            cli::set_auto_warmup(sub, o->loop.warmup, o->loop.steps, 400);
            return cmd_train(*o);
          }};
}

cli::Command add_generate(CLI::App& app) {
  struct Args {
    std::string run, prompt, hf, ids;
    models::DecodeOptions opt;
    bool stream = false;
  };
  auto a = std::make_shared<Args>();
  a->opt.max_len = 200;
  auto* sub = app.add_subcommand("generate", "continue a prompt");
  auto* run = sub->add_option("--run", a->run, "run directory");
  auto* hf = sub->add_option("--hf", a->hf,
                             "a Hugging Face causal LM directory (llama, mistral, qwen2, gpt2) "
                             "instead of a run")
                 ->check(CLI::ExistingDirectory)
                 ->excludes(run);
  run->excludes(hf);
  sub->add_option("--ids", a->ids, "with --hf: the prompt's token ids, comma-separated")->needs(hf);
  sub->add_option("--prompt", a->prompt,
                  "text to continue (may be empty; with --hf, through DIR/tokenizer.json or "
                  "DIR/tokenizer.model)");
  sub->add_option("--max-new", a->opt.max_len, "new tokens (bytes) at most")
      ->check(CLI::Range(1, 1 << 20));
  cli::add_decoding_options(sub, a->opt);
  // NaN and <= 0 pass CLI11: check_decode_options() names the option.
  sub->add_option("--repetition-penalty", a->opt.repetition_penalty,
                  "HF repetition_penalty over the prompt and the text so far (> 0; 1: off)");
  sub->add_option("--stop-id", a->opt.stop_ids,
                  "stop at this token id too (repeatable; EOS 257 always stops)");
  sub->add_option("--min-new-tokens", a->opt.min_new_tokens,
                  "no stop before this many new tokens (<= --max-new)");
  sub->add_flag("--stream", a->stream, "print the text as it is generated");
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a] {
            if (!a->hf.empty()) return cmd_generate_hf(a->hf, a->ids, a->prompt, a->opt, a->stream);
            if (a->run.empty()) throw std::runtime_error("generate: give --run DIR or --hf DIR");
            return cmd_generate(a->run, a->prompt, a->opt, a->stream);
          }};
}

cli::Command add_evaluate(CLI::App& app) {
  struct Args {
    std::string run;
    int64_t context = 0;
    std::vector<std::string> text;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("evaluate", "validation loss, perplexity and bits per character");
  sub->add_option("--run", a->run, "run directory")->required();
  sub->add_option("--context", a->context, "window in tokens (default: the training context)")
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--text", a->text,
                  "score every document of these files (fortune or plain text) instead of the "
                  "run's validation documents")
      ->check(CLI::ExistingFile);
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a] { return cmd_evaluate(a->run, a->context, a->text); }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"graft decoder-only language model: train, generate, evaluate (byte-level)"};
  app.require_subcommand(1);
  cli::show_defaults(app);
  const std::vector<cli::Command> commands = {add_train(app), add_generate(app), add_evaluate(app)};
  return cli::run_commands(app, commands, argc, argv);
}
