#include "examples/classify/pretrained.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <tuple>

#include "examples/classify/naive_bayes.h"
#include "examples/common/curves.h"
#include "examples/common/finite.h"
#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/run.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/ops/ops.h"

namespace graft::classify {

namespace fs = std::filesystem;

// ---- config and model ----

const models::ConfigFields<PretrainedConfig>& PretrainedConfig::fields() {
  using C = PretrainedConfig;
  using models::member;
  static const models::ConfigFields<C> table = [] {
    models::ConfigFields<C> f = models::bert_fields<C>();
    const models::ConfigFields<C> more = {
        models::size_field<C>("classes", member(&C::classes), "output classes",
                              (int64_t)kMaxLabels),
        models::choice_field<C, models::Pooling>(
            "pooling", member(&C::pooling),
            {{models::Pooling::mean, "mean"}, {models::Pooling::cls, "cls"}}, "mean or [CLS]"),
        models::value_field<C>("normalize", member(&C::normalize), "L2-normalise the pooled"),
        models::probability_field<C>("head_dropout", member(&C::head_dropout), "on the pooled"),
        models::value_field<C>("max_seq_length", member(&C::max_seq_length), "ids per text")
            .and_check([](const C& c, const models::ConfigCheck& k) {
              k.range("max_seq_length", c.max_seq_length, 2, c.max_len);
            }),
    };
    f.insert(f.end(), more.begin(), more.end());
    return f;
  }();
  return table;
}

nlohmann::json PretrainedConfig::to_json() const { return write_fields(*this, fields()); }

PretrainedConfig PretrainedConfig::from_json(const nlohmann::json& j, const std::string& where) {
  PretrainedConfig c;
  models::read_fields(c, j, where, fields());
  c.validate(where);
  return c;
}

void PretrainedConfig::validate(const std::string& where) const {
  models::check_fields(*this, where, fields());
}

int64_t PretrainedConfig::parameter_count() const {
  return checked_add(BertConfig::parameter_count(),
                     checked_mul(d_model + 1, classes, "parameter count"), "parameter count");
}

PretrainedClassifier::PretrainedClassifier(const PretrainedConfig& c,
                                           std::shared_ptr<models::BertEncoder> enc)
    : cfg(c), dropout_gen(c.seed * 31 + 11) {
  c.validate("PretrainedClassifier");
  Generator gen(c.seed + 1);
  encoder =
      register_module("encoder", enc ? std::move(enc) : std::make_shared<models::BertEncoder>(c));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.head_dropout, &dropout_gen));
  head = register_module("head",
                         std::make_shared<nn::Linear>(c.d_model, c.classes, true, c.dtype, gen));
}

Tensor PretrainedClassifier::embed(const Tensor& ids, const Tensor& pad) const {
  return models::pool(encoder->forward(ids, pad), pad, cfg.pooling, cfg.normalize);
}

// A unit vector's components are about 1/sqrt(d): scaled by sqrt(d) they are about 1, the scale
// the head's initialisation and learning rate assume (unscaled, a fine-tuning learning rate
// moves the head's logits by about 1e-3 a step).
Tensor PretrainedClassifier::logits(const Tensor& embeddings) const {
  const Tensor e = cfg.normalize ? mul(embeddings, std::sqrt((double)cfg.d_model)) : embeddings;
  return head->forward(dropout->forward(e));
}

// ---- tokens and batches ----

const std::vector<std::string>& tokenizer_files() {
  static const std::vector<std::string> files{"tokenizer.json", "vocab.txt",
                                              "tokenizer_config.json", "special_tokens_map.json"};
  return files;
}

std::vector<std::string> tokenizer_files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& f : tokenizer_files())
    if (fs::is_regular_file(dir + "/" + f)) out.push_back(dir + "/" + f);
  return out;
}

namespace {

// A padded batch of token ids (models::pad_batch) with its labels.
struct TokenBatch {
  Tensor ids, pad, labels;
  int64_t tokens = 0;
};

// Batches of up to `rows` examples in `order`, each padded to its longest.
std::vector<TokenBatch> token_batches(const std::vector<std::vector<int64_t>>& ids,
                                      const std::vector<int64_t>& labels,
                                      const std::vector<size_t>& order, int64_t rows,
                                      int64_t pad_id) {
  std::vector<TokenBatch> out;
  for (size_t b0 = 0; b0 < order.size(); b0 += (size_t)rows) {
    const size_t b1 = std::min(order.size(), b0 + (size_t)rows);
    std::vector<std::vector<int64_t>> r;
    std::vector<int64_t> lab;
    TokenBatch b;
    for (size_t k = b0; k < b1; ++k) {
      r.push_back(ids[order[k]]);
      lab.push_back(labels[order[k]]);
      b.tokens += (int64_t)ids[order[k]].size();
    }
    std::tie(b.ids, b.pad) = models::pad_batch(r, pad_id);
    b.labels = from_vector(lab, {(int64_t)lab.size()});
    out.push_back(std::move(b));
  }
  return out;
}

// 0..n-1 sorted by the length of ids (stable): batches of similar lengths pad little.
std::vector<size_t> by_length(const std::vector<std::vector<int64_t>>& ids) {
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ids[a].size() < ids[b].size(); });
  return order;
}

std::vector<int64_t> label_ids(const std::vector<Example>& data,
                               const std::vector<std::string>& labels) {
  const LabelIndex index(labels);
  std::vector<int64_t> out;
  for (const Example& e : data) out.push_back(index(e.label));
  return out;
}

std::vector<std::string> texts_of(const std::vector<Example>& data) {
  std::vector<std::string> out;
  for (const Example& e : data) out.push_back(e.text);
  return out;
}

// The pooled embeddings of every text (N, d), row i for ids[i]; eval mode, no gradients.
Tensor embed_all(PretrainedClassifier& m, const std::vector<std::vector<int64_t>>& ids,
                 int64_t batch_rows) {
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  const int64_t d = m.cfg.d_model;
  std::vector<float> out(ids.size() * (size_t)d);
  const std::vector<size_t> order = by_length(ids);
  const std::vector<int64_t> no_labels(ids.size(), 0);
  size_t k = 0;
  for (const TokenBatch& b : token_batches(ids, no_labels, order, batch_rows, m.cfg.pad_id)) {
    const std::vector<float> e = to_dtype(m.embed(b.ids, b.pad), DType::f32).to_vector<float>();
    for (int64_t i = 0; i < b.ids.size(0); ++i, ++k)
      std::copy_n(e.begin() + i * d, d, out.begin() + order[k] * d);
  }
  return from_vector(out, {(int64_t)ids.size(), d});
}

Metrics confusion_of(const std::vector<std::vector<int64_t>>& confusion_in) {
  return metrics_of(confusion_in);
}

// Accuracy and macro-F1 of the classifier on tokenized examples.
Metrics evaluate_ids(PretrainedClassifier& m, size_t classes,
                     const std::vector<std::vector<int64_t>>& ids,
                     const std::vector<int64_t>& gold) {
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  std::vector<std::vector<int64_t>> confusion(classes, std::vector<int64_t>(classes, 0));
  for (const TokenBatch& b : token_batches(ids, gold, by_length(ids), 32, m.cfg.pad_id)) {
    // argmax turns NaN logits into some label: accuracy would look like a number.
    const Tensor logits =
        cli::check_finite("evaluate: the output for a batch", m.forward(b.ids, b.pad), &m,
                          [&] { m.forward(b.ids, b.pad); });
    const auto pred = argmax(logits, 1).to_vector<int64_t>();
    const auto g = b.labels.to_vector<int64_t>();
    for (size_t i = 0; i < g.size(); ++i) ++confusion[g[i]][pred[i]];
  }
  return confusion_of(confusion);
}

}  // namespace

Metrics evaluate(const PretrainedRun& run, const std::vector<std::string>& labels,
                 const std::vector<Example>& data) {
  const auto gold = label_ids(data, labels);  // an unknown label fails before any work
  return evaluate_ids(
      *run.model, labels.size(),
      models::tokenize_texts(*run.tokenizer, texts_of(data), run.model->cfg.max_seq_length), gold);
}

std::vector<std::pair<std::string, double>> predict(const PretrainedRun& run,
                                                    const std::vector<std::string>& labels,
                                                    const std::vector<std::string>& texts) {
  PretrainedClassifier& m = *run.model;
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  std::vector<std::pair<std::string, double>> out;
  for (const std::string& t0 : texts) {
    const size_t a = t0.find_first_not_of(" \t\r\n"), z = t0.find_last_not_of(" \t\r\n");
    const std::string t = a == std::string::npos ? std::string() : t0.substr(a, z - a + 1);
    if (t.empty()) {
      out.emplace_back("", 0.0);
      continue;
    }
    const std::vector<int64_t> ids = run.tokenizer->encode_with_specials(t, m.cfg.max_seq_length);
    const auto [x, pad] = models::pad_batch({ids}, m.cfg.pad_id);
    const Tensor logits =
        cli::check_finite("predict: the output for '" + text::printable(t, 60) + "'",
                          m.forward(x, pad), &m, [&] { m.forward(x, pad); });
    auto p = softmax(logits, 1).to_vector<double>();
    const int64_t best = std::max_element(p.begin(), p.end()) - p.begin();
    out.emplace_back(labels[best], p[best]);
  }
  return out;
}

PretrainedRun load_pretrained_run(const std::string& run_dir) {
  const std::string tok_dir = run_dir + "/tokenizer";
  const std::vector<std::string> tok_files = tokenizer_files_in(tok_dir);
  if (tok_files.empty()) fail("load_run: '" + tok_dir + "' has no tokenizer.json or vocab.txt");
  auto loaded = models::load_run_model<PretrainedClassifier>(run_dir, tok_files);
  PretrainedRun r;
  r.tokenizer = std::make_unique<text::WordPiece>(text::WordPiece::from_directory(tok_dir));
  if (r.tokenizer->size() != loaded.model->cfg.vocab)
    fail("load_run: '" + tok_dir + "': the tokenizer has " + std::to_string(r.tokenizer->size()) +
         " tokens, the model's vocab is " + std::to_string(loaded.model->cfg.vocab));
  r.model = std::move(loaded.model);
  return r;
}

// ---- training ----

namespace {

// What a pretrained run starts from: the model (encoder and head), its tokenizer, the labels,
// whether the encoder is frozen; config.json and tokenizer/ written on a fresh run.
struct Start {
  std::unique_ptr<PretrainedClassifier> model;
  std::unique_ptr<text::WordPiece> tokenizer;
  std::vector<std::string> labels;
  bool freeze = false;
};

Start start_fresh(const TrainOptions& o, const std::vector<Example>& train_set,
                  const train::LoopOptions& lo) {
  const std::string cfg_path = o.loop.run_dir + "/config.json";
  if (!fs::is_regular_file(o.init_from + "/config.json"))
    fail("train: --init-from '" + o.init_from +
         "' has no config.json (expected a sentence-transformers or Hugging Face "
         "BERT directory: config.json, model.safetensors, tokenizer.json or vocab.txt)");
  models::SentenceEncoder se(o.init_from);
  Start s;
  s.labels = labels_of(train_set, o.data_dir + "/train.tsv");
  s.freeze = o.freeze;
  PretrainedConfig c;
  static_cast<models::BertConfig&>(c) = se.model->cfg;
  c.classes = (int64_t)s.labels.size(), c.pooling = se.pooling, c.normalize = se.normalize;
  c.head_dropout = o.dropout, c.max_seq_length = se.max_seq_length, c.seed = o.loop.seed;
  s.tokenizer = std::make_unique<text::WordPiece>(se.tokenizer);
  s.model = std::make_unique<PretrainedClassifier>(
      c, std::shared_ptr<models::BertEncoder>(std::move(se.model)));
  train::on_rank0(train::world_communicator(), [&] {
    train::lock_run_until_exit(o.loop.run_dir);
    train::create_run_directory(o.loop.run_dir + "/tokenizer");
    for (const std::string& f : tokenizer_files_in(o.init_from))
      train::atomic_copy(f, o.loop.run_dir + "/tokenizer/" + fs::path(f).filename().string());
    const nlohmann::json schedule{{"recipe", train::loop_recipe(lo)}};
    train::save_json(cfg_path, {{"family", "pretrained"},
                                {"model", c.to_json()},
                                {"labels", s.labels},
                                {"data", o.data_dir},
                                {"init_from", o.init_from},
                                {"freeze", o.freeze},
                                {"batch_rows", o.batch_rows},
                                {"train", schedule}});
  });
  return s;
}

// --resume: the config, labels and schedule config.json saved, the tokenizer copied into the run;
// a frozen run's encoder from its model.safetensors (the train state holds the head alone), or
// from the directory it started from when no validation was saved yet.
Start start_resumed(TrainOptions& o, train::LoopOptions& lo) {
  const std::string cfg_path = o.loop.run_dir + "/config.json";
  const nlohmann::json j = train::load_resume_config(o.loop.run_dir);
  const PretrainedConfig c =
      PretrainedConfig::from_json(models::model_section(j, cfg_path, "resume"), cfg_path);
  Start s;
  s.labels = config_labels(j, c.classes, cfg_path);
  apply_saved_schedule(j, cfg_path, lo);
  s.freeze = train::json_field<bool>(j, "freeze", "resume: '" + cfg_path + "'");
  o.batch_rows = train::json_field<int64_t>(j, "batch_rows", "resume: '" + cfg_path + "'");
  s.tokenizer = std::make_unique<text::WordPiece>(
      text::WordPiece::from_directory(o.loop.run_dir + "/tokenizer"));
  s.model = std::make_unique<PretrainedClassifier>(c);
  if (s.freeze) {
    if (fs::exists(o.loop.run_dir + "/model.safetensors")) {
      s.model->load_state_dict(load_pretrained_run(o.loop.run_dir).model->state_dict());
    } else {
      const std::string from =
          train::json_field<std::string>(j, "init_from", "resume: '" + cfg_path + "'");
      std::shared_ptr<models::BertEncoder> enc = models::load_hf_bert(from);
      s.model->encoder->load_state_dict(enc->state_dict());
    }
  }
  return s;
}

// The parts of the train task that both ways of training share: the run config, and what every
// classifier reports (set_classifier_reporting: model.safetensors holds the whole classifier,
// encoder included).
void common_task(train::TrainTask& task, PretrainedClassifier& model, const TrainOptions& o,
                 const Metrics& baseline, const std::vector<std::string>& tied) {
  task.run_config =
      nlohmann::json{{"model", model.cfg.to_json()}, {"batch_rows", o.batch_rows}}.dump();
  set_classifier_reporting(task, model, o, baseline, tied);
}

std::string fingerprint(const std::vector<TokenBatch>& batches) {
  std::vector<std::pair<std::string, Tensor>> fp;
  for (auto& b : batches) fp.emplace_back("", b.ids), fp.emplace_back("", b.labels);
  return train::weights_checksum(fp);
}

// What a train task's closures read: the token batches (and, frozen, the embedding batches and
// the validation embeddings); it outlives the task.
struct TaskData {
  std::vector<TokenBatch> batches;
  std::vector<std::pair<Tensor, Tensor>> emb_batches;  // (embeddings, labels)
  Tensor valid_emb;
};

// Fine-tuning: every weight trains on batches of similar lengths.
void fine_tune_task(train::TrainTask& task, TaskData& data, PretrainedClassifier& model,
                    const std::vector<std::vector<int64_t>>& train_ids,
                    const std::vector<int64_t>& train_gold,
                    const std::vector<std::vector<int64_t>>& valid_ids,
                    const std::vector<int64_t>& valid_gold, const std::vector<std::string>& labels,
                    const TrainOptions& o) {
  auto& batches = data.batches;
  batches =
      token_batches(train_ids, train_gold, by_length(train_ids), o.batch_rows, model.cfg.pad_id);
  task.model = &model;
  task.generators.push_back(&model.encoder->dropout_gen);
  task.batches = (int64_t)batches.size();
  task.loss = [&](int64_t i, train::Shard sh) {
    const Tensor ids = train::shard_of(batches[i].ids, sh);
    return train::shard_loss(cross_entropy(model.forward(ids, train::shard_of(batches[i].pad, sh)),
                                           train::shard_of(batches[i].labels, sh)),
                             ids.size(0), batches[i].ids.size(0));
  };
  task.examples = [&](int64_t i) { return batches[i].ids.size(0); };
  task.tokens = [&](int64_t i) { return batches[i].tokens; };
  task.validate = [&model, &valid_ids, &valid_gold, n = labels.size()] {
    const Metrics v = evaluate_ids(model, n, valid_ids, valid_gold);
    return std::map<std::string, double>{{"accuracy", v.accuracy}, {"macro_f1", v.macro_f1}};
  };
  task.data_fingerprint = fingerprint(batches);
}

// The rows `order` of embeddings (N, d) with their labels, in batches of `rows`.
std::vector<std::pair<Tensor, Tensor>> embedding_batches(const Tensor& emb,
                                                         const std::vector<size_t>& order,
                                                         const std::vector<int64_t>& gold,
                                                         int64_t rows) {
  const std::vector<float> all = emb.to_vector<float>();
  const int64_t d = emb.size(1);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (size_t b0 = 0; b0 < order.size(); b0 += (size_t)rows) {
    const size_t b1 = std::min(order.size(), b0 + (size_t)rows);
    std::vector<float> e;
    std::vector<int64_t> lab;
    for (size_t k = b0; k < b1; ++k) {
      e.insert(e.end(), all.begin() + order[k] * d, all.begin() + (order[k] + 1) * d);
      lab.push_back(gold[order[k]]);
    }
    out.emplace_back(from_vector(e, {(int64_t)(b1 - b0), d}),
                     from_vector(lab, {(int64_t)lab.size()}));
  }
  return out;
}

// Frozen: the encoder embeds every text once; the head alone trains (logistic regression).
void frozen_head_task(train::TrainTask& task, TaskData& data, PretrainedClassifier& model,
                      const std::vector<std::vector<int64_t>>& train_ids,
                      const std::vector<int64_t>& train_gold,
                      const std::vector<std::vector<int64_t>>& valid_ids,
                      const std::vector<int64_t>& valid_gold,
                      const std::vector<std::string>& labels, const TrainOptions& o, bool report) {
  const auto t0 = std::chrono::steady_clock::now();
  const Tensor train_emb = embed_all(model, train_ids, 32);
  data.valid_emb = embed_all(model, valid_ids, 32);
  if (report)
    std::fprintf(stderr, "embedded %zu texts in %.1f s\n", train_ids.size() + valid_ids.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  Generator g(o.loop.seed * 7 + 3);
  const std::vector<int64_t> perm = train::shuffled_order((int64_t)train_ids.size(), g);
  const std::vector<size_t> order(perm.begin(), perm.end());
  auto& batches = data.batches;
  batches = token_batches(train_ids, train_gold, order, o.batch_rows,
                          model.cfg.pad_id);  // for the fingerprint and the token counts
  auto& emb_batches = data.emb_batches;
  emb_batches = embedding_batches(train_emb, order, train_gold, o.batch_rows);
  model.train();  // the head's dropout; the encoder is used no more
  task.model = model.head.get();
  task.batches = (int64_t)emb_batches.size();
  task.loss = [&](int64_t i, train::Shard sh) {
    const Tensor e = train::shard_of(emb_batches[i].first, sh);
    return train::shard_loss(
        cross_entropy(model.logits(e), train::shard_of(emb_batches[i].second, sh)), e.size(0),
        emb_batches[i].first.size(0));
  };
  task.examples = [&](int64_t i) { return emb_batches[i].first.size(0); };
  task.tokens = [&](int64_t i) { return batches[i].tokens; };
  task.validate = [&model, &data, &valid_gold, n = labels.size()] {
    nn::EvalScope es(model);
    autograd::NoGrad ng;
    const auto pred = argmax(model.logits(data.valid_emb), 1).to_vector<int64_t>();
    std::vector<std::vector<int64_t>> confusion(n, std::vector<int64_t>(n, 0));
    for (size_t i = 0; i < pred.size(); ++i) ++confusion[valid_gold[i]][pred[i]];
    const Metrics v = metrics_of(confusion);
    return std::map<std::string, double>{{"accuracy", v.accuracy}, {"macro_f1", v.macro_f1}};
  };
  task.data_fingerprint = fingerprint(batches);
}

}  // namespace

TrainResult train_pretrained(const TrainOptions& options) {
  TrainOptions o = options;
  train::check_loop_options(o.loop);  // before any data work
  const std::vector<Example> train_set = read_tsv(o.data_dir + "/train.tsv");
  const std::vector<Example> valid_set = read_tsv(o.data_dir + "/valid.tsv");
  if (train_set.empty() || valid_set.empty())
    fail("'" + o.data_dir + "' has an empty train.tsv or valid.tsv");
  train::LoopOptions lo = o.loop;
  Start s = o.loop.resume ? start_resumed(o, lo) : start_fresh(o, train_set, lo);
  PretrainedClassifier& model = *s.model;
  const std::string cfg_path = o.loop.run_dir + "/config.json";
  std::vector<std::string> tied{cfg_path};
  for (const std::string& f : tokenizer_files_in(o.loop.run_dir + "/tokenizer")) tied.push_back(f);

  const int64_t L = model.cfg.max_seq_length;
  const auto train_ids = models::tokenize_texts(*s.tokenizer, texts_of(train_set), L);
  const auto valid_ids = models::tokenize_texts(*s.tokenizer, texts_of(valid_set), L);
  const auto train_gold = label_ids(train_set, s.labels),
             valid_gold = label_ids(valid_set, s.labels);
  const bool rank0 = train::world_communicator().rank() == 0;
  TrainResult r;
  if (rank0) r.baseline_valid = evaluate(NaiveBayes(train_set, s.labels), s.labels, valid_set);
  if (!o.loop.quiet && rank0) {
    int64_t cut = 0;
    for (auto& ids : train_ids) cut += (int64_t)ids.size() == L;
    std::cerr << "classify: " << train_set.size() << " train / " << valid_set.size()
              << " valid texts, " << s.labels.size() << " labels, " << model.num_parameters()
              << " parameters (pretrained " << (s.freeze ? "encoder frozen" : "encoder fine-tuned")
              << ", " << cut << " train texts cut at " << L << " tokens)\n";
    std::fprintf(stderr, "baseline (%s): valid accuracy %.2f%%, macro-F1 %.4f\n", kBaselineName,
                 100 * r.baseline_valid.accuracy, r.baseline_valid.macro_f1);
  }
  train::TrainTask task;
  common_task(task, model, o, r.baseline_valid, tied);
  task.generators = {&model.dropout_gen};
  lo.d_model = model.cfg.d_model;

  // Fine-tuning: batches of similar lengths. Frozen: the embeddings once, then the head on
  // batches drawn in a seeded order (the head sees every topic in each batch).
  TaskData data;
  if (!s.freeze)
    fine_tune_task(task, data, model, train_ids, train_gold, valid_ids, valid_gold, s.labels, o);
  else
    frozen_head_task(task, data, model, train_ids, train_gold, valid_ids, valid_gold, s.labels, o,
                     !o.loop.quiet && rank0);
  r.loop = train::train_loop(task, lo);
  if (rank0)
    r.valid = evaluate(load_pretrained_run(o.loop.run_dir), s.labels,
                       valid_set);  // the saved (best) weights
  return r;
}

}  // namespace graft::classify
