// lm: a decoder-only language model on real text, byte-level.
//   lm train --text FILE... --out runs/lm [--preset lm-mini] [--positions rope] [--minutes 5]
//   lm generate --run runs/lm --prompt "A fool" [--max-new 200] [--beam 4 | --sample --top-p 0.9]
//   lm evaluate --run runs/lm [--context N]
// Default text: the English fortune cookies of Debian's `fortunes` package.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "examples/common/cli.h"
#include "examples/lm/lm.h"

using namespace graft;

namespace {

std::vector<std::string> default_text() {
  const std::string dir = "/usr/share/games/fortunes";
  std::vector<std::string> files;
  for (const char* f : {"fortunes", "literature", "wisdom", "people", "humorists", "science", "work",
                        "education", "food", "politics", "love", "men-women", "miscellaneous"})
    if (std::filesystem::exists(dir + "/" + f)) files.push_back(dir + "/" + f);
  if (files.empty())
    throw std::runtime_error("no --text given and Debian's fortunes are not installed in " + dir +
                             " (apt-get install fortunes, or `make lm` installs it)");
  return files;
}

void print_metrics(const char* what, const lm::Metrics& m, int64_t context) {
  std::printf("%s (context %lld): loss %.4f nats/token, perplexity %.3f, %.4f bits/char (%lld tokens, %lld chars)\n",
              what, (long long)context, m.loss, m.ppl, m.bpc, (long long)m.tokens, (long long)m.chars);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"graft decoder-only language model: train, generate, evaluate (byte-level)"};
  app.require_subcommand(1);

  auto* trn = app.add_subcommand("train", "train (or --resume) a language model into a run directory");
  lm::TrainOptions o;
  trn->add_option("--text", o.text, "UTF-8 text files (fortune files or paragraphs); default: Debian's English fortunes");
  trn->add_option("--out", o.loop.run_dir, "run directory")->required();
  trn->add_option("--preset", o.preset, "lm-mini or lm-small")->check(CLI::IsMember({"lm-mini", "lm-small"}));
  trn->add_option("--positions", o.positions, "sinusoidal, learned, rope, alibi, relative")
      ->check(CLI::IsMember({"sinusoidal", "learned", "rope", "alibi", "relative"}));
  trn->add_option("--context", o.context, "training context in tokens (default: the preset's)")->check(CLI::Range(1, 1 << 16));
  trn->add_option("--batch-rows", o.batch_rows, "windows per batch")->check(CLI::Range(1, 4096));
  auto* steps = trn->add_option("--steps", o.loop.steps, "training steps")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  auto* minutes = trn->add_option("--minutes", o.loop.minutes, "training time budget")->check(CLI::Range(0.01, 1e6));
  trn->add_option("--warmup", o.loop.warmup, "Noam warmup steps")->check(CLI::Range(1, 1 << 30));
  trn->add_option("--lr-factor", o.loop.lr_factor, "Noam factor")->check(CLI::Range(1e-6, 1e3));
  trn->add_option("--dropout", o.dropout, "dropout")->check(CLI::Range(0.0, 0.99));
  trn->add_option("--valid-every", o.loop.valid_every, "validate and checkpoint every N steps")->check(CLI::Range(1, 1 << 30));
  trn->add_option("--patience", o.loop.patience, "early stopping after N validations without a better bpc (0: off)")
      ->check(CLI::Range(0, 1 << 20));
  trn->add_option("--min-delta", o.loop.min_delta, "early stopping: an improvement of the bpc must exceed this")
      ->check(CLI::NonNegativeNumber);
  trn->add_option("--seed", o.loop.seed, "seed for initialisation, dropout, batch order and the split")
      ->check(cli::seed_range());
  trn->add_flag("--resume", o.loop.resume, "continue the run in --out exactly where it stopped");
  cli::add_detect_anomaly(trn);
  steps->excludes(minutes);

  auto* gen = app.add_subcommand("generate", "continue a prompt");
  std::string g_run, g_prompt;
  models::DecodeOptions g;
  g.max_len = 200;
  gen->add_option("--run", g_run, "run directory")->required();
  gen->add_option("--prompt", g_prompt, "text to continue (may be empty)");
  gen->add_option("--max-new", g.max_len, "new tokens (bytes) at most")->check(CLI::Range(1, 1 << 20));
  gen->add_option("--beam", g.beam, "beam size (1: greedy)")->check(CLI::Range(1, 64));
  gen->add_flag("--sample", g.sample, "sample instead of greedy/beam");
  gen->add_option("--temperature", g.sampling.temperature, "sampling temperature (> 0)");
  gen->add_option("--top-k", g.sampling.top_k, "sample among the k most likely tokens (0: all)");
  gen->add_option("--top-p", g.sampling.top_p, "nucleus probability, in (0, 1]");
  gen->add_option("--seed", g.seed, "sampling seed")
      ->check(cli::seed_range());

  auto* ev = app.add_subcommand("evaluate", "validation loss, perplexity and bits per character");
  std::string e_run;
  int64_t e_context = 0;
  ev->add_option("--run", e_run, "run directory")->required();
  ev->add_option("--context", e_context, "window in tokens (default: the training context)")->check(CLI::Range(1, 1 << 16));

  cli::add_precision(trn);
  cli::add_precision(gen);
  cli::add_precision(ev);
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  PrecisionGuard precision(cli::precision_choice());
  try {
    if (*trn) {
      if (o.loop.steps <= 0 && o.loop.minutes <= 0) throw std::runtime_error("train: give --steps N or --minutes M");
      if (o.text.empty() && !o.loop.resume) o.text = default_text();
      lm::TrainResult r = lm::train(o);
      std::printf("trained steps %lld..%lld in %.1f s (%.0f tokens/s)%s\n", (long long)r.loop.first_step,
                  (long long)r.loop.last_step, r.loop.train_seconds, r.loop.tokens_per_s,
                  r.loop.stopped_early ? ", stopped early" : "");
      print_metrics("valid", r.valid, r.context);
      return 0;
    }
    if (*gen) {
      models::check_decode_options(g);
      lm::LoadedRun run = lm::load_run(g_run);
      std::vector<int64_t> prompt{lm::kBOS};
      for (int64_t t : lm::encode(g_prompt)) prompt.push_back(t);
      auto out = models::generate(*run.model, {prompt}, lm::kEOS, g);
      std::cout << g_prompt << lm::decode(out[0]) << std::endl;
      return 0;
    }
    if (*ev) {
      lm::LoadedRun run = lm::load_run(e_run);
      std::vector<std::string> train_docs, valid_docs;
      lm::split_documents(lm::read_documents(run.text), 20, run.seed, train_docs, valid_docs);
      const int64_t ctx = e_context > 0 ? e_context : run.context;
      print_metrics("valid", lm::evaluate(*run.model, lm::token_stream(valid_docs), ctx), ctx);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "lm: " << cli::error_line(e) << '\n';
    return 2;
  }
  return 0;
}
