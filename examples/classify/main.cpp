// classify: an encoder-only Transformer classifier (byte-level, masked mean pooling).
//   classify prepare --out data/langid            (language identification from Debian's fortunes)
//   classify train --data data/langid --out runs/langid [--minutes 3] [--positions rope]
//   classify evaluate --run runs/langid --data data/langid/test.tsv [--confusion cm.png]
//   echo "Das ist ein Satz." | classify predict --run runs/langid
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "examples/classify/classify.h"
#include "examples/common/cli.h"
#include "examples/common/plot.h"

using namespace graft;

namespace {

void confusion_png(const std::string& path, const classify::Metrics& m, const std::vector<std::string>& labels) {
  std::vector<std::vector<double>> rows;
  for (auto& r : m.confusion) {
    double n = 0;
    for (int64_t v : r) n += (double)v;
    std::vector<double> f;
    for (int64_t v : r) f.push_back(n > 0 ? (double)v / n : 0.0);
    rows.push_back(f);
  }
  plot::heatmap(path, rows, labels, labels, "confusion matrix (rows: true label, columns: predicted; row-normalised)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"graft encoder classifier: prepare data, train, evaluate, predict (labels<TAB>text TSV)"};
  app.require_subcommand(1);

  auto* prep = app.add_subcommand("prepare", "write the language-identification TSVs from Debian's fortunes");
  std::string p_out, p_dir = "/usr/share/games/fortunes";
  int64_t p_per = 3000;
  uint64_t p_seed = 1;
  prep->add_option("--out", p_out, "output directory")->required();
  prep->add_option("--fortunes", p_dir, "fortunes directory");
  prep->add_option("--per-language", p_per, "lines per language at most")->check(CLI::Range(int64_t(10), int64_t(1) << 30));
  prep->add_option("--seed", p_seed, "split seed")
      ->check(cli::seed_range());

  auto* trn = app.add_subcommand("train", "train (or --resume) a classifier into a run directory");
  classify::TrainOptions o;
  trn->add_option("--data", o.data_dir, "directory with train.tsv and valid.tsv")->required();
  trn->add_option("--out", o.loop.run_dir, "run directory")->required();
  trn->add_option("--positions", o.positions, "sinusoidal, learned, rope, alibi, relative")
      ->check(CLI::IsMember({"sinusoidal", "learned", "rope", "alibi", "relative"}));
  trn->add_option("--d-model", o.d_model, "model width")->check(CLI::Range(4, 4096));
  trn->add_option("--heads", o.heads, "attention heads")->check(CLI::Range(1, 64));
  trn->add_option("--layers", o.layers, "encoder layers")->check(CLI::Range(1, 64));
  trn->add_option("--batch-rows", o.batch_rows, "texts per batch")->check(CLI::Range(1, 4096));
  auto* steps = trn->add_option("--steps", o.loop.steps, "training steps")->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  auto* minutes = trn->add_option("--minutes", o.loop.minutes, "training time budget")->check(CLI::Range(0.01, 1e6));
  trn->add_option("--warmup", o.loop.warmup, "Noam warmup steps")->check(CLI::Range(1, 1 << 30));
  trn->add_option("--valid-every", o.loop.valid_every, "validate and checkpoint every N steps")->check(CLI::Range(1, 1 << 30));
  trn->add_option("--patience", o.loop.patience, "early stopping after N validations without a better macro-F1")
      ->check(CLI::Range(0, 1 << 20));
  trn->add_option("--min-delta", o.loop.min_delta, "early stopping: an improvement of the macro-F1 must exceed this")
      ->check(CLI::NonNegativeNumber);
  trn->add_option("--seed", o.loop.seed, "seed")
      ->check(cli::seed_range());
  trn->add_flag("--resume", o.loop.resume, "continue the run in --out exactly where it stopped");
  cli::add_detect_anomaly(trn);
  steps->excludes(minutes);

  auto* ev = app.add_subcommand("evaluate", "accuracy, macro-F1 and a confusion-matrix PNG");
  std::string e_run, e_data, e_png;
  ev->add_option("--run", e_run, "run directory")->required();
  ev->add_option("--data", e_data, "label<TAB>text file")->required();
  ev->add_option("--confusion", e_png, "confusion-matrix PNG (default: <run>/confusion.png)");

  auto* pr = app.add_subcommand("predict", "label and probability of each stdin line");
  std::string r_run;
  pr->add_option("--run", r_run, "run directory")->required();

  cli::add_precision(trn);
  cli::add_precision(ev);
  cli::add_precision(pr);
  if (const int rc = cli::parse(app, argc, argv); rc >= 0) return rc;
  PrecisionGuard precision(cli::precision_choice());
  try {
    if (*prep) {
      auto s = classify::build_langid(p_dir, p_per, p_seed);
      std::filesystem::create_directories(p_out);
      classify::write_tsv(p_out + "/train.tsv", s.train);
      classify::write_tsv(p_out + "/valid.tsv", s.valid);
      classify::write_tsv(p_out + "/test.tsv", s.test);
      std::printf("wrote %zu / %zu / %zu examples to %s/{train,valid,test}.tsv\n", s.train.size(), s.valid.size(),
                  s.test.size(), p_out.c_str());
      return 0;
    }
    if (*trn) {
      if (o.loop.steps <= 0 && o.loop.minutes <= 0) throw std::runtime_error("train: give --steps N or --minutes M");
      auto r = classify::train(o);
      std::printf("trained steps %lld..%lld in %.1f s%s; valid accuracy %.2f%%, macro-F1 %.4f\n",
                  (long long)r.loop.first_step, (long long)r.loop.last_step, r.loop.train_seconds,
                  r.loop.stopped_early ? " (stopped early)" : "", 100 * r.valid.accuracy, r.valid.macro_f1);
      return 0;
    }
    if (*ev) {
      auto run = classify::load_run(e_run);
      auto m = classify::evaluate(*run.model, run.labels, classify::read_tsv(e_data));
      std::printf("%s: %lld examples, accuracy %.2f%%, macro-F1 %.4f\n", e_data.c_str(), (long long)m.n,
                  100 * m.accuracy, m.macro_f1);
      const std::string png = e_png.empty() ? e_run + "/confusion.png" : e_png;
      confusion_png(png, m, run.labels);
      std::printf("confusion matrix: %s\n", png.c_str());
      return 0;
    }
    if (*pr) {
      auto run = classify::load_run(r_run);
      std::vector<std::string> lines;
      for (std::string line; std::getline(std::cin, line);) lines.push_back(line);
      for (auto& [label, p] : classify::predict(*run.model, run.labels, lines))
        if (label.empty()) std::printf("\n");
        else std::printf("%s\t%.4f\n", label.c_str(), p);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "classify: " << cli::error_line(e) << '\n';
    return 2;
  }
  return 0;
}
