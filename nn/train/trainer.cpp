#include "graft/nn/train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <optional>
#include <sstream>

#include "graft/autograd/tape.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/nn/train/gradient_buckets.h"
#include "graft/nn/train/optim.h"

namespace graft::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
// 4: checksums cover dtype. A bump must also rewrite the version in fuzz/corpus/train_state/ and
// fuzz/regressions/train_state/, or the fuzzer's seeds stop at the version check.
constexpr const char* kStateVersion = "graft-train-state-4";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double bits_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

std::string fmt_num(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  const long t = (long)(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

// ---- metrics.csv ----

// A row as metrics.csv holds it (fmt_num's 6 significant digits; a value not finite is NaN, an
// empty field). The loop keeps its rows so: they equal what a resumed run reads back, and what
// on_validated decides from them, an interrupted run decides the same.
MetricsRow as_written(MetricsRow r) {
  auto round = [](double v) {
    const std::string s = fmt_num(v);
    return s.empty() ? NAN : std::strtod(s.c_str(), nullptr);
  };
  r.train_loss = round(r.train_loss), r.lr = round(r.lr), r.tokens_per_s = round(r.tokens_per_s);
  for (auto& [name, v] : r.valid) v = round(v);
  return r;
}

// metrics.csv's first line.
std::string metrics_header(const std::vector<std::string>& names) {
  std::string h = "step,train_loss,lr,tokens_per_s";
  for (auto& n : names) h += ",valid_" + n;
  return h;
}

void write_metrics(const std::string& path, const std::vector<std::string>& names,
                   const std::vector<MetricsRow>& rows) {
  atomic_write(path, [&](std::ostream& os) {
    os << metrics_header(names) << '\n';
    for (auto& r : rows) {
      os << r.step << ',' << fmt_num(r.train_loss) << ',' << fmt_num(r.lr) << ','
         << fmt_num(r.tokens_per_s);
      for (auto& n : names) {
        auto it = r.valid.find(n);
        os << ',' << (it == r.valid.end() ? "" : fmt_num(it->second));
      }
      os << '\n';
    }
  });
}

// One line of metrics.csv as write_metrics wrote it: exactly one cell per column, the step a
// whole number, every other cell empty or a number (NaN for a value not finite) in the C
// locale's syntax.
MetricsRow parse_metrics_row(const std::string& line, const std::vector<std::string>& names) {
  std::vector<std::string> f;
  size_t from = 0;
  for (size_t comma; (comma = line.find(',', from)) != std::string::npos; from = comma + 1)
    f.push_back(line.substr(from, comma - from));
  f.push_back(line.substr(from));
  if (f.size() != 4 + names.size())
    throw std::invalid_argument(std::to_string(f.size()) + " cells, not " +
                                std::to_string(4 + names.size()));
  auto num = [](const std::string& s) {
    size_t used = 0;
    const double v = s.empty() ? NAN : std::stod(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
    return v;
  };
  MetricsRow r;
  size_t used = 0;
  r.step = std::stoll(f[0], &used);
  if (used != f[0].size() || f[0].empty() || r.step < 0) throw std::invalid_argument(f[0]);
  r.train_loss = num(f[1]), r.lr = num(f[2]), r.tokens_per_s = num(f[3]);
  for (size_t i = 0; i < names.size(); ++i)
    if (!f[4 + i].empty()) r.valid[names[i]] = num(f[4 + i]);
  return r;
}

// The rows of the checkpoint's metrics.csv, which was committed with its train state (steps up
// to last_step, the last of them last_step: a checkpoint is taken at a validation, which writes
// a row). Anything else is damage, not something to skip: the history would be lost.
std::vector<MetricsRow> read_metrics(const std::string& path, const std::vector<std::string>& names,
                                     int64_t last_step) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line))
    fail("resume: '" + path + "' is missing or empty: the checkpoint is damaged");
  if (line != metrics_header(names))
    fail("resume: '" + path + "' line 1 is not the header '" + metrics_header(names) +
         "': the checkpoint is damaged or of another program");
  std::vector<MetricsRow> rows;
  for (int64_t n = 2; std::getline(in, line); ++n) {
    MetricsRow r;
    try {
      r = parse_metrics_row(line, names);
    } catch (const std::exception&) {
      fail("resume: '" + path + "' line " + std::to_string(n) +
           " is not a metrics row: the checkpoint is damaged");
    }
    if (!rows.empty() && r.step <= rows.back().step)
      fail("resume: '" + path + "' line " + std::to_string(n) + ": step " + std::to_string(r.step) +
           " does not follow step " + std::to_string(rows.back().step) +
           ": the checkpoint is damaged");
    if (r.step <= last_step) rows.push_back(r);
  }
  if (last_step > 0 && (rows.empty() || rows.back().step != last_step))
    fail("resume: '" + path + "' has no row for step " + std::to_string(last_step) +
         ", the train state's: the checkpoint is damaged");
  return rows;
}

// ---- the train state ----

constexpr const char* kStateFile = "train_state.safetensors";
constexpr const char* kMetricsFile = "metrics.csv";

// Everything besides tensors that an exact resume needs.
struct LoopState {
  int64_t step = 0, epoch = 0, pos = 0;
  std::vector<int64_t> order;  // this epoch's batch order
  Generator batch_gen;
  double elapsed = 0;   // training seconds before this call
  double acc_loss = 0;  // loss sum / count since the last metrics row
  int64_t acc_n = 0;
  double best = NAN;       // early stopping: the best stop_metric so far
  int64_t since_best = 0;  // validations since it improved
};

// The fingerprint of each of the task's tied files, by file name.
nlohmann::json tied_fingerprints(const TrainTask& task) {
  nlohmann::json out = nlohmann::json::object();
  for (auto& f : task.tied_files)
    out[fs::path(f).filename().string()] = file_fingerprint(f, "train");
  return out;
}

std::string metadata_checksum(const std::string& trainer, const std::string& optimizer) {
  return text_checksum(trainer + '\n' + optimizer);
}

// One rank's generators, as the train state keeps them: the default generator, then the task's.
std::vector<uint64_t> generator_states(const TrainTask& task) {
  std::vector<uint64_t> v{default_generator().state()};
  for (Generator* g : task.generators) v.push_back(g->state());
  return v;
}
void set_generator_states(const TrainTask& task, const std::vector<uint64_t>& v) {
  default_generator().set_state(v.at(0));
  for (size_t i = 0; i < task.generators.size(); ++i) task.generators[i]->set_state(v.at(i + 1));
}
// Rank r > 0 draws its dropout masks from streams of its own, derived from rank 0's (so from the
// seed) and r: a splitmix64 step of each state mixed with the rank.
std::vector<uint64_t> rank_streams(std::vector<uint64_t> v, int rank) {
  if (rank == 0) return v;
  for (uint64_t& s : v) s = mix64(s + 0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1));
  return v;
}

// `ranks`: every rank's generator_states(), rank by rank.
void save_train_state(const std::string& path, const TrainTask& task, const Optimizer& opt,
                      const LoopState& s, const nlohmann::json& tied, const nlohmann::json& recipe,
                      const std::vector<std::vector<uint64_t>>& ranks) {
  nn::NamedTensors tensors;
  for (auto& [n, t] : task.model->state_dict()) tensors.emplace_back("model." + n, t);
  for (auto& [n, t] : opt.state_tensors()) tensors.emplace_back("optim." + n, t);
  const std::vector<uint64_t> gens(ranks[0].begin() + 1, ranks[0].end());
  const nlohmann::json j = {{"version", kStateVersion},
                            {"step", s.step},
                            {"epoch", s.epoch},
                            {"pos", s.pos},
                            {"order", s.order},
                            {"batch_gen", s.batch_gen.state()},
                            {"generators", gens},
                            {"default_gen", ranks[0][0]},
                            {"rank_generators", ranks},
                            {"elapsed_bits", double_bits(s.elapsed)},
                            {"acc_loss_bits", double_bits(s.acc_loss)},
                            {"acc_n", s.acc_n},
                            {"best_bits", double_bits(s.best)},
                            {"since_best", s.since_best},
                            {"data_fingerprint", task.data_fingerprint},
                            {"optimizer_steps", opt.step_count()},
                            {"tied", tied},
                            {"recipe", recipe}};
  const std::string trainer = j.dump(), optimizer = opt.state_json().dump();
  std::map<std::string, std::string> meta = checksum_metadata(tensors);
  meta["trainer"] = trainer;
  meta["optimizer"] = optimizer;
  meta["metadata_checksum"] = metadata_checksum(trainer, optimizer);
  save_safetensors(path, tensors, meta);
}

// The file checked whole (checksum, version, data fingerprint, shapes) before anything changes.
SafetensorsFile read_train_state(const std::string& path, const TrainTask& task,
                                 const nlohmann::json& recipe, nlohmann::json& j,
                                 nlohmann::json& oj) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail("resume: no training state at '" + path +
         "' (nothing to resume; start a fresh run instead)");
  SafetensorsFile f;
  try {
    f = load_safetensors(path);
  } catch (const std::exception& e) {
    fail(std::string("resume: the checkpoint is truncated or corrupted: ") + e.what());
  }
  check_weights_checksum(f, "resume");
  auto meta = [&](const char* key) {
    auto m = f.metadata.find(key);
    if (m == f.metadata.end())
      fail("resume: '" + path + "': no '" + key + "' metadata; not a graft train state");
    return m->second;
  };
  const std::string trainer = meta("trainer"), optimizer = meta("optimizer");
  const size_t v = trainer.find("\"version\":\"");
  if (v != std::string::npos &&
      trainer.compare(v + 11, std::strlen(kStateVersion), kStateVersion) != 0)
    fail("resume: '" + path + "': written by another version of graft (this one reads " +
         kStateVersion + " train states); start a new run");
  if (meta("metadata_checksum") != metadata_checksum(trainer, optimizer))
    fail("resume: '" + path +
         "': checksum mismatch in the trainer/optimizer metadata: the checkpoint is corrupted");
  j = parse_json(trainer, "resume: '" + path + "': trainer metadata", 4);
  oj = parse_json(optimizer, "resume: '" + path + "': optimizer metadata", 8);
  if (!j.is_object() || !j.contains("version") || j["version"] != kStateVersion)
    fail("resume: '" + path + "': not a train state of this version (" + kStateVersion + ")");
  if (!j.contains("data_fingerprint") || j["data_fingerprint"] != task.data_fingerprint)
    fail("resume: '" + path +
         "': the training data or batching differs from the interrupted run "
         "(data, batch size and tokenizer must be unchanged)");
  const nlohmann::json now = tied_fingerprints(task);
  for (auto& f : task.tied_files) {
    const std::string name = fs::path(f).filename().string();
    if (!j.contains("tied") || !j["tied"].is_object() || !j["tied"].contains(name) ||
        j["tied"][name] != now[name])
      fail("resume: '" + f +
           "' is not the file the interrupted run started with (edited since, or from "
           "another run); a resume needs the same config and tokenizer");
  }
  // A state from before the recipe was kept trained with Adam and the schedule options, which
  // the programs restore from their configs.
  if (j.contains("recipe") && j["recipe"] != recipe)
    fail("resume: '" + path + "': the run was trained with " + j["recipe"].dump() +
         " but this call asks for " + recipe.dump() +
         "; resume with the same optimizer, weight decay, schedule, learning rates, warmup and "
         "decay steps");
  return f;
}

// Whether v holds each of 0..v.size()-1 exactly once.
bool is_permutation_of_indices(const std::vector<int64_t>& v) {
  std::vector<char> seen(v.size(), 0);
  for (int64_t i : v) {
    if (i < 0 || (uint64_t)i >= v.size() || seen[(size_t)i]) return false;
    seen[(size_t)i] = 1;
  }
  return true;
}

// The loop state a train state's trainer metadata `j` saved, checked against a run of `batches`
// batches.
LoopState loop_state_from(const nlohmann::json& j, const std::string& path, int64_t batches) {
  LoopState ns;
  const std::string where = "resume: '" + path + "': trainer metadata";
  ns.step = json_field<int64_t>(j, "step", where);
  ns.epoch = json_field<int64_t>(j, "epoch", where);
  ns.pos = json_field<int64_t>(j, "pos", where);
  ns.order = json_field<std::vector<int64_t>>(j, "order", where);
  ns.batch_gen.set_state(json_field<uint64_t>(j, "batch_gen", where));
  ns.elapsed = bits_double(json_field<uint64_t>(j, "elapsed_bits", where));
  ns.acc_loss = bits_double(json_field<uint64_t>(j, "acc_loss_bits", where));
  ns.acc_n = json_field<int64_t>(j, "acc_n", where);
  ns.best = bits_double(json_field<uint64_t>(j, "best_bits", where));
  ns.since_best = json_field<int64_t>(j, "since_best", where);
  if (!std::isfinite(ns.elapsed) || ns.elapsed < 0 || ns.step < 0 || ns.epoch < 0 || ns.acc_n < 0 ||
      ns.since_best < 0)
    fail("resume: '" + path +
         "': bad trainer metadata (negative counters or a non-finite elapsed time)");
  if ((int64_t)ns.order.size() != batches || ns.pos < 0 || ns.pos > batches ||
      !is_permutation_of_indices(ns.order))
    fail("resume: '" + path + "': batch order is not a permutation of the " +
         std::to_string(batches) + " batches");
  return ns;
}

// Restores the weights, the optimizer and the loop state; returns every saved rank's generator
// states (one rank for a run saved before data parallelism).
std::vector<std::vector<uint64_t>> load_train_state(const std::string& path, const TrainTask& task,
                                                    const nlohmann::json& recipe, Optimizer& opt,
                                                    LoopState& s) {
  nlohmann::json j, oj;
  const SafetensorsFile f = read_train_state(path, task, recipe, j, oj);
  nn::NamedTensors model_t, optim_t;
  for (auto& [n, t] : f.tensors) {
    if (n.rfind("model.", 0) == 0) model_t.emplace_back(n.substr(6), t);
    else if (n.rfind("optim.", 0) == 0) optim_t.emplace_back(n.substr(6), t);
    else fail("resume: '" + path + "': unexpected tensor '" + n + "'");
  }
  LoopState ns = loop_state_from(j, path, task.batches);
  const std::string where = "resume: '" + path + "': trainer metadata";
  const auto gens = json_field<std::vector<uint64_t>>(j, "generators", where);
  const int64_t optimizer_steps = json_field<int64_t>(j, "optimizer_steps", where);
  const uint64_t default_gen = json_field<uint64_t>(j, "default_gen", where);
  if (gens.size() != task.generators.size())
    fail("resume: '" + path + "': " + std::to_string(gens.size()) + " generator states for " +
         std::to_string(task.generators.size()) + " generators");
  std::vector<std::vector<uint64_t>> ranks{{default_gen}};
  ranks[0].insert(ranks[0].end(), gens.begin(), gens.end());
  if (j.contains("rank_generators")) {
    ranks = json_field<std::vector<std::vector<uint64_t>>>(j, "rank_generators", where);
    for (auto& r : ranks)
      if (r.size() != gens.size() + 1)
        fail("resume: '" + path + "': a rank's generator states do not match the " +
             std::to_string(task.generators.size()) + " generators");
    if (ranks.empty()) fail("resume: '" + path + "': no rank's generator states");
  }
  try {
    task.model->load_state_dict(model_t);
    opt.load_state(optim_t, oj);
  } catch (const Error& e) {
    fail("resume: '" + path + "': " + e.what());
  }
  // Steps whose gradient was not finite did not update the optimizer: its count is its own.
  if (opt.step_count() != optimizer_steps || opt.step_count() > ns.step)
    fail("resume: '" + path + "': optimizer is at step " + std::to_string(opt.step_count()) +
         " but the trainer state says " + std::to_string(optimizer_steps) + " (trainer step " +
         std::to_string(ns.step) + ")");
  s = std::move(ns);
  return ranks;
}

// What every rank must agree on: the data, the tied files, the parameters and the options that
// shape the run.
std::string run_identity(const TrainTask& t, const LoopOptions& o, const nlohmann::json& tied) {
  nlohmann::json params = nlohmann::json::array();
  for (auto& [n, p] : t.model->named_parameters())
    params.push_back({n, p.shape(), dtype_name(p.dtype())});
  // Every option that changes the arithmetic, the number or order of the collective calls, or
  // when the run stops.
  const nlohmann::json options = {
      {"steps", o.steps},         {"minutes", o.minutes},     {"recipe", loop_recipe(o)},
      {"seed", o.seed},           {"resume", o.resume},       {"valid_every", o.valid_every},
      {"patience", o.patience},   {"min_delta", o.min_delta}, {"stop_at", o.stop_at},
      {"bucket_mb", o.bucket_mb}, {"overlap", o.overlap}};
  const nlohmann::json j = {{"data", t.data_fingerprint},
                            {"config", t.run_config},
                            {"tied", tied},
                            {"params", params},
                            {"batches", t.batches},
                            {"metrics", t.metric_names},
                            {"stop_metric", t.stop_metric},
                            {"options", options}};
  return j.dump();
}

void check_ranks_agree(Communicator& c, const TrainTask& t, const LoopOptions& o,
                       const nlohmann::json& tied) {
  if (c.size() == 1) return;
  const std::string mine = run_identity(t, o, tied);
  const bool same = c.broadcast_string(mine, 0) == mine;
  const auto flags = c.allgather({same ? 0ull : 1ull});
  std::string differ;
  for (int r = 0; r < c.size(); ++r)
    if (flags[(size_t)r][0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    fail("train: the ranks disagree on the training data, config or options (rank " + differ +
         " differs from rank 0): every rank must run the same command on the same data");
  if (!t.examples)
    fail("train: the task cannot be split across " + std::to_string(c.size()) +
         " ranks (it gives no examples per batch)");
  int64_t largest = 0;
  for (int64_t b = 0; b < t.batches; ++b) largest = std::max(largest, t.examples(b));
  if (largest < c.size())
    fail("train: the data is too small for " + std::to_string(c.size()) +
         " ranks: its largest batch has " + std::to_string(largest) + " example" +
         (largest == 1 ? "" : "s") +
         ", so some rank would never train (more data, larger batches, or fewer ranks)");
}

// Whether run_dir has a committed checkpoint. A train state outside one is a run of the layout
// before checkpoints were committed as one unit: its files cannot be updated safely.
bool has_checkpoint(const std::string& run_dir) {
  if (!current_checkpoint(run_dir).empty()) return true;
  std::error_code ec;
  const fs::path state = fs::path(run_dir) / kStateFile;
  if (fs::is_regular_file(fs::symlink_status(state, ec)))
    fail("resume: '" + state.string() +
         "' was written by graft before 0.5, whose checkpoints were not "
         "committed as one unit (there is no 'checkpoint' link beside it); start a new run");
  return false;
}

void check_task(const TrainTask& t, const LoopOptions& o, int ranks) {
  if (!t.model || !(t.loss || t.loss_of_batch) || !t.tokens || !t.validate)
    fail("train: the task needs a model, a loss (loss or loss_of_batch), tokens and validate");
  if (t.loss && t.loss_of_batch)
    fail("train: the task gives both loss and loss_of_batch; give one");
  if (t.loss_of_batch && ranks > 1)
    fail(
        "train: the task gives loss_of_batch, the loss of whole batches, so it cannot be split "
        "across " +
        std::to_string(ranks) +
        " ranks; give TrainTask::loss (of a shard: shard_of, shard_loss) to train under mpirun");
  if (t.batches < 1)
    fail("train: no training batches (every example was dropped or the data is empty)");
  check_loop_options(o);
  if ((o.patience > 0 || !std::isnan(o.stop_at)) &&
      std::find(t.metric_names.begin(), t.metric_names.end(), t.stop_metric) ==
          t.metric_names.end())
    fail(std::string("train: ") + (o.patience > 0 ? "early stopping" : "stop_at") + " metric '" +
         t.stop_metric + "' is not a validation metric");
}

// ---- the loop ----

// Adam or AdamW; with weight decay, over decay_groups() (no decay on norms, biases, embeddings).
std::unique_ptr<Optimizer> make_optimizer(const nn::NamedTensors& params, const LoopOptions& o) {
  ParamGroups groups =
      o.weight_decay > 0 ? decay_groups(params, o.weight_decay) : ParamGroups{{params, 0.0}};
  if (o.optimizer == "adamw")
    return std::make_unique<AdamW>(std::move(groups), 1e-3, o.beta1, o.beta2, o.adam_eps);
  return std::make_unique<Adam>(std::move(groups), 1e-3, o.beta1, o.beta2, o.adam_eps);
}

// The loop's console lines and metrics rows: a progress line every log_every steps (five times a
// second on a terminal), the validation lines, and the clocks behind the throughput (tokens per
// second of training, validation time left out).
class Progress {
 public:
  Progress(const LoopOptions& o, bool quiet)
      : options_(o), quiet_(quiet), tty_(!quiet && isatty(2)) {}

  void say(const std::string& s) const {
    if (quiet_) return;
    if (tty_) std::cerr << "\r\033[K";
    std::cerr << s << std::endl;
  }
  void start() { t_start_ = t_interval_ = t_draw_ = Clock::now(); }
  // Ends the progress line a terminal was redrawing.
  void finish() const {
    if (tty_) std::cerr << "\n";
  }
  double since_start() const { return seconds_since(t_start_); }
  double valid_seconds() const { return valid_seconds_; }
  int64_t tokens() const { return tok_total_; }
  std::vector<MetricsRow>& rows() { return rows_; }

  // One step done (s.step counts it, s.acc_loss holds its loss): its tokens, a metrics row every
  // log_every steps (which restarts the loss average), the progress line.
  void step(LoopState& s, double lv, double lr, int64_t tokens, int64_t first_step,
            double elapsed) {
    tok_total_ += tokens;
    tok_interval_ += tokens;
    const bool row = s.step % options_.log_every == 0;
    if (row) {
      last_tps_ = (double)tok_interval_ / std::max(1e-9, seconds_since(t_interval_));
      rows_.push_back(as_written({s.step, s.acc_loss / (double)s.acc_n, lr, last_tps_, {}}));
      s.acc_loss = 0;
      s.acc_n = 0;
      t_interval_ = Clock::now();
      tok_interval_ = 0;
    }
    if (quiet_ || !(tty_ ? seconds_since(t_draw_) > 0.2 : row)) return;
    t_draw_ = Clock::now();
    draw(s, lv, lr, first_step, elapsed);
  }

  // The validation's metrics join the step's row (a row of their own off the log cadence).
  void validation_row(int64_t step, const std::map<std::string, double>& vm) {
    MetricsRow r{step, NAN, NAN, NAN, {}};
    if (!rows_.empty() && rows_.back().step == step) {
      r = rows_.back();
      rows_.pop_back();
    }
    r.valid = vm;
    rows_.push_back(as_written(r));
  }

  // The validation's line; its seconds are not training throughput.
  void validated(int64_t step, const std::vector<std::string>& names,
                 const std::map<std::string, double>& vm, Clock::time_point t0) {
    std::ostringstream os;
    os << "step " << step << " ";
    for (auto& n : names) os << " valid " << n << " " << fmt_num(vm.count(n) ? vm.at(n) : NAN);
    char buf[32];
    std::snprintf(buf, sizeof buf, "  (%.1f s)", seconds_since(t0));
    say(os.str() + buf);
    t_interval_ = Clock::now();
    tok_interval_ = 0;
    valid_seconds_ += seconds_since(t0);
  }

 private:
  void draw(const LoopState& s, double lv, double lr, int64_t first_step, double elapsed) {
    const double tps = last_tps_ > 0
                           ? last_tps_
                           : (double)tok_interval_ / std::max(1e-9, seconds_since(t_interval_));
    const double per_step = seconds_since(t_start_) / (double)(s.step - first_step);
    double eta = options_.steps > 0 ? per_step * (double)(options_.steps - s.step) : NAN;
    if (options_.minutes > 0)
      eta = std::isfinite(eta) ? std::min(eta, options_.minutes * 60 - elapsed)
                               : options_.minutes * 60 - elapsed;
    char buf[200];
    std::snprintf(buf, sizeof buf, "step %6lld  ep %lld  loss %.4f  lr %.2e  %6.0f tok/s  ETA %s",
                  (long long)s.step, (long long)s.epoch, lv, lr, tps, fmt_duration(eta).c_str());
    if (tty_) std::cerr << "\r\033[K" << buf << std::flush;
    else std::cerr << buf << std::endl;
  }

  const LoopOptions& options_;
  const bool quiet_;  // o.quiet, or a rank other than 0
  const bool tty_;
  std::vector<MetricsRow> rows_;
  Clock::time_point t_start_, t_interval_, t_draw_;
  int64_t tok_total_ = 0, tok_interval_ = 0;
  double last_tps_ = 0, valid_seconds_ = 0;
};

// When a run ends before its steps: the stop metric reached the target (stop_at), or it has not
// improved by more than min_delta for `patience` validations (early stopping). Only validations
// on the cadence count.
class StopRule {
 public:
  StopRule(const TrainTask& task, const LoopOptions& o) : task_(task), options_(o) {}

  // A resumed run that had stopped early.
  bool had_stopped(const LoopState& s) const {
    return options_.patience > 0 && s.since_best >= options_.patience;
  }

  // On reaching the target, res gets its step and times: wall_s since the start, train_s of
  // them training (validations left out).
  bool reached_target(const std::map<std::string, double>& vm, int64_t step, double wall_s,
                      double train_s, LoopResult& res) const {
    if (std::isnan(options_.stop_at)) return false;
    auto it = vm.find(task_.stop_metric);
    if (it == vm.end() || !std::isfinite(it->second)) return false;
    if (task_.higher_is_better ? it->second < options_.stop_at : it->second > options_.stop_at)
      return false;
    res.reached_target = true;
    res.target_step = step;
    res.wall_seconds_to_target = wall_s;
    res.seconds_to_target = train_s;
    return true;
  }

  // Counts the validation in s.best and s.since_best; true when patience has run out.
  bool no_improvement(const std::map<std::string, double>& vm, LoopState& s) const {
    if (options_.patience <= 0) return false;
    auto it = vm.find(task_.stop_metric);
    const double v = it == vm.end() ? NAN : it->second;
    const double gain = task_.higher_is_better ? v - s.best : s.best - v;
    const bool better = std::isfinite(v) && (!std::isfinite(s.best) || gain > options_.min_delta);
    if (better) {
      s.best = v;
      s.since_best = 0;
    } else {
      ++s.since_best;
    }
    return s.since_best >= options_.patience;
  }

  // The line that says why the run stopped ("" when it goes on).
  std::string why_stopped(const LoopResult& res, const LoopState& s, bool stop) const {
    if (res.reached_target)
      return "reached valid " + task_.stop_metric + " " + fmt_num(options_.stop_at) + " at step " +
             std::to_string(s.step) + " after " + fmt_num(res.seconds_to_target) +
             " s of training (" + fmt_num(res.wall_seconds_to_target) + " s wall)";
    if (!stop) return {};
    return "early stopping: valid " + task_.stop_metric + " has not improved" +
           (options_.min_delta > 0 ? " by more than " + fmt_num(options_.min_delta)
                                   : std::string()) +
           " for " + std::to_string(options_.patience) + " validations (best " + fmt_num(s.best) +
           ")";
  }

 private:
  const TrainTask& task_;
  const LoopOptions& options_;
};

// One optimizer step of the loop: the schedule's learning rate, the batch's loss (this rank's
// shard of it, summed over the ranks), backward (with the gradient sums of data parallel), the
// clip and the update.
class OptimizerStep {
 public:
  OptimizerStep(const TrainTask& task, const LoopOptions& o, Communicator& comm)
      : options_(o),
        comm_(comm),
        rank_(comm.rank()),
        ranks_(comm.size()),
        params_(task.model->named_parameters()),
        opt_(make_optimizer(params_, o)),
        schedule_(loop_schedule(o)) {}

  // On several ranks, the gradient buckets whose sums overlap backward.
  void start_data_parallel() {
    if (ranks_ > 1)
      sync_ = std::make_unique<GradientBuckets>(
          params_, comm_, (size_t)(options_.bucket_mb * (1 << 20)), options_.overlap);
  }

  // Trains on batch b as step `step` (from 1); the loss summed over the ranks. last_good names
  // the train state to go back to when the loss is not finite.
  double take(const TrainTask& task, int64_t b, int64_t step, const std::string& last_good) {
    lr_ = schedule_.lr(step);
    opt_->set_lr(lr_);
    const Shard shard{rank_, ranks_};
    // A batch with fewer rows than ranks leaves the last ranks without rows: they add nothing.
    const auto [first, last] =
        ranks_ == 1 ? std::pair<int64_t, int64_t>{0, 1} : shard_rows(task.examples(b), shard);
    const bool has_rows = first < last;
    const Tensor loss = !has_rows   ? Tensor()
                        : task.loss ? task.loss(b, shard)
                                    : task.loss_of_batch(b);
    const double lv = global_loss(loss);
    if (!std::isfinite(lv)) {
      autograd::clear_tape();
      fail("train: the loss is " + std::to_string(lv) + " at step " + std::to_string(step) +
           " (the last good state is in '" + last_good + "'" +
           (autograd::anomaly_mode()
                ? ")"
                : "; anomaly mode (GRAFT_DETECT_ANOMALY=1) names the op that made it)"));
    }
    if (has_rows) backward(loss);
    else sync_->finish();
    // A non-finite gradient would poison the Adam moments for good; skipping the update keeps
    // the run alive and deterministic.
    if (std::isfinite(clip_grad_norm(params_, options_.clip))) opt_->step();
    opt_->zero_grad();
    return lv;
  }

  double lr() const { return lr_; }
  nn::NamedTensors& params() { return params_; }
  Optimizer& optimizer() { return *opt_; }
  const GradientBuckets* sync() const { return sync_.get(); }

 private:
  // The batch's loss: the sum of the ranks' parts.
  double global_loss(const Tensor& loss) {
    if (loss.defined() ? loss.numel() != 1 : ranks_ == 1)
      fail("train: the task's loss is " + describe(loss) + ", not a scalar");
    if (ranks_ == 1) return loss.item();
    Tensor v = full({1}, loss.defined() ? loss.item() : 0.0, DType::f64);
    comm_.allreduce_sum(v);
    return v.item();
  }

  // Backward; on several ranks each gradient bucket's sum starts as soon as it is complete.
  void backward(const Tensor& loss) {
    if (!sync_) return loss.backward();
    {
      autograd::GradReadyScope hook([this](TensorImpl* leaf) { sync_->grad_ready(leaf); });
      loss.backward();
    }
    sync_->finish();
  }

  const LoopOptions& options_;
  Communicator& comm_;
  const int rank_, ranks_;
  nn::NamedTensors params_;
  std::unique_ptr<Optimizer> opt_;
  Schedule schedule_;
  std::unique_ptr<GradientBuckets> sync_;  // on several ranks
  double lr_ = 0;
};

// The run directory's checkpoints as the loop writes and reads them: the train state (with the
// run's recipe and the tied files' fingerprints, checked on resume), metrics.csv and the
// program's files, committed as one.
class Checkpoints {
 public:
  Checkpoints(const TrainTask& task, const LoopOptions& o)
      : task_(task), options_(o), recipe_(loop_recipe(o)) {}

  // The tied files' fingerprints as this run finds them at its start.
  const nlohmann::json& find_tied() { return tied_ = tied_fingerprints(task_); }
  // Where the last good train state is, for messages.
  std::string state_path() const { return options_.run_dir + "/" + kStateFile; }

  // The current checkpoint into state, opt and rows; gives the generator states it saved, one
  // list per rank that saved it.
  std::vector<std::vector<uint64_t>> load(LoopState& state, Optimizer& opt,
                                          std::vector<MetricsRow>& rows) const {
    // Read from the checkpoint directory itself, not through the run/<name> links, which
    // are for readers and which anything in the run directory could have replaced.
    const std::string ckpt = current_checkpoint(options_.run_dir);
    auto saved = load_train_state(ckpt + "/" + kStateFile, task_, recipe_, opt, state);
    rows = read_metrics(ckpt + "/" + kMetricsFile, task_.metric_names, state.step);
    return saved;
  }

  // The train state, metrics.csv and the program's files, committed as one checkpoint.
  void save(const LoopState& snap, const std::vector<std::vector<uint64_t>>& generators,
            const Optimizer& opt, const std::vector<MetricsRow>& rows) const {
    CheckpointCommit c(options_.run_dir, snap.step);
    save_train_state(c.path(kStateFile), task_, opt, snap, tied_, recipe_, generators);
    write_metrics(c.path(kMetricsFile), task_.metric_names, rows);
    const bool best = task_.stop_metric.empty() ||
                      newest_is_best(rows, task_.stop_metric, task_.higher_is_better);
    if (task_.on_validated) task_.on_validated(Validated{snap.step, rows, best, c});
    c.commit();
  }

 private:
  const TrainTask& task_;
  const LoopOptions& options_;
  nlohmann::json recipe_;  // loop_recipe(options_): kept in the train state, checked on resume
  nlohmann::json tied_;
};

class Loop {
 public:
  // resume: whether run_dir has a checkpoint to continue (o.resume, and one was committed).
  Loop(const TrainTask& task, const LoopOptions& o, Communicator& comm, bool resume)
      : task_(task),
        options_(o),
        comm_(comm),
        resume_(resume),
        rank_(comm.rank()),
        ranks_(comm.size()),
        step_(task, o, comm),
        checkpoints_(task, o),
        progress_(o, o.quiet || rank_ != 0),
        stop_rule_(task, o) {}

  // Each step below either runs on every rank or fails on every rank (on_every_rank() holds no
  // collective call inside; the checks and synchronise_start() fail alike on every rank).
  LoopResult run() {
    const nlohmann::json* tied = nullptr;
    on_every_rank(comm_, [&] { tied = &checkpoints_.find_tied(); });
    check_ranks_agree(comm_, task_, options_, *tied);
    on_every_rank(comm_, [&] { start(); });
    synchronise_start();
    if (ranks_ == 1) return train();
    try {
      return train();
    } catch (const std::exception& e) {
      comm_.abort("train: rank " + std::to_string(rank_) + " of " + std::to_string(ranks_) + ": " +
                      e.what() + " (stopping every rank)",
                  1);
    }
    throw;  // not reached: abort() ends every rank
  }

 private:
  LoopResult train() {
    if (stop_rule_.had_stopped(state_)) {
      say("the run had stopped early at step " + std::to_string(state_.step) + "; nothing to do");
      res_.stopped_early = true;
      res_.last_step = state_.step;
      return res_;
    }
    while (!done()) {
      train_step();
      if (state_.step % options_.valid_every == 0 && validate_and_save(true)) break;
    }
    // Off the validation cadence (a time budget): validate and save for the record, without
    // counting it for early stopping, so a resumed run stops where an uninterrupted one would.
    if (last_valid_step_ != state_.step) validate_and_save(false);
    progress_.finish();
    res_.last_step = state_.step;
    res_.train_seconds = progress_.since_start();
    res_.tokens_per_s =
        (double)progress_.tokens() / std::max(1e-9, res_.train_seconds - progress_.valid_seconds());
    res_.ranks = ranks_;
    if (step_.sync()) summarise_data_parallel();
    return res_;
  }

  // The gradient sums' share of the training time, in the result and in one line.
  void summarise_data_parallel() {
    const GradientBuckets& sync = *step_.sync();
    res_.buckets = sync.bucket_count();
    res_.gradient_bytes = sync.total_bytes();
    res_.allreduce_wait_seconds = sync.wait_seconds();
    const double train_s = res_.train_seconds - progress_.valid_seconds();
    char buf[320];
    std::snprintf(
        buf, sizeof buf,
        "data parallel: %d ranks (%s), %zu gradient bucket%s (%.1f MB a step, overlap %s); "
        "waited %.2f s for the sums after backward (%.1f%% of %.1f s of training)",
        ranks_, comm_.name().c_str(), res_.buckets, res_.buckets == 1 ? "" : "s",
        (double)res_.gradient_bytes / 1e6, options_.overlap ? "on" : "off",
        res_.allreduce_wait_seconds, 100.0 * res_.allreduce_wait_seconds / std::max(1e-9, train_s),
        train_s);
    say(buf);
  }

  void say(const std::string& s) const { progress_.say(s); }
  double elapsed() const { return state_.elapsed + progress_.since_start(); }
  // A fresh run takes rank 0's initial weights on every rank. A resumed one checks that every
  // rank loaded the same state (one shared run directory), else the ranks would drift apart.
  void synchronise_start() {
    if (ranks_ == 1) return;
    if (!resume_) {
      for (auto& [n, p] : step_.params()) {
        comm_.broadcast(p, 0);
        p.bump_version();
      }
      return;
    }
    nn::NamedTensors state = step_.params();
    for (auto& [n, t] : step_.optimizer().state_tensors()) state.emplace_back("optim." + n, t);
    const uint64_t sum = std::stoull(weights_checksum(state).substr(0, 16), nullptr, 16);
    const auto all = comm_.allgather({(uint64_t)state_.step, sum});
    for (int r = 1; r < ranks_; ++r)
      if (all[(size_t)r] != all[0])
        fail("resume: rank " + std::to_string(r) +
             " loaded another train state than rank 0 (step " + std::to_string(all[(size_t)r][0]) +
             " against " + std::to_string(all[0][0]) +
             "): every rank must read the same run directory (a shared filesystem)");
  }

  // The time budget is rank 0's clock, so every rank stops after the same step.
  bool done() {
    if (options_.steps > 0 && state_.step >= options_.steps) return true;
    if (!(options_.minutes > 0)) return false;
    Tensor up = full({1}, elapsed() >= options_.minutes * 60.0 ? 1.0 : 0.0, DType::i64);
    comm_.broadcast(up, 0);
    return up.item() != 0;
  }

  void start() {
    state_.batch_gen = Generator(options_.seed * 0x2545F4914F6CDD1Dull + 17);
    if (options_.resume && !resume_)
      say("no checkpoint in '" + options_.run_dir + "' yet: starting at step 0");
    if (resume_) {
      resume_from_checkpoint();
    } else {
      manual_seed(options_.seed);
      state_.order = shuffled_order(task_.batches, state_.batch_gen);
      set_generator_states(
          task_, rank_streams(generator_states(task_), rank_));  // dropout streams per rank
    }
    step_.start_data_parallel();
    res_.first_step = state_.step;
    progress_.start();
  }

  // The train state, optimizer, metrics rows and generators of the run directory's checkpoint.
  void resume_from_checkpoint() {
    const auto saved = checkpoints_.load(state_, step_.optimizer(), progress_.rows());
    last_valid_step_ =
        state_.step;  // a checkpoint is taken at a validation: not again at a finished run's end
    say("resumed at step " + std::to_string(state_.step) + " (epoch " +
        std::to_string(state_.epoch) + ", batch " + std::to_string(state_.pos) + "/" +
        std::to_string(task_.batches) + ")");
    if ((int)saved.size() == ranks_) {
      set_generator_states(task_, saved[(size_t)rank_]);
      return;
    }
    // Another rank count shards each batch differently: the result cannot be the one the
    // saved ranks would have reached, only one as good. Dropout streams start anew per rank.
    set_generator_states(task_, rank_streams(saved[0], rank_));
    say("the run was saved by " + std::to_string(saved.size()) + " rank" +
        (saved.size() == 1 ? "" : "s") + " and resumes on " + std::to_string(ranks_) +
        ": each rank's dropout stream is derived anew "
        "(same weights, optimizer and batch order; not bit-identical to resuming on " +
        std::to_string(saved.size()) + ")");
  }

  std::string state_path() const { return checkpoints_.state_path(); }

  void train_step() {
    if (state_.pos == task_.batches) {
      ++state_.epoch;
      state_.pos = 0;
      state_.order = shuffled_order(task_.batches, state_.batch_gen);
    }
    const int64_t b = state_.order[(size_t)state_.pos++];
    const double lv = step_.take(task_, b, state_.step + 1, state_path());
    ++state_.step;
    res_.losses.push_back(lv);
    state_.acc_loss += lv;
    ++state_.acc_n;
    progress_.step(state_, lv, step_.lr(), task_.tokens(b), res_.first_step, elapsed());
  }

  // Rank 0's validation metrics, on every rank (the others wait meanwhile).
  std::map<std::string, double> validate_on_rank0() {
    std::map<std::string, double> vm;
    if (rank_ == 0) {
      nn::EvalScope es(*task_.model);
      autograd::NoGrad ng;
      vm = task_.validate();
    }
    if (ranks_ == 1) return vm;
    const size_t n = task_.metric_names.size();
    Tensor v = zeros({(int64_t)(2 * n)}, DType::f64);  // (present, value) per metric
    double* d = v.data<double>();
    for (size_t i = 0; i < n; ++i)
      if (auto it = vm.find(task_.metric_names[i]); it != vm.end())
        d[2 * i] = 1, d[2 * i + 1] = it->second;
    comm_.broadcast(v, 0);
    vm.clear();
    for (size_t i = 0; i < n; ++i)
      if (d[2 * i] != 0) vm[task_.metric_names[i]] = d[2 * i + 1];
    return vm;
  }

  // Returns true when the run stops here (only validations on the cadence count).
  bool validate_and_save(bool counts) {
    const auto t0 = Clock::now();
    const std::map<std::string, double> vm = validate_on_rank0();
    check_finite(vm);
    res_.last_valid = vm;
    progress_.validation_row(state_.step, vm);
    const bool stop =
        counts && (reached_target(vm, seconds_since(t0)) || stop_rule_.no_improvement(vm, state_));
    LoopState snap = state_;
    snap.elapsed = elapsed();
    const auto generators = comm_.allgather(generator_states(task_));
    if (rank_ == 0)  // rank 0 alone writes files
      checkpoints_.save(snap, generators, step_.optimizer(), progress_.rows());
    last_valid_step_ = state_.step;
    progress_.validated(state_.step, task_.metric_names, vm, t0);
    if (const std::string why = stop_rule_.why_stopped(res_, state_, stop); !why.empty()) say(why);
    if (stop && !res_.reached_target) res_.stopped_early = true;
    return stop;
  }

  // A run whose validation is not finite must not end "successfully" (nor overwrite the last
  // good state with this one).
  void check_finite(const std::map<std::string, double>& vm) const {
    for (auto& [name, v] : vm)
      if (!std::isfinite(v))
        fail("train: validation " + name + " is " + std::to_string(v) + " at step " +
             std::to_string(state_.step) + " (the last good state is in '" + state_path() + "')");
  }

  // this_valid_s: the seconds this validation took, not training time.
  bool reached_target(const std::map<std::string, double>& vm, double this_valid_s) {
    const double wall = progress_.since_start();
    return stop_rule_.reached_target(vm, state_.step, wall,
                                     wall - progress_.valid_seconds() - this_valid_s, res_);
  }

  const TrainTask& task_;
  const LoopOptions& options_;
  Communicator& comm_;
  const bool resume_;
  const int rank_, ranks_;
  OptimizerStep step_;
  Checkpoints checkpoints_;
  LoopState state_;
  LoopResult res_;
  Progress progress_;
  StopRule stop_rule_;
  int64_t last_valid_step_ = -1;
};

}  // namespace

static void check_loop_rest(const LoopOptions& o);

void check_loop_options(const LoopOptions& o) {
  if (!(o.minutes >= 0) || !std::isfinite(o.minutes))
    fail("train: minutes must be a finite number >= 0");
  if (o.steps <= 0 && !(o.minutes > 0))
    fail("train: give a step budget (steps) or a time budget (minutes)");
  if (o.valid_every < 1 || o.log_every < 1) fail("train: valid_every and log_every must be >= 1");
  if (o.patience < 0) fail("train: patience must be >= 0");
  if (!(o.min_delta >= 0) || !std::isfinite(o.min_delta))
    fail("train: min_delta must be a finite number >= 0");
  if (!(o.lr >= 0) || !std::isfinite(o.lr))
    fail("train: lr must be a finite number >= 0 (0: the Noam schedule)");
  if (!(o.lr_factor > 0) || !std::isfinite(o.lr_factor))
    fail("train: lr_factor must be a finite number > 0");
  if (o.optimizer != "adam" && o.optimizer != "adamw")
    fail("train: optimizer must be adam or adamw, got '" + o.optimizer + "'");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay))
    fail("train: weight_decay must be a finite number >= 0");
  if (!(o.min_lr >= 0) || !std::isfinite(o.min_lr))
    fail("train: min_lr must be a finite number >= 0");
  if (o.decay_steps < 0) fail("train: decay_steps must be >= 0 (0: the step budget)");
  if (o.d_model < 1) fail("train: d_model must be >= 1");
  const bool noam = o.schedule == "noam" || (o.schedule == "auto" && o.lr == 0);
  if (noam) {
    if (o.warmup < 1) fail("train: warmup must be >= 1 for the Noam schedule");
    if (o.schedule == "noam" && o.lr > 0)
      fail(
          "train: lr is the peak of the cosine and constant schedules; the Noam schedule is "
          "scaled by lr_factor instead");
  } else if (o.schedule == "cosine" || o.schedule == "constant") {
    if (o.warmup < 0) fail("train: warmup must be >= 0");
    if (!(o.lr > 0))
      fail("train: schedule " + o.schedule + " needs lr > 0 (its peak learning rate)");
  } else if (o.schedule != "auto") {
    fail("train: schedule must be noam, cosine or constant, got '" + o.schedule + "'");
  }
  if (o.schedule != "cosine") return check_loop_rest(o);
  if (o.min_lr > o.lr)
    fail("train: min_lr (" + fmt_num(o.min_lr) + ") must not exceed lr (" + fmt_num(o.lr) + ")");
  const int64_t total = o.decay_steps > 0 ? o.decay_steps : o.steps;
  if (total <= 0) fail("train: schedule cosine decays over the step budget: give steps");
  if (total <= o.warmup)
    fail("train: schedule cosine needs more steps (" + std::to_string(total) +
         ") than warmup steps (" + std::to_string(o.warmup) + ")");
  check_loop_rest(o);
}

// The checks after the optimizer's and the schedule's.
static void check_loop_rest(const LoopOptions& o) {
  if (!(o.clip > 0) || !std::isfinite(o.clip))
    fail("train: the gradient clip must be a finite number > 0");
  if (!(o.bucket_mb > 0) || !(o.bucket_mb <= 4096))
    fail("train: the gradient bucket size must be in (0, 4096] MiB");
}

Schedule loop_schedule(const LoopOptions& o) {
  check_loop_options(o);
  if (o.schedule == "cosine")
    return Schedule::cosine(o.lr, o.min_lr, o.warmup, o.decay_steps > 0 ? o.decay_steps : o.steps);
  if (o.schedule == "constant") return Schedule::constant(o.lr, o.warmup);
  if (o.schedule == "auto" && o.lr > 0) return Schedule::constant(o.lr, 0);
  return Schedule::noam(o.lr_factor, o.d_model, o.warmup);
}

nlohmann::json loop_recipe(const LoopOptions& o) {
  return {{"optimizer", o.optimizer},
          {"weight_decay", o.weight_decay},
          {"schedule", loop_schedule(o).to_json()},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"adam_eps", o.adam_eps},
          {"clip", o.clip}};
}

void apply_recipe(const nlohmann::json& recipe, LoopOptions& o, const std::string& where) {
  LoopOptions n = o;
  n.optimizer = json_field<std::string>(recipe, "optimizer", where);
  n.weight_decay = json_field<double>(recipe, "weight_decay", where);
  if (!recipe.contains("schedule") || !recipe["schedule"].is_object())
    fail(where + ": no 'schedule' object");
  const nlohmann::json& s = recipe["schedule"];
  const std::string sw = where + ": 'schedule'";
  n.schedule = json_field<std::string>(s, "schedule", sw);
  n.warmup = json_field<int64_t>(s, "warmup", sw);
  if (n.schedule == "noam") {
    n.lr = 0;
    n.lr_factor = json_field<double>(s, "factor", sw);
    n.d_model = json_field<int64_t>(s, "d_model", sw);
  } else {
    n.lr = json_field<double>(s, "lr", sw);
    if (n.schedule == "cosine")
      n.min_lr = json_field<double>(s, "min_lr", sw),
      n.decay_steps = json_field<int64_t>(s, "total", sw);
  }
  o = n;
}

bool newest_is_best(const std::vector<MetricsRow>& rows, const std::string& metric,
                    bool higher_is_better) {
  if (rows.empty() || !rows.back().valid.count(metric)) return false;
  const double newest = rows.back().valid.at(metric);
  for (size_t i = 0; i + 1 < rows.size(); ++i) {
    auto it = rows[i].valid.find(metric);
    if (it != rows[i].valid.end() && (higher_is_better ? it->second > newest : it->second < newest))
      return false;
  }
  return true;
}

std::vector<int64_t> shuffled_order(int64_t n, Generator& gen) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[gen.below((uint64_t)i + 1)]);
  return order;
}

LoopResult train_loop(const TrainTask& task, const LoopOptions& o) {
  Communicator& comm = o.comm ? *o.comm : world_communicator();
  bool resume = false;
  std::optional<RunLock> lock;  // rank 0 alone writes the run
  on_every_rank(comm, [&] {
    check_task(task, o, comm.size());
    if (comm.rank() == 0) {
      create_run_directory(o.run_dir);
      lock.emplace(o.run_dir);
      remove_stale_temp_files(o.run_dir);  // left by a run killed inside a save
      clean_checkpoints(o.run_dir,
                        o.resume);  // what a killed commit left; a fresh run's predecessor
    }
  });
  on_every_rank(comm, [&] { resume = o.resume && has_checkpoint(o.run_dir); });
  return Loop(task, o, comm, resume).run();
}

}  // namespace graft::train
