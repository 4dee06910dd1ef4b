// classify: an encoder-only Transformer classifier (bytes plus hashed byte n-grams, masked mean
// pooling), or a pretrained BERT-family encoder with a linear head (--init-from, pretrained.h).
//   classify prepare --out data/langid            (language identification from Debian's fortunes)
//   classify prepare --task topics --out data/topics   (a fortune's topic file from its text)
//   classify train --data data/langid --out runs/langid [--minutes 3] [--positions rope]
//   classify train --data data/topics --out runs/ft --init-from build/pretrained/all-MiniLM-L6-v2
//   [--freeze] classify evaluate --run runs/langid --data data/langid/test.tsv [--confusion cm.png]
//   echo "Das ist ein Satz." | classify predict --run runs/langid
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "examples/classify/classify.h"
#include "examples/classify/naive_bayes.h"
#include "examples/classify/pretrained.h"
#include "examples/common/cli.h"
#include "examples/common/finite.h"
#include "examples/common/lines.h"
#include "examples/common/plot.h"
#include "graft/nn/train/checkpoint.h"

using namespace graft;

namespace {

void confusion_png(const std::string& path, const classify::Metrics& m,
                   const std::vector<std::string>& labels) {
  std::vector<std::vector<double>> rows;
  for (auto& r : m.confusion) {
    double n = 0;
    for (int64_t v : r) n += (double)v;
    std::vector<double> f;
    for (int64_t v : r) f.push_back(n > 0 ? (double)v / n : 0.0);
    rows.push_back(f);
  }
  plot::heatmap(path, rows, labels, labels,
                "confusion matrix (rows: true label, columns: predicted; row-normalised)");
}

int cmd_prepare(const std::string& task, const std::string& out, const std::string& fortunes,
                int64_t per_language, uint64_t seed) {
  for (const char* split : {"/train.tsv", "/valid.tsv", "/test.tsv"})
    train::check_output_path("prepare --out", out + split, {});
  auto s = task == "topics" ? classify::build_topics(fortunes, seed)
                            : classify::build_langid(fortunes, per_language, seed);
  std::filesystem::create_directories(out);
  classify::write_tsv(out + "/train.tsv", s.train);
  classify::write_tsv(out + "/valid.tsv", s.valid);
  classify::write_tsv(out + "/test.tsv", s.test);
  std::printf("wrote %zu / %zu / %zu examples to %s/{train,valid,test}.tsv\n", s.train.size(),
              s.valid.size(), s.test.size(), out.c_str());
  return 0;
}

int cmd_train(const classify::TrainOptions& o) {
  if (o.loop.steps <= 0 && o.loop.minutes <= 0)
    throw std::runtime_error("train: give --steps N or --minutes M");
  auto r = classify::train(o);
  if (train::world_communicator().rank() != 0) return 0;  // under mpirun rank 0 reports
  std::printf(
      "trained steps %lld..%lld in %.1f s%s; best validated weights: valid accuracy %.2f%%, "
      "macro-F1 %.4f\n",
      (long long)r.loop.first_step, (long long)r.loop.last_step, r.loop.train_seconds,
      r.loop.stopped_early ? " (stopped early)" : "",
      100 * cli::check_finite("train: the valid accuracy", r.valid.accuracy),
      cli::check_finite("train: the valid macro-F1", r.valid.macro_f1));
  return 0;
}

// What evaluate reads, which --confusion must not name: the run's files (both families: the
// pretrained one keeps its tokenizer in run/tokenizer/), --data and --baseline-train.
std::vector<train::NamedInput> run_inputs(const std::string& run_dir, const std::string& data,
                                          const std::string& baseline_train) {
  std::vector<train::NamedInput> in = {{data, "--data"}, {baseline_train, "--baseline-train"}};
  for (const char* f :
       {"config.json", "model.safetensors", "train_state.safetensors", "metrics.csv", "train.tsv"})
    in.push_back({run_dir + "/" + f, std::string("the run's ") + f});
  for (const std::string& f : classify::tokenizer_files())
    in.push_back({run_dir + "/tokenizer/" + f, "the run's tokenizer/" + f});
  return in;
}

// The model's scores, then the Naive Bayes baseline's on the same data, trained on the run's
// train.tsv (or `baseline_train`).
int cmd_evaluate(const std::string& run_dir, const std::string& data, const std::string& png_path,
                 std::string baseline_train) {
  const std::string png = png_path.empty() ? run_dir + "/confusion.png" : png_path;
  train::check_output_path("--confusion", png, run_inputs(run_dir, data, baseline_train));
  auto run = classify::load_run(run_dir);
  const std::vector<classify::Example> examples = classify::read_tsv(data);
  auto m = classify::evaluate(run, examples);
  std::printf("%s: %lld examples, accuracy %.2f%%, macro-F1 %.4f\n", data.c_str(), (long long)m.n,
              100 * cli::check_finite("evaluate: the accuracy", m.accuracy),
              cli::check_finite("evaluate: the macro-F1", m.macro_f1));
  confusion_png(png, m, run.labels);
  std::printf("confusion matrix: %s\n", png.c_str());
  // The run's own train.tsv may have moved since (its path is relative to where training ran):
  // then the baseline is skipped with a note; a --baseline-train that cannot be read is an error.
  const std::string recorded = run.data_dir.empty() ? "" : run.data_dir + "/train.tsv";
  const std::string train = baseline_train.empty() ? recorded : baseline_train;
  if (train.empty() || (baseline_train.empty() && !std::filesystem::is_regular_file(train))) {
    std::printf("baseline: skipped (%s; give --baseline-train FILE)\n",
                train.empty() ? "the run does not record its data directory"
                              : ("no file '" + train + "'").c_str());
    return 0;
  }
  const auto b = classify::evaluate(classify::NaiveBayes(classify::read_tsv(train), run.labels),
                                    run.labels, examples);
  std::printf("baseline (%s, trained on %s): accuracy %.2f%%, macro-F1 %.4f\n",
              classify::kBaselineName, train.c_str(),
              100 * cli::check_finite("evaluate: the baseline's accuracy", b.accuracy),
              cli::check_finite("evaluate: the baseline's macro-F1", b.macro_f1));
  return 0;
}

// Stdin line by line, each printed as soon as it is classified; a line over the cap (read no
// further than that) is an empty output line in its place, counted on stderr at the end.
int cmd_predict(const std::string& run_dir) {
  auto run = classify::load_run(run_dir);
  size_t overlong = 0;
  auto classify_chunk = [&](const std::vector<text::CappedLine>& lines, size_t before) {
    for (size_t i = 0; i < lines.size(); ++i) {
      overlong += lines[i].too_long;
      std::vector<std::pair<std::string, double>> r;
      try {
        r = classify::predict(run, {lines[i].text});
      } catch (const Error& e) {
        fail("stdin line " + std::to_string(before + i + 1) + ": " + e.what());
      }
      const auto& [label, p] = r.at(0);
      if (label.empty()) std::printf("\n");
      else std::printf("%s\t%.4f\n", label.c_str(), p);
    }
    std::fflush(stdout);
  };
  text::for_each_chunk(stdin, classify::kMaxLineBytes, 256, "predict: standard input",
                       classify_chunk);
  if (overlong)
    std::fprintf(stderr,
                 "classify: %zu input line(s) over %zu bytes were not classified (empty output "
                 "lines)\n",
                 overlong, classify::kMaxLineBytes);
  return 0;
}

// Each subcommand: its options (kept alive by the closure that runs it) and its CLI.

cli::Command add_prepare(CLI::App& app) {
  struct Args {
    std::string task = "langid", out, fortunes = "/usr/share/games/fortunes";
    int64_t per_language = 3000;
    uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("prepare", "write a task's TSVs from Debian's fortunes");
  sub->add_option("--task", a->task,
                  "langid (the language of a line, eight fortunes packages) or topics (the English "
                  "topic file of a "
                  "fortune: art, computers, food, law, literature, love, medicine, politics, "
                  "science, sports)")
      ->check(CLI::IsMember({"langid", "topics"}));
  sub->add_option("--out", a->out, "output directory")->required();
  sub->add_option("--fortunes", a->fortunes, "fortunes directory");
  sub->add_option("--per-language", a->per_language, "langid: lines per language at most")
      ->check(CLI::Range(int64_t(10), int64_t(1) << 30));
  sub->add_option("--seed", a->seed, "split seed")->check(cli::seed_range());
  return {sub, [a] { return cmd_prepare(a->task, a->out, a->fortunes, a->per_language, a->seed); }};
}

// With --init-from, the options not given take a fine-tuning recipe's values: AdamW (weight decay
// 0.01), batches of 32, head dropout 0.1, lr 5e-5 with warmup and cosine decay (constant under
// --minutes); --freeze trains a linear head alone: lr 1e-3.
void pretrained_defaults(const CLI::App* sub, classify::TrainOptions& o) {
  auto unset = [&](const char* flag) { return sub->count(flag) == 0; };
  if (unset("--batch-rows")) o.batch_rows = 32;
  if (unset("--dropout")) o.dropout = 0.1;
  if (unset("--optimizer")) o.loop.optimizer = "adamw";
  if (unset("--weight-decay")) o.loop.weight_decay = 0.01;
  if (unset("--schedule")) o.loop.schedule = o.loop.steps > 0 ? "cosine" : "constant";
  if (unset("--lr")) o.loop.lr = o.freeze ? 1e-3 : 5e-5;
  if (unset("--valid-every")) o.loop.valid_every = 100;
  if (unset("--log-every")) o.loop.log_every = 10;
}

cli::Command add_train(CLI::App& app) {
  auto o = std::make_shared<classify::TrainOptions>();
  auto* sub = app.add_subcommand("train", "train (or --resume) a classifier into a run directory");
  sub->add_option("--data", o->data_dir, "directory with train.tsv and valid.tsv")->required();
  sub->add_option("--out", o->loop.run_dir, "run directory")->required();
  sub->add_option("--positions", o->positions, "sinusoidal, learned, rope, alibi, relative")
      ->check(CLI::IsMember({"sinusoidal", "learned", "rope", "alibi", "relative"}));
  sub->add_option("--d-model", o->d_model, "model width")->check(CLI::Range(4, 4096));
  sub->add_option("--heads", o->heads, "attention heads")->check(CLI::Range(1, 64));
  sub->add_option("--layers", o->layers, "encoder layers")->check(CLI::Range(1, 64));
  sub->add_option("--d-ff", o->d_ff, "feed-forward width")->check(CLI::Range(4, 65536));
  sub->add_option("--dropout", o->dropout,
                  "dropout (default 0.3; with --init-from the head's, default 0.1)")
      ->check(cli::range(0.0, 1.0));
  sub->add_option("--max-bytes", o->max_bytes,
                  "byte model: texts are cut to this many bytes (its input length)")
      ->check(CLI::Range(int64_t(8), int64_t(1) << 16));
  sub->add_option("--init-from", o->init_from,
                  "a pretrained sentence-transformers / Hugging Face BERT directory: fine-tune its "
                  "encoder with a "
                  "linear head (the byte-model options do not apply)");
  sub->add_flag("--freeze", o->freeze,
                "with --init-from: keep the encoder frozen and train the head alone on embeddings "
                "computed once "
                "(logistic regression on the sentence embeddings)");
  sub->add_option("--ngram-buckets", o->ngram_buckets,
                  "hashed byte n-gram inputs: rows of their embedding table (default 262144; 0: "
                  "bytes alone)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  sub->add_option("--ngram-max", o->ngram_max, "the longest hashed n-gram, in bytes (default 5)")
      ->check(CLI::Range(2, 8));
  sub->add_option("--batch-rows", o->batch_rows,
                  "texts per batch (default 512; with --init-from 32)")
      ->check(CLI::Range(1, 4096));
  cli::add_loop_options(sub, o->loop, 200, "macro-F1", "initialisation, dropout and batch order");
  cli::add_precision(sub);
  return {sub, [o, sub] {
            if (!o->init_from.empty()) pretrained_defaults(sub, *o);
            cli::set_auto_warmup(sub, o->loop.warmup, o->loop.steps, 200);
            return cmd_train(*o);
          }};
}

cli::Command add_evaluate(CLI::App& app) {
  struct Args {
    std::string run, data, png, baseline_train;
  };
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("evaluate", "accuracy, macro-F1 and a confusion-matrix PNG");
  sub->add_option("--run", a->run, "run directory")->required();
  sub->add_option("--data", a->data, "label<TAB>text file")->required();
  sub->add_option("--confusion", a->png, "confusion-matrix PNG (default: <run>/confusion.png)");
  sub->add_option(
      "--baseline-train", a->baseline_train,
      "train the Naive Bayes baseline on this label<TAB>text file (default: the run's train.tsv)");
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [a] { return cmd_evaluate(a->run, a->data, a->png, a->baseline_train); }};
}

cli::Command add_predict(CLI::App& app) {
  auto run = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("predict", "label and probability of each stdin line");
  sub->add_option("--run", *run, "run directory")->required();
  cli::add_precision(sub, cli::PrecisionUse::inference);
  return {sub, [run] { return cmd_predict(*run); }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "graft encoder classifier: prepare data, train, evaluate, predict (labels<TAB>text TSV)"};
  app.require_subcommand(1);
  cli::show_defaults(app);
  const std::vector<cli::Command> commands = {add_prepare(app), add_train(app), add_evaluate(app),
                                              add_predict(app)};
  return cli::run_commands(app, commands, argc, argv);
}
