#include "examples/lm/lm.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "examples/common/curves.h"
#include "examples/common/finite.h"
#include "examples/common/lines.h"
#include "examples/common/train_task.h"
#include "examples/lm/kneser_ney.h"
#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/run.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/ops/ops.h"

namespace graft::lm {

namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

nlohmann::json options_json(const TrainOptions& o, int64_t context) {
  return {{"text", o.text},
          {"preset", o.preset},
          {"positions", o.positions},
          {"context", context},
          {"batch_rows", o.batch_rows},
          {"dropout", o.dropout},
          {"seed", o.loop.seed},
          {"recipe", train::loop_recipe(o.loop)}};
}

}  // namespace

std::vector<std::string> read_documents(const std::vector<std::string>& paths) {
  std::vector<std::string> docs;
  for (const std::string& path : paths) {
    text::check_input_file("", path, kMaxTextFileBytes);  // not /dev/zero, not over 1 GiB
    if (!fs::is_regular_file(path))
      fail("cannot read '" + path +
           "': " + (fs::exists(path) ? "a directory" : "No such file or directory"));
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read '" + path + "'");
    // Read by its size, not `ss << in.rdbuf()`: a stream turns bad_alloc into a failbit, and the
    // text would be cut short without a word under a memory limit.
    std::string text((size_t)fs::file_size(path), '\0');
    if (!in.read(text.data(), (std::streamsize)text.size()))
      fail("cannot read '" + path + "': " + std::to_string(in.gcount()) + " of " +
           std::to_string(text.size()) + " bytes read");
    if (!text::valid_utf8(text)) fail("'" + path + "' is not UTF-8 text");
    const bool fortune = text.find("\n%\n") != std::string::npos || text.rfind("%\n", 0) == 0;
    std::istringstream lines(text);
    lines.exceptions(std::ios::badbit);  // a bad_alloc in getline throws instead of ending the loop
    std::string line, cur;
    auto flush = [&] {
      const std::string d = trim(cur);
      if (!d.empty()) docs.push_back(d);
      cur.clear();
    };
    while (std::getline(lines, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (fortune ? line == "%" : trim(line).empty()) flush();
      else cur += line + "\n";
    }
    flush();
  }
  return docs;
}

void split_documents(const std::vector<std::string>& docs, int64_t valid_every, uint64_t seed,
                     std::vector<std::string>& train, std::vector<std::string>& valid) {
  if (docs.size() < 2)
    fail("need at least 2 documents to split train/valid, got " + std::to_string(docs.size()));
  Generator g(seed);
  const std::vector<int64_t> order = train::shuffled_order((int64_t)docs.size(), g);
  for (size_t i = 0; i < order.size(); ++i)
    (i % (size_t)valid_every == 0 ? valid : train).push_back(docs[order[i]]);
  if (train.empty()) std::swap(train, valid), valid.push_back(train.back()), train.pop_back();
}

std::vector<int64_t> encode(const std::string& text) {
  std::vector<int64_t> t;
  for (unsigned char c : text) t.push_back(c);
  return t;
}

std::string decode(const std::vector<int64_t>& tokens) {
  std::string s;
  for (int64_t t : tokens)
    if (t >= 0 && t < 256) s.push_back((char)(unsigned char)t);
  return s;
}

int64_t chars_of(int64_t token) {
  if (token == kEOS) return 1;
  if (token >= 256) return 0;
  return (token & 0xC0) == 0x80 ? 0 : 1;
}

std::vector<int64_t> token_stream(const std::vector<std::string>& docs) {
  std::vector<int64_t> s;
  for (auto& d : docs) {
    s.push_back(kBOS);
    for (unsigned char c : d) s.push_back(c);
    s.push_back(kEOS);
  }
  return s;
}

std::vector<Batch> make_batches(const std::vector<int64_t>& stream, int64_t len, int64_t rows) {
  if (len < 1 || rows < 1) fail("context and batch rows must be >= 1");
  const int64_t windows = ((int64_t)stream.size() - 1) / len;
  std::vector<Batch> out;
  for (int64_t w0 = 0; w0 < windows; w0 += rows) {
    const int64_t n = std::min(rows, windows - w0);
    std::vector<int64_t> in, tg;
    for (int64_t w = w0; w < w0 + n; ++w) {
      in.insert(in.end(), stream.begin() + w * len, stream.begin() + (w + 1) * len);
      tg.insert(tg.end(), stream.begin() + w * len + 1, stream.begin() + (w + 1) * len + 1);
    }
    out.push_back({from_vector(in, {n, len}), from_vector(tg, {n, len}), n * len});
  }
  return out;
}

Metrics evaluate(models::DecoderOnlyLM& m, const std::vector<int64_t>& stream, int64_t context) {
  nn::EvalScope es(m);
  autograd::NoGrad ng;
  Metrics r;
  double nll = 0;
  int64_t first = 0;  // the batch's first token, for the error
  for (const Batch& b : make_batches(stream, context, 8)) {
    auto loss = [&] {
      return cross_entropy(reshape(m.forward(b.input), {-1, kVocab}), reshape(b.target, {-1}));
    };
    const std::string what = "evaluate: the loss of tokens " + std::to_string(first + 1) + ".." +
                             std::to_string(first + b.tokens);
    nll += cli::check_finite(what, loss().item(), &m, loss) * (double)b.tokens;
    first += b.tokens;
    for (int64_t t : b.target.to_vector<int64_t>()) r.chars += chars_of(t);
    r.tokens += b.tokens;
  }
  if (r.tokens == 0)
    fail("evaluate: the text is shorter than one window of " + std::to_string(context) + " tokens");
  return metrics_of(nll, r.tokens, r.chars);
}

Metrics metrics_of(double nll, int64_t tokens, int64_t chars) {
  Metrics r;
  r.tokens = tokens, r.chars = chars;
  r.loss = nll / (double)tokens;
  r.ppl = std::exp(r.loss);
  r.bpc = nll / std::log(2.0) / (double)std::max<int64_t>(chars, 1);
  return r;
}

models::LMConfig preset(const std::string& name) {
  models::LMConfig c;
  c.vocab = kVocab;
  c.pad_id = kPAD;
  if (name == "lm-mini") {
    c.d_model = 128, c.heads = 4, c.d_ff = 512, c.layers = 2, c.max_len = 128;
  } else if (name == "lm-small") {
    c.d_model = 256, c.heads = 4, c.d_ff = 1024, c.layers = 4, c.max_len = 256;
  } else if (name == "llama-mini") {
    // lm-mini's size in the Llama recipe: rope, RMSNorm, SwiGLU (d_ff 384: 427,008 parameters
    // against lm-mini's 429,952 with rope), 2 KV heads for 4 query heads, no biases; the output
    // stays tied to the embedding as lm-mini's.
    c.d_model = 128, c.heads = 4, c.d_ff = 384, c.layers = 2, c.max_len = 128;
    c.positions.kind = nn::Positions::rope;
    c.rms_norm = true, c.activation = nn::Activation::swiglu, c.kv_heads = 2, c.bias = false;
  } else {
    fail("unknown preset '" + text::printable(name) + "' (known: lm-mini, lm-small, llama-mini)");
  }
  return c;
}

namespace {

models::LMConfig run_config(const TrainOptions& o, int64_t& context, nlohmann::json& saved) {
  const std::string cfg_path = o.loop.run_dir + "/config.json";
  if (o.loop.resume) {
    saved = train::load_resume_config(o.loop.run_dir);
    context = train::json_field<int64_t>(
        saved.is_object() ? saved.value("train", nlohmann::json()) : nlohmann::json(), "context",
        "resume: '" + cfg_path + "': \"train\" section");
    models::model_section(saved, cfg_path, "resume");
    models::LMConfig c = models::LMConfig::from_json(saved["model"], cfg_path);
    if (context < 1 || context > c.max_len)
      fail("resume: '" + cfg_path + "': context must be in [1, max_len]");
    models::check_config_memory(c, cfg_path);
    return c;
  }
  models::LMConfig c = preset(o.preset);
  if (!o.positions.empty()) c.positions.kind = nn::parse_positions(o.positions);
  c.scale_embedding = c.positions.kind == nn::Positions::sinusoidal;  // as the original Transformer
  c.dropout = o.dropout;
  c.seed = o.loop.seed;
  context = o.context > 0 ? o.context : c.max_len;
  c.max_len = std::max(c.max_len, context);
  models::check_config_memory(c, "train");
  // Under mpirun rank 0 alone writes the run's files; the others wait for them.
  train::on_rank0(train::world_communicator(), [&] {
    train::lock_run_until_exit(o.loop.run_dir);  // also creates it
    train::save_json(cfg_path, {{"model", c.to_json()}, {"train", options_json(o, context)}});
  });
  return c;
}

// On --resume, the training options config.json saved (an exact continuation trains on the same
// data and batches); run_config() already read "context" from the same object.
void apply_saved_training(TrainOptions& o, const nlohmann::json& saved) {
  const nlohmann::json& t = saved["train"];
  const std::string where = "resume: '" + o.loop.run_dir + "/config.json': \"train\" section";
  o.text = train::json_field<std::vector<std::string>>(t, "text", where);
  o.batch_rows = train::json_field<int64_t>(t, "batch_rows", where);
  o.loop.seed = train::json_field<uint64_t>(t, "seed", where);
  tasks::apply_saved_recipe(t, o.loop, where);
  if (o.batch_rows < 1 || o.batch_rows > 4096)
    fail("resume: '" + o.loop.run_dir + "/config.json': batch_rows must be in [1, 4096]");
  train::check_loop_options(o.loop);
}

// What train::train_loop needs: the sharded loss, validation, and the weights and curves (with the
// baseline's line) written at each validation.
train::TrainTask make_task(models::DecoderOnlyLM& model, const std::vector<Batch>& batches,
                           const std::vector<int64_t>& valid_stream, int64_t context,
                           const TrainOptions& o, const Metrics& baseline) {
  train::TrainTask task;
  tasks::set_row_batches(task, model, batches, &Batch::input, &Batch::target);
  task.metric_names = {"loss", "bpc"};
  task.validate = [&model, &valid_stream, context]() -> std::map<std::string, double> {
    const Metrics v = evaluate(model, valid_stream, context);
    return {{"loss", v.loss}, {"bpc", v.bpc}};
  };
  task.stop_metric = "bpc";
  task.run_config =
      nlohmann::json{{"model", model.cfg.to_json()}, {"train", options_json(o, context)}}.dump();
  tasks::save_best_and_draw(task, model, "graft-lm", {o.loop.run_dir + "/config.json"},
                            [&o, &baseline](const train::Validated& v) {
                              if (!o.plot) return;
                              plot::learning_curves(v.checkpoint.path("curves.png"), v.rows,
                                                    "nats/token", {"bpc"},
                                                    "validation bits per character",
                                                    {"Kneser-Ney 7-gram", {{"bpc", baseline.bpc}}});
                            });
  return task;
}

}  // namespace

TrainResult train(const TrainOptions& opts) {
  train::check_loop_options(opts.loop);  // before any data work
  TrainOptions o = opts;
  int64_t context = 0;
  nlohmann::json saved;
  const models::LMConfig cfg = run_config(o, context, saved);
  if (o.loop.resume) apply_saved_training(o, saved);
  std::vector<std::string> train_docs, valid_docs;
  split_documents(read_documents(o.text), 20, o.loop.seed, train_docs, valid_docs);
  const std::vector<int64_t> train_stream = token_stream(train_docs),
                             valid_stream = token_stream(valid_docs);
  const std::vector<Batch> batches = make_batches(train_stream, context, o.batch_rows);
  models::DecoderOnlyLM model(cfg);
  const bool rank0 = train::world_communicator().rank() == 0;  // rank 0 alone reports
  TrainResult r;
  if (rank0)  // the baseline, for the curves
    r.baseline_valid = evaluate(KneserNey(train_stream, kBaselineOrder), valid_stream, context);
  if (!o.loop.quiet && rank0) {
    std::cerr << "lm: " << train_docs.size() << " train / " << valid_docs.size()
              << " valid documents, " << batches.size() << " batches of " << o.batch_rows << " x "
              << context << " tokens, " << model.num_parameters() << " parameters ("
              << nn::positions_name(cfg.positions.kind) << ")\n";
    std::fprintf(stderr, "baseline (%s): valid %.4f bits/char\n", kBaselineName,
                 r.baseline_valid.bpc);
  }
  const train::TrainTask task =
      make_task(model, batches, valid_stream, context, o, r.baseline_valid);
  train::LoopOptions lo = o.loop;
  lo.d_model = cfg.d_model;
  r.loop = train::train_loop(task, lo);
  if (rank0) r.valid = evaluate(model, valid_stream, context);
  r.context = context;
  return r;
}

LoadedRun load_run(const std::string& run_dir) {
  auto loaded = models::load_run_model<models::DecoderOnlyLM>(run_dir);
  const std::string where = "'" + run_dir + "/config.json': \"train\" section";
  const nlohmann::json train = loaded.config.value("train", nlohmann::json());
  LoadedRun r;
  r.context = train::json_field<int64_t>(train, "context", where);
  r.text = train::json_field<std::vector<std::string>>(train, "text", where);
  r.seed = train::json_field<uint64_t>(train, "seed", where);
  if (r.context < 1 || r.context > loaded.model->cfg.max_len)
    fail("'" + run_dir + "/config.json': context must be in [1, max_len]");
  r.model = std::move(loaded.model);
  return r;
}

}  // namespace graft::lm
