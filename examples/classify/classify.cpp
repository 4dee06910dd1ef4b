#include "examples/classify/classify.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <unordered_set>

#include "examples/classify/naive_bayes.h"
#include "examples/classify/pretrained.h"
#include "examples/common/curves.h"
#include "examples/common/finite.h"
#include "examples/common/lines.h"
#include "examples/common/train_task.h"
#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/run.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/ops/ops.h"

namespace graft::classify {

namespace fs = std::filesystem;

std::string cut_utf8(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  size_t k = n;
  while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) --k;
  return s.substr(0, k);
}

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// A fortune file's fortunes (separated by lines holding only "%"), each as its cleaned lines:
// control characters (the overstrike backspaces of old fortune files, tabs) dropped.
std::vector<std::vector<std::string>> fortunes_of(const std::string& path) {
  text::check_input_file("prepare", path);
  std::ifstream in(path, std::ios::binary);
  in.exceptions(std::ios::badbit);  // a bad_alloc in getline throws instead of ending the loop
  std::vector<std::vector<std::string>> out(1);
  for (std::string line; std::getline(in, line);) {
    if (line == "%" || line == "%\r") {
      out.emplace_back();
      continue;
    }
    std::string clean;
    for (char c : line)
      if ((unsigned char)c >= 0x20 && c != 0x7F) clean.push_back(c);
    clean = trim(clean);
    if (!clean.empty() && text::valid_utf8(clean)) out.back().push_back(clean);
  }
  return out;
}

// The files of each language: each fortune file once, its ".u8" version when the package ships
// a non-empty one (de, es, cs, ... convert legacy encodings there; pl ships UTF-8 originals and
// empty ".u8" files). Lines that are not UTF-8 are dropped by fortunes_of.
std::vector<std::pair<std::string, std::vector<std::string>>> langid_sources(
    const std::string& dir) {
  auto files_in = [&](const std::string& sub) {
    if (!fs::is_directory(dir + "/" + sub))
      fail("'" + dir + "/" + sub + "' is missing (apt-get install fortunes-" + sub + ")");
    std::vector<std::string> f;
    for (auto& e : fs::directory_iterator(dir + "/" + sub)) {
      const fs::path p = e.path();
      if (p.extension() == ".dat" || p.extension() == ".u8" || !fs::is_regular_file(p)) continue;
      const fs::path u8 = p.string() + ".u8";
      f.push_back(fs::exists(u8) && fs::file_size(u8) > 0 ? u8.string() : p.string());
    }
    std::sort(f.begin(), f.end());
    return f;
  };
  std::vector<std::string> en;
  for (const char* f :
       {"fortunes", "literature", "wisdom", "people", "humorists", "science", "work"})
    en.push_back(dir + "/" + f);
  return {{"en", en},
          {"de", files_in("de")},
          {"es", files_in("es")},
          {"it", files_in("it")},
          {"pt", {dir + "/brasil"}},
          {"pl", files_in("pl")},
          {"cs", files_in("cs")},
          {"ga", files_in("ga")}};
}

// Batches of up to `rows` texts (each cut to max_bytes) padded with PAD to the longest; texts
// sorted by length first.
struct Batch {
  Tensor ids, labels;
  int64_t tokens = 0;
};
std::vector<Batch> make_batches(const std::vector<Example>& data,
                                const std::vector<std::string>& labels, int64_t rows,
                                int64_t max_bytes) {
  std::vector<std::string> texts;
  texts.reserve(data.size());
  for (const Example& e : data) texts.push_back(cut_utf8(e.text, (size_t)max_bytes));
  std::vector<size_t> order(data.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return texts[a].size() < texts[b].size(); });
  const LabelIndex label_index(labels);
  std::vector<Batch> out;
  for (size_t b0 = 0; b0 < order.size(); b0 += (size_t)rows) {
    const size_t b1 = std::min(order.size(), b0 + (size_t)rows);
    size_t T = 1;
    for (size_t k = b0; k < b1; ++k) T = std::max(T, texts[order[k]].size());
    std::vector<int64_t> ids((b1 - b0) * T, kPAD), lab;
    Batch b;
    for (size_t k = b0; k < b1; ++k) {
      const std::string& t = texts[order[k]];
      for (size_t i = 0; i < t.size(); ++i) ids[(k - b0) * T + i] = (unsigned char)t[i];
      lab.push_back(label_index(data[order[k]].label));
      b.tokens += (int64_t)t.size();
    }
    b.ids = from_vector(ids, {(int64_t)(b1 - b0), (int64_t)T});
    b.labels = from_vector(lab, {(int64_t)lab.size()});
    out.push_back(b);
  }
  return out;
}

}  // namespace

std::vector<std::string> labels_of(const std::vector<Example>& data, const std::string& where) {
  std::unordered_set<std::string> seen;
  for (const Example& e : data)
    if (seen.insert(e.label).second && seen.size() > kMaxLabels)
      fail("'" + where + "' has more than " + std::to_string(kMaxLabels) +
           " distinct labels, the most a run may have");
  std::vector<std::string> labels(seen.begin(), seen.end());
  std::sort(labels.begin(), labels.end());
  return labels;
}

LabelIndex::LabelIndex(const std::vector<std::string>& labels) {
  index_.reserve(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) index_.emplace(labels[i], (int64_t)i);
}

int64_t LabelIndex::operator()(const std::string& l) const {
  const auto it = index_.find(l);
  if (it == index_.end())
    fail("label '" + text::printable(l) + "' is not one of the model's labels");
  return it->second;
}

Metrics metrics_of(std::vector<std::vector<int64_t>> confusion) {
  const int64_t C = (int64_t)confusion.size();
  Metrics r;
  r.confusion = std::move(confusion);
  double f1 = 0;
  int64_t correct = 0;
  for (int64_t c = 0; c < C; ++c) {
    int64_t tp = r.confusion[c][c], fp = 0, fn = 0;
    for (int64_t o = 0; o < C; ++o)
      if (o != c) fp += r.confusion[o][c], fn += r.confusion[c][o];
    correct += tp;
    r.n += tp + fn;
    f1 += tp == 0 ? 0.0 : 2.0 * tp / (double)(2 * tp + fp + fn);
  }
  if (r.n == 0) fail("no examples to evaluate");
  r.accuracy = (double)correct / (double)r.n;
  r.macro_f1 = f1 / (double)C;
  return r;
}

std::vector<Example> read_tsv(const std::string& path) {
  text::check_input_file("", path);  // not /dev/zero, not over 1 GiB
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) fail("cannot read '" + path + "': " + std::strerror(errno));
  std::vector<Example> out;
  int64_t no = 0;
  text::LineReader reader(f.get(), kMaxLineBytes);
  bool too_long = false;
  for (std::string line; reader.next(line, too_long, "error reading '" + path + "'");) {
    ++no;
    const std::string where = "'" + path + "' line " + std::to_string(no);
    if (too_long) fail(where + ": longer than " + std::to_string(kMaxLineBytes) + " bytes");
    if (!text::valid_utf8(line)) fail(where + ": not UTF-8 text");
    if (trim(line).empty()) continue;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || line.find('\t', tab + 1) != std::string::npos)
      fail(where + ": expected label<TAB>text");
    Example e{trim(line.substr(0, tab)), trim(line.substr(tab + 1))};
    if (e.label.empty() || e.text.empty()) fail(where + ": empty label or text");
    out.push_back(std::move(e));
  }
  return out;
}

void write_tsv(const std::string& path, const std::vector<Example>& examples) {
  train::atomic_write(path, [&](std::ostream& os) {
    for (auto& e : examples) os << e.label << '\t' << e.text << '\n';
  });
}

Splits build_langid(const std::string& dir, int64_t per_language, uint64_t seed) {
  Splits s;
  Generator g(seed);
  for (auto& [lang, files] : langid_sources(dir)) {
    std::vector<std::vector<std::string>> fortunes;
    for (auto& f : files)
      for (auto& fo : fortunes_of(f))
        if (!fo.empty()) fortunes.push_back(fo);
    const std::vector<int64_t> order = train::shuffled_order((int64_t)fortunes.size(), g);
    int64_t taken = 0;
    for (size_t i = 0; i < order.size() && taken < per_language; ++i) {
      auto& split = i % 10 == 0 ? s.test : i % 10 == 1 ? s.valid : s.train;  // by fortune
      for (auto& line : fortunes[order[i]])
        if (line.size() >= 20 && line.size() <= (size_t)kMaxBytes && taken < per_language) {
          split.push_back({lang, line});
          ++taken;
        }
    }
  }
  return s;
}

const std::vector<std::string> kTopics = {"art",  "computers", "food",     "law",     "literature",
                                          "love", "medicine",  "politics", "science", "sports"};

Splits build_topics(const std::string& dir, uint64_t seed) {
  Splits s;
  Generator g(seed);
  std::unordered_set<std::string> seen;
  for (const std::string& topic : kTopics) {
    const std::string path = dir + "/" + topic + ".u8";
    if (!fs::is_regular_file(path)) fail("'" + path + "' is missing (apt-get install fortunes)");
    std::vector<std::string> texts;
    for (auto& lines : fortunes_of(path)) {
      std::string t;
      for (auto& line : lines) t += (t.empty() ? "" : " ") + line;
      if (!t.empty() && seen.insert(t).second) texts.push_back(t);
    }
    const std::vector<int64_t> order = train::shuffled_order((int64_t)texts.size(), g);
    for (size_t i = 0; i < order.size(); ++i)
      (i % 10 == 0 ? s.test : i % 10 == 1 ? s.valid : s.train).push_back({topic, texts[order[i]]});
  }
  return s;
}

std::vector<int64_t> encode(const std::string& text) {
  std::vector<int64_t> t;
  for (unsigned char c : text) t.push_back(c);
  return t;
}

Metrics evaluate(models::EncoderClassifier& m, const std::vector<std::string>& labels,
                 const std::vector<Example>& data) {
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  const size_t C = labels.size();
  std::vector<std::vector<int64_t>> confusion(C, std::vector<int64_t>(C, 0));
  size_t first = 0;  // the batch's first example, for the error
  for (const Batch& b : make_batches(data, labels, 64, m.cfg.max_len)) {
    // argmax turns NaN logits into some label: accuracy would look like a number.
    const Tensor logits =
        cli::check_finite("evaluate: the output for examples " + std::to_string(first + 1) + ".." +
                              std::to_string(first + (size_t)b.ids.size(0)),
                          m.forward(b.ids), &m, [&] { m.forward(b.ids); });
    first += (size_t)b.ids.size(0);
    const auto pred = argmax(logits, 1).to_vector<int64_t>();
    const auto gold = b.labels.to_vector<int64_t>();
    for (size_t i = 0; i < gold.size(); ++i) ++confusion[gold[i]][pred[i]];
  }
  return metrics_of(std::move(confusion));
}

std::vector<std::pair<std::string, double>> predict(models::EncoderClassifier& m,
                                                    const std::vector<std::string>& labels,
                                                    const std::vector<std::string>& texts) {
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  std::vector<std::pair<std::string, double>> out;
  for (const std::string& t0 : texts) {
    const std::string t = cut_utf8(trim(t0), (size_t)m.cfg.max_len);
    if (t.empty()) {
      out.emplace_back("", 0.0);
      continue;
    }
    const std::vector<int64_t> ids = encode(t);
    const Tensor x = from_vector(ids, {1, (int64_t)ids.size()});
    const Tensor logits =
        cli::check_finite("predict: the output for '" + text::printable(t, 60) + "'", m.forward(x),
                          &m, [&] { m.forward(x); });
    auto p = softmax(logits, 1).to_vector<double>();
    const int64_t best = std::max_element(p.begin(), p.end()) - p.begin();
    out.emplace_back(labels[best], p[best]);
  }
  return out;
}

namespace {

models::ClassifierConfig config_model(const nlohmann::json& j, const std::string& cfg_path) {
  models::ClassifierConfig c =
      models::ClassifierConfig::from_json(models::model_section(j, cfg_path, "resume"), cfg_path);
  models::check_config_memory(c, cfg_path);
  return c;
}

}  // namespace

std::vector<std::string> config_labels(const nlohmann::json& j, int64_t classes,
                                       const std::string& cfg_path) {
  std::vector<std::string> labels;
  try {
    labels = j.at("labels").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail("'" + cfg_path + "': field \"labels\" must be a list of strings (" +
         train::json_message(e) + ")");
  }
  if ((int64_t)labels.size() != classes)
    fail("'" + cfg_path + "': " + std::to_string(labels.size()) + " labels for " +
         std::to_string(classes) + " classes");
  if (labels.size() > kMaxLabels)
    fail("'" + cfg_path + "': field \"labels\" has " + std::to_string(labels.size()) +
         " labels, more than the " + std::to_string(kMaxLabels) + " a run may have");
  std::vector<std::string> sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    fail("'" + cfg_path + "': field \"labels\" names a label twice");
  return labels;
}

void apply_saved_schedule(const nlohmann::json& saved, const std::string& cfg_path,
                          train::LoopOptions& loop) {
  if (!saved.contains("train")) return;
  const std::string where = "resume: '" + cfg_path + "': \"train\" section";
  tasks::apply_saved_recipe(saved["train"], loop, where);
  train::check_loop_options(loop);
}

namespace {

// The run's model config and labels: from config.json on --resume (with the saved schedule put
// into `loop`), else from the options and the training labels (config.json written by rank 0).
models::ClassifierConfig run_config(const TrainOptions& o, const std::vector<Example>& train_set,
                                    std::vector<std::string>& labels, train::LoopOptions& loop) {
  const std::string cfg_path = o.loop.run_dir + "/config.json";
  models::ClassifierConfig c;
  if (o.loop.resume) {
    const nlohmann::json j = train::load_resume_config(o.loop.run_dir);
    c = config_model(j, cfg_path);
    labels = config_labels(j, c.classes, cfg_path);
    apply_saved_schedule(j, cfg_path, loop);
    return c;
  }
  labels = labels_of(train_set, o.data_dir + "/train.tsv");
  c.vocab = kVocab, c.pad_id = kPAD, c.classes = (int64_t)labels.size(), c.max_len = o.max_bytes;
  c.d_model = o.d_model, c.heads = o.heads, c.d_ff = o.d_ff, c.layers = o.layers;
  c.dropout = o.dropout, c.seed = o.loop.seed;
  c.ngram_buckets = o.ngram_buckets, c.ngram_max = o.ngram_max;
  c.positions.kind = nn::parse_positions(o.positions);
  models::check_config_memory(c, "train");
  // Under mpirun rank 0 alone writes the run's files; the others wait for them.
  train::on_rank0(train::world_communicator(), [&] {
    train::lock_run_until_exit(o.loop.run_dir);  // also creates it
    const nlohmann::json schedule = {{"recipe", train::loop_recipe(o.loop)}};
    train::save_json(
        cfg_path,
        {{"model", c.to_json()}, {"labels", labels}, {"data", o.data_dir}, {"train", schedule}});
  });
  return c;
}

}  // namespace

void set_classifier_reporting(train::TrainTask& task, const nn::Module& model,
                              const TrainOptions& o, const Metrics& baseline,
                              const std::vector<std::string>& tied) {
  task.metric_names = {"accuracy", "macro_f1"};
  task.stop_metric = "macro_f1";
  task.higher_is_better = true;
  tasks::save_best_and_draw(
      task, model, "graft-classifier", tied, [&o, baseline](const train::Validated& v) {
        if (!o.plot) return;
        plot::learning_curves(
            v.checkpoint.path("curves.png"), v.rows, "cross-entropy", {"accuracy", "macro_f1"},
            "validation",
            {"Naive Bayes", {{"accuracy", baseline.accuracy}, {"macro_f1", baseline.macro_f1}}});
      });
}

namespace {

// What train::train_loop needs: the sharded loss, validation, and the curves (with the baseline's
// lines) written at each validation. model.safetensors holds the best validated weights (by
// macro-F1; the validation accuracy of a class with few lines swings from one validation to the
// next), train_state.safetensors the latest.
train::TrainTask make_task(models::EncoderClassifier& model, const std::vector<Batch>& batches,
                           const std::vector<std::string>& labels,
                           const std::vector<Example>& valid_set, const TrainOptions& o,
                           const Metrics& baseline) {
  train::TrainTask task;
  tasks::set_row_batches(task, model, batches, &Batch::ids, &Batch::labels);
  task.validate = [&]() -> std::map<std::string, double> {
    const Metrics v = evaluate(model, labels, valid_set);
    return {{"accuracy", v.accuracy}, {"macro_f1", v.macro_f1}};
  };
  task.run_config = nlohmann::json{
      {"model", model.cfg.to_json()},
      {"labels", labels},
      {"batch_rows",
       o.batch_rows}}.dump();
  set_classifier_reporting(task, model, o, baseline, {o.loop.run_dir + "/config.json"});
  return task;
}

}  // namespace

namespace {

// Whether the run directory's config.json is a pretrained run's (for --resume).
bool is_pretrained_run(const std::string& run_dir) {
  const std::string cfg_path = run_dir + "/config.json";
  if (!fs::exists(cfg_path)) return false;
  const nlohmann::json j = train::load_json(cfg_path);
  return j.is_object() && j.contains("family") && j["family"] == "pretrained";
}

}  // namespace

TrainResult train(const TrainOptions& o) {
  if (!o.init_from.empty() || (o.loop.resume && is_pretrained_run(o.loop.run_dir)))
    return train_pretrained(o);
  if (o.freeze) fail("train: --freeze needs --init-from (a pretrained encoder to freeze)");
  train::check_loop_options(o.loop);  // before any data work
  const std::vector<Example> train_set = read_tsv(o.data_dir + "/train.tsv");
  const std::vector<Example> valid_set = read_tsv(o.data_dir + "/valid.tsv");
  if (train_set.empty() || valid_set.empty())
    fail("'" + o.data_dir + "' has an empty train.tsv or valid.tsv");
  std::vector<std::string> labels;
  train::LoopOptions lo = o.loop;
  const models::ClassifierConfig c = run_config(o, train_set, labels, lo);
  models::EncoderClassifier model(c);
  const std::vector<Batch> batches = make_batches(train_set, labels, o.batch_rows, c.max_len);
  const bool rank0 = train::world_communicator().rank() == 0;  // rank 0 alone reports
  TrainResult r;
  if (rank0)
    r.baseline_valid =
        evaluate(NaiveBayes(train_set, labels), labels, valid_set);  // for the curves
  if (!o.loop.quiet && rank0) {
    std::cerr << "classify: " << train_set.size() << " train / " << valid_set.size()
              << " valid texts, " << labels.size() << " labels, " << batches.size() << " batches, "
              << model.num_parameters() << " parameters (" << nn::positions_name(c.positions.kind)
              << ")\n";
    std::fprintf(stderr, "baseline (%s): valid accuracy %.2f%%, macro-F1 %.4f\n", kBaselineName,
                 100 * r.baseline_valid.accuracy, r.baseline_valid.macro_f1);
  }
  const train::TrainTask task = make_task(model, batches, labels, valid_set, o, r.baseline_valid);
  lo.d_model = c.d_model;
  r.loop = train::train_loop(task, lo);
  if (rank0)
    r.valid =
        evaluate(*load_run(o.loop.run_dir).model, labels, valid_set);  // the saved (best) weights
  return r;
}

LoadedRun load_run(const std::string& run_dir) {
  if (is_pretrained_run(run_dir)) {
    LoadedRun r;
    r.pretrained = std::make_shared<PretrainedRun>(load_pretrained_run(run_dir));
    const std::string cfg_path = run_dir + "/config.json";
    const nlohmann::json j = train::load_json(cfg_path);
    r.labels = config_labels(j, r.pretrained->model->cfg.classes, cfg_path);
    if (auto it = j.find("data"); it != j.end() && it->is_string()) r.data_dir = *it;
    return r;
  }
  auto loaded = models::load_run_model<models::EncoderClassifier>(run_dir);
  LoadedRun r;
  r.labels = config_labels(loaded.config, loaded.model->cfg.classes, run_dir + "/config.json");
  if (auto it = loaded.config.find("data"); it != loaded.config.end() && it->is_string())
    r.data_dir = *it;
  r.model = std::move(loaded.model);
  return r;
}

Metrics evaluate(const LoadedRun& run, const std::vector<Example>& data) {
  return run.pretrained ? evaluate(*run.pretrained, run.labels, data)
                        : evaluate(*run.model, run.labels, data);
}

std::vector<std::pair<std::string, double>> predict(const LoadedRun& run,
                                                    const std::vector<std::string>& texts) {
  return run.pretrained ? predict(*run.pretrained, run.labels, texts)
                        : predict(*run.model, run.labels, texts);
}

}  // namespace graft::classify
