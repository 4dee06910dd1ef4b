// The library training loop (nn/train/trainer.h) on a toy task: it learns, resumes bit-exactly,
// stops early, and refuses a non-finite loss or an empty task with a message naming the cause.
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>

#include <unistd.h>

#include "graft/nn/layers.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"
#include "tests/toy_task.h"

using namespace graft;
using graft::testing::names;
namespace fs = std::filesystem;

namespace {

using Toy = graft::testing::ToyTask;

train::LoopOptions opts(const fs::path& dir, int64_t steps) {
  train::LoopOptions o;
  o.run_dir = dir.string();
  o.steps = steps;
  o.lr = 0.05;
  o.valid_every = 10;
  o.log_every = 5;
  o.quiet = true;
  return o;
}

// A directory of its own under this process's temporary directory (removed at exit).
fs::path fresh_dir(const std::string& name) {
  static const graft::testing::TempDir root("trainer");
  fs::path d = root.path / name;
  fs::remove_all(d);
  return d;
}

// AdamW with weight decay and warmup then cosine decay to a floor at step 30.
train::LoopOptions adamw_cosine(const fs::path& dir, int64_t steps) {
  train::LoopOptions o = opts(dir, steps);
  o.optimizer = "adamw";
  o.weight_decay = 0.1;
  o.schedule = "cosine";
  o.lr = 0.05;
  o.min_lr = 0.005;
  o.warmup = 5;
  o.decay_steps = 30;
  return o;
}

// Rank 0 of two that agree on everything (one process plays both): enough for the checks the
// loop makes before its first step. The single-process collectives, with a second rank.
struct TwoRanks final : train::SingleProcessCommunicator {
  int size() const override { return 2; }
  std::string name() const override { return "two ranks (test)"; }
  std::vector<std::vector<uint64_t>> allgather(const std::vector<uint64_t>& v) override {
    return {v, v};
  }
  [[noreturn]] void abort(const std::string& m, int) override { fail(m); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(trainer)

BOOST_AUTO_TEST_CASE(learns_and_writes_metrics) {
  manual_seed(1);
  Toy t(3);
  const fs::path dir = fresh_dir("learns");
  std::vector<train::MetricsRow> seen;  // what on_validated was handed last
  t.task.on_validated = [&](const train::Validated& v) { seen = v.rows; };
  train::LoopResult r = train::train_loop(t.task, opts(dir, 200));
  BOOST_TEST(r.last_step == 200);
  BOOST_TEST(r.last_valid.at("mse") < 1e-3);
  BOOST_TEST(r.losses.front() > 10 * r.losses.back());
  std::ifstream csv(dir / "metrics.csv");
  std::string header;
  std::getline(csv, header);
  BOOST_TEST(header == "step,train_loss,lr,tokens_per_s,valid_mse");
  BOOST_TEST(fs::exists(dir / "train_state.safetensors"));
  // The rows handed to on_validated hold exactly the numbers of the file (what a resumed run
  // reads back): train loss and validation MSE of every row.
  size_t n = 0;
  for (std::string line; std::getline(csv, line); ++n) {
    BOOST_REQUIRE(n < seen.size());
    const size_t a = line.find(','), b = line.find(',', a + 1), last = line.rfind(',');
    BOOST_TEST(std::stoll(line) == seen[n].step);
    BOOST_TEST(std::stod(line.substr(a + 1, b - a - 1)) == seen[n].train_loss);
    if (last + 1 < line.size())
      BOOST_TEST(std::stod(line.substr(last + 1)) == seen[n].valid.at("mse"));
  }
  BOOST_TEST(n == seen.size());
}

// The rule for the best weights: the newest validation must be at least as good as every
// earlier one (a tie takes the newer weights), upwards or downwards.
BOOST_AUTO_TEST_CASE(newest_is_best_by_the_stop_metric) {
  auto row = [](int64_t step, double f1) {
    train::MetricsRow r;
    r.step = step;
    if (f1 >= 0) r.valid["macro_f1"] = f1;
    return r;
  };
  BOOST_TEST(train::newest_is_best({row(10, 0.5)}, "macro_f1", true));
  BOOST_TEST(train::newest_is_best({row(10, 0.5), row(15, -1), row(20, 0.6)}, "macro_f1", true));
  BOOST_TEST(train::newest_is_best({row(10, 0.5), row(20, 0.5)}, "macro_f1",
                                   true));  // a tie takes the newer
  BOOST_TEST(!train::newest_is_best({row(10, 0.7), row(20, 0.6)}, "macro_f1", true));
  BOOST_TEST(
      train::newest_is_best({row(10, 0.7), row(20, 0.6)}, "macro_f1", false));  // lower is better
  BOOST_TEST(!train::newest_is_best({row(10, 0.6), row(20, 0.7)}, "macro_f1", false));
  BOOST_TEST(!train::newest_is_best({row(10, 0.7), row(20, -1)}, "macro_f1",
                                    true));  // no validation on the newest
  BOOST_TEST(!train::newest_is_best({}, "macro_f1", true));
}

BOOST_AUTO_TEST_CASE(resume_is_bit_exact) {
  manual_seed(1);
  Toy a(3);
  train::LoopResult whole = train::train_loop(a.task, opts(fresh_dir("whole"), 30));
  manual_seed(1);
  Toy b(3);
  const fs::path dir = fresh_dir("split");
  train::train_loop(b.task, opts(dir, 20));
  manual_seed(99);  // whatever happens in between is restored from the state
  Toy c(3);
  train::LoopOptions o = opts(dir, 30);
  o.resume = true;
  train::LoopResult rest = train::train_loop(c.task, o);
  BOOST_TEST(rest.first_step == 20);
  BOOST_TEST(rest.losses == std::vector<double>(whole.losses.begin() + 20, whole.losses.end()));
  BOOST_TEST(c.model.weight.to_vector<double>() == a.model.weight.to_vector<double>());
  BOOST_TEST(c.model.bias.to_vector<double>() == a.model.bias.to_vector<double>());
}

BOOST_AUTO_TEST_CASE(resume_is_bit_exact_with_adamw_and_cosine) {
  manual_seed(1);
  Toy a(3);
  std::vector<train::MetricsRow> rows;
  a.task.on_validated = [&](const train::Validated& v) { rows = v.rows; };
  train::LoopResult whole = train::train_loop(a.task, adamw_cosine(fresh_dir("cos_whole"), 30));
  // Warmup to the peak at step 5, then the floor at the last step (the rows every 5 steps).
  BOOST_REQUIRE_EQUAL(rows.size(), 6u);
  BOOST_TEST(rows[0].lr == 0.05);
  BOOST_TEST(rows[1].lr < 0.05);
  BOOST_TEST(rows[5].lr == 0.005);
  BOOST_TEST(whole.last_valid.at("mse") < whole.losses.front());
  manual_seed(1);
  Toy b(3);
  const fs::path dir = fresh_dir("cos_split");
  train::train_loop(b.task, adamw_cosine(dir, 20));
  manual_seed(99);
  Toy c(3);
  train::LoopOptions o = adamw_cosine(dir, 30);
  o.resume = true;
  train::LoopResult rest = train::train_loop(c.task, o);
  BOOST_TEST(rest.first_step == 20);
  BOOST_TEST(rest.losses == std::vector<double>(whole.losses.begin() + 20, whole.losses.end()));
  BOOST_TEST(c.model.weight.to_vector<double>() == a.model.weight.to_vector<double>());
  BOOST_TEST(c.model.bias.to_vector<double>() == a.model.bias.to_vector<double>());
  // A resume with another recipe would not continue the same run: refused, naming what differs.
  auto refuse = [&](auto set) {
    Toy d(3);
    train::LoopOptions other = adamw_cosine(dir, 40);
    other.resume = true;
    set(other);
    BOOST_CHECK_EXCEPTION(train::train_loop(d.task, other), Error, [](const Error& e) {
      return names(e, "the run was trained with") && names(e, "\"adamw\"");
    });
  };
  refuse([](train::LoopOptions& x) { x.weight_decay = 0.2; });
  refuse([](train::LoopOptions& x) { x.optimizer = "adam"; });
  refuse([](train::LoopOptions& x) { x.min_lr = 0.001; });
  refuse([](train::LoopOptions& x) { x.decay_steps = 0; });  // the horizon would become 40
}

// What a program saves in its config and restores on --resume: the same recipe back, whatever
// the options given now; a field missing is named.
BOOST_AUTO_TEST_CASE(recipe_round_trip) {
  const train::LoopOptions cos = adamw_cosine("unused", 20);
  for (const train::LoopOptions& o : {cos, opts("unused", 20)}) {
    const nlohmann::json r = train::loop_recipe(o);
    train::LoopOptions back = opts("unused", 99);
    back.lr_factor = 3, back.warmup = 77;
    train::apply_recipe(nlohmann::json::parse(r.dump()), back, "config");
    BOOST_TEST(train::loop_recipe(back) == r);
  }
  BOOST_TEST(train::loop_recipe(cos)["schedule"]["total"] == 30);  // decay_steps, not steps
  nlohmann::json bad = train::loop_recipe(cos);
  bad["schedule"].erase("min_lr");
  train::LoopOptions o = opts("unused", 20);
  BOOST_CHECK_EXCEPTION(train::apply_recipe(bad, o, "config"), Error, [](const Error& e) {
    return names(e, "config: 'schedule'") && names(e, "min_lr");
  });
}

BOOST_AUTO_TEST_CASE(warmup_then_constant) {
  manual_seed(1);
  Toy t(3);
  std::vector<train::MetricsRow> rows;
  t.task.on_validated = [&](const train::Validated& v) { rows = v.rows; };
  train::LoopOptions o = opts(fresh_dir("warm_const"), 20);
  o.schedule = "constant";
  o.warmup = 10;
  train::train_loop(t.task, o);
  BOOST_REQUIRE_EQUAL(rows.size(), 4u);
  BOOST_TEST(rows[0].lr == 0.025);  // step 5 of 10
  BOOST_TEST(rows[1].lr == 0.05);
  BOOST_TEST(rows[3].lr == 0.05);
}

// With a zero gradient AdamW only decays: the weight matrix by 1 - lr*wd a step, the bias (a
// vector) not at all. The task gives the loss of whole batches (loss_of_batch, no shards).
BOOST_AUTO_TEST_CASE(weight_decay_skips_biases_and_loss_of_batch) {
  manual_seed(1);
  Toy t(3);
  t.task.loss = nullptr;
  t.task.loss_of_batch = [&t](int64_t i) {
    return affine(mean(t.model.forward(t.xs[i])), 0.0, 0.0);
  };
  t.task.validate = []() -> std::map<std::string, double> { return {{"mse", 1.0}}; };
  const double w0 = t.model.weight.to_vector<double>()[0], b0 = t.model.bias.to_vector<double>()[0];
  train::LoopOptions o = opts(fresh_dir("decay_groups"), 2);
  o.optimizer = "adamw";
  o.weight_decay = 0.5;
  train::train_loop(t.task, o);
  BOOST_TEST(t.model.weight.to_vector<double>()[0] == w0 * (1 - 0.05 * 0.5) * (1 - 0.05 * 0.5));
  BOOST_TEST(t.model.bias.to_vector<double>()[0] == b0);

  // Such a task cannot be split across ranks; a task with both losses is ambiguous.
  TwoRanks two;
  train::LoopOptions on2 = opts(fresh_dir("two_ranks"), 2);
  on2.comm = &two;
  BOOST_CHECK_EXCEPTION(train::train_loop(t.task, on2), Error,
                        [](const Error& e) { return names(e, "cannot be split across 2 ranks"); });
  Toy both(3);
  both.task.loss_of_batch = t.task.loss_of_batch;
  BOOST_CHECK_EXCEPTION(
      train::train_loop(both.task, opts(fresh_dir("both"), 2)), Error,
      [](const Error& e) { return names(e, "gives both loss and loss_of_batch"); });
}

BOOST_AUTO_TEST_CASE(early_stopping_after_patience_validations) {
  manual_seed(1);
  Toy t(3);
  t.task.validate = []() -> std::map<std::string, double> {
    return {{"mse", 1.0}};
  };  // never improves
  train::LoopOptions o = opts(fresh_dir("early"), 1000);
  o.patience = 2;
  train::LoopResult r = train::train_loop(t.task, o);
  // Validations at 10 (the best), 20 and 30 (no better): stop at 30.
  BOOST_TEST(r.stopped_early);
  BOOST_TEST(r.last_step == 30);
  o.patience = 1;
  t.task.stop_metric = "bleu";
  BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [](const Error& e) {
    return names(e, "early stopping metric 'bleu' is not a validation metric");
  });
}

// Time to quality: the run stops at the first validation whose metric reaches stop_at, and says
// when; a target never reached leaves the run to its budget.
BOOST_AUTO_TEST_CASE(stop_at_a_target_metric) {
  manual_seed(1);
  Toy t(3);
  train::LoopOptions o = opts(fresh_dir("target"), 1000);
  o.stop_at = 0.01;  // mse: lower is better
  train::LoopResult r = train::train_loop(t.task, o);
  BOOST_TEST(r.reached_target);
  BOOST_TEST(r.last_step == r.target_step);
  BOOST_TEST(r.target_step % 10 == 0);
  BOOST_TEST(r.target_step < 1000);
  BOOST_TEST(r.last_valid.at("mse") <= 0.01);
  BOOST_TEST(r.seconds_to_target > 0.0);
  BOOST_TEST(r.seconds_to_target <= r.wall_seconds_to_target);
  BOOST_TEST(!r.stopped_early);
  Toy u(3);
  o = opts(fresh_dir("target_missed"), 40);
  o.stop_at = -1;  // unreachable
  r = train::train_loop(u.task, o);
  BOOST_TEST(!r.reached_target);
  BOOST_TEST(r.last_step == 40);
  u.task.stop_metric = "bleu";
  BOOST_CHECK_EXCEPTION(train::train_loop(u.task, o), Error, [](const Error& e) {
    return names(e, "metric 'bleu' is not a validation metric");
  });
}

// A validation that is not finite stops the run with an error naming the metric and the step.
BOOST_AUTO_TEST_CASE(non_finite_validation_is_an_error) {
  manual_seed(1);
  Toy t(3);
  t.task.validate = []() -> std::map<std::string, double> { return {{"mse", NAN}}; };
  BOOST_CHECK_EXCEPTION(
      train::train_loop(t.task, opts(fresh_dir("valid_nan"), 30)), Error,
      [](const Error& e) { return names(e, "train: validation mse is nan at step 10"); });
}

// With min_delta, improvements no larger than it do not reset the patience count.
BOOST_AUTO_TEST_CASE(early_stopping_min_delta) {
  manual_seed(1);
  Toy t(3);
  auto calls = std::make_shared<int>(0);
  // mse 1.0, 0.9, 0.85, 0.84, ...: the third and later gains are below 0.1.
  t.task.validate = [calls]() -> std::map<std::string, double> {
    const double v[] = {1.0, 0.9, 0.85, 0.84, 0.83, 0.82};
    return {{"mse", v[std::min((*calls)++, 5)]}};
  };
  train::LoopOptions o = opts(fresh_dir("min_delta"), 1000);
  o.patience = 2;
  o.min_delta = 0.095;
  train::LoopResult r = train::train_loop(t.task, o);
  // 10: first (best 1.0), 20: 0.9 counts (gain 0.1), 30: 0.85 and 40: 0.84 do not: stop at 40.
  BOOST_TEST(r.stopped_early);
  BOOST_TEST(r.last_step == 40);
  o.min_delta = -1;
  BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error,
                        [](const Error& e) { return names(e, "min_delta"); });
}

// A step whose gradient is not finite skips the update (the loss stays finite): the run goes on,
// saves, and its own state resumes exactly (the optimizer's step count is kept separately).
BOOST_AUTO_TEST_CASE(skipped_update_then_exact_resume) {
  auto poisoned = [](Toy& t) {
    auto good = t.task.loss;
    auto calls = std::make_shared<int>(0);
    t.task.loss = [&t, good, calls](int64_t i, train::Shard sh) {
      Tensor l = good(i, sh);
      if (++*calls != 7) return l;
      // + 0 * sqrt(w - w): 0 in the forward, 0 * inf = NaN in the gradient of w.
      Tensor z = sum(sqrt(sub(t.model.weight, t.model.weight.detach())));
      return add(l, mul(z, scalar(0.0, DType::f64)));
    };
  };
  manual_seed(1);
  Toy a(3);
  poisoned(a);
  train::LoopResult whole = train::train_loop(a.task, opts(fresh_dir("skip_whole"), 30));
  for (double l : whole.losses) BOOST_REQUIRE(std::isfinite(l));
  manual_seed(1);
  Toy b(3);
  poisoned(b);
  const fs::path dir = fresh_dir("skip_split");
  train::train_loop(b.task, opts(dir, 20));
  Toy c(3);
  train::LoopOptions o = opts(dir, 30);
  o.resume = true;
  train::LoopResult rest = train::train_loop(c.task, o);
  BOOST_TEST(rest.losses == std::vector<double>(whole.losses.begin() + 20, whole.losses.end()));
  BOOST_TEST(c.model.weight.to_vector<double>() == a.model.weight.to_vector<double>());
}

// An early stop survives a resume, and an extra validation at the end of a budget does not
// count toward it.
BOOST_AUTO_TEST_CASE(early_stop_is_final_and_budget_end_validation_does_not_count) {
  manual_seed(1);
  Toy t(3);
  t.task.validate = []() -> std::map<std::string, double> { return {{"mse", 1.0}}; };
  const fs::path dir = fresh_dir("early_resume");
  train::LoopOptions o = opts(dir, 25);  // validations at 10, 20 (cadence) and 25 (budget end)
  o.patience = 2;
  train::LoopResult r = train::train_loop(t.task, o);
  BOOST_TEST(!r.stopped_early);
  BOOST_TEST(r.last_step == 25);
  o.steps = 1000;
  o.resume = true;
  r = train::train_loop(t.task, o);  // 30 is the second validation without improvement
  BOOST_TEST(r.stopped_early);
  BOOST_TEST(r.last_step == 30);
  r = train::train_loop(t.task, o);
  BOOST_TEST(r.stopped_early);
  BOOST_TEST(r.last_step == 30);
  BOOST_TEST(r.losses.empty());
}

// The run's current train state with its trainer metadata edited (checksums made right again),
// committed as a new checkpoint beside the same metrics.csv: what a forged or damaged file
// that passes the checksums would hold.
void commit_edited_state(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  train::SafetensorsFile f = train::load_safetensors((dir / "train_state.safetensors").string());
  nlohmann::json trainer = nlohmann::json::parse(f.metadata.at("trainer"));
  edit(trainer);
  f.metadata["trainer"] = trainer.dump();
  f.metadata["metadata_checksum"] =
      train::text_checksum(f.metadata["trainer"] + '\n' + f.metadata.at("optimizer"));
  std::ifstream csv(dir / "metrics.csv");
  const std::string metrics((std::istreambuf_iterator<char>(csv)),
                            std::istreambuf_iterator<char>());
  train::CheckpointCommit c(dir.string(), 999);
  train::save_safetensors(c.path("train_state.safetensors"), f.tensors, f.metadata);
  train::atomic_write(c.path("metrics.csv"), [&](std::ostream& os) { os << metrics; });
  c.commit();
}

// A train state whose batch order is not a permutation of the batches (all zeros would train on
// one batch only) is refused, naming the file.
BOOST_AUTO_TEST_CASE(batch_order_must_be_a_permutation) {
  manual_seed(1);
  Toy t(3);
  const fs::path dir = fresh_dir("order");
  train::train_loop(t.task, opts(dir, 10));
  commit_edited_state(dir, [](nlohmann::json& j) { j["order"] = std::vector<int64_t>(8, 0); });
  train::LoopOptions o = opts(dir, 20);
  o.resume = true;
  BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [](const Error& e) {
    return names(e, "batch order is not a permutation of the 8 batches");
  });
  commit_edited_state(
      dir, [](nlohmann::json& j) { j["order"] = std::vector<int64_t>{7, 6, 5, 4, 3, 2, 1, 0}; });
  BOOST_TEST(train::train_loop(t.task, o).last_step == 20);  // a permutation is fine
}

// Checkpoints are directories made current by one rename: a resume reads the train state and
// metrics.csv of the same checkpoint, and refuses a damaged metrics row or a run of the layout
// before them instead of continuing from a mix.
BOOST_AUTO_TEST_CASE(resume_reads_one_checkpoint) {
  manual_seed(1);
  Toy t(3);
  const fs::path dir = fresh_dir("one_checkpoint");
  train::train_loop(t.task, opts(dir, 20));
  BOOST_TEST(fs::is_symlink(dir / "checkpoint"));
  BOOST_TEST(fs::read_symlink(dir / "checkpoint").string() == "ckpt-00000020");
  BOOST_TEST(fs::read_symlink(dir / "metrics.csv").string() == "checkpoint/metrics.csv");
  std::vector<std::string> entries;
  for (auto& e : fs::directory_iterator(dir)) entries.push_back(e.path().filename().string());
  std::sort(entries.begin(), entries.end());
  BOOST_TEST(entries == (std::vector<std::string>{"checkpoint", "ckpt-00000020", "metrics.csv",
                                                  "train_state.safetensors", "writer.lock"}),
             boost::test_tools::per_element());
  train::LoopOptions o = opts(dir, 30);
  o.resume = true;
  {  // a metrics row that does not parse
    const std::string csv = (dir / "metrics.csv").string();
    std::ifstream in(csv);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    std::ofstream(csv, std::ios::trunc) << text << "25,garbage\n";
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [](const Error& e) {
      return names(e, "metrics.csv' line 6 is not a metrics row");
    });
    // Issue 47: a file whose header is not metrics.csv's (a one-line garbage file was read as
    // an empty history), and one that lost the rows up to the train state's step.
    std::ofstream(csv, std::ios::trunc) << "garbage\n";
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [](const Error& e) {
      return names(e, "metrics.csv' line 1 is not the header 'step,train_loss,lr,tokens_per_s");
    });
    std::ofstream(csv, std::ios::trunc) << text.substr(0, text.find('\n') + 1);
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [](const Error& e) {
      return names(e, "metrics.csv' has no row for step 20, the train state's");
    });
    std::ofstream(csv, std::ios::trunc) << text << "20,1,1,1,1\n";
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [](const Error& e) {
      return names(e, "step 20 does not follow step 20");
    });
    std::ofstream(csv, std::ios::trunc) << text;
  }
  {  // Issue 47: a run/<name> link replaced by one to a file outside the checkpoint is not read
    const fs::path outside = fresh_dir("outside_metrics");
    fs::create_directories(outside);
    std::ofstream(outside / "metrics.csv") << "garbage\n";
    fs::remove(dir / "metrics.csv");
    fs::create_symlink(outside / "metrics.csv", dir / "metrics.csv");
    BOOST_TEST(train::train_loop(t.task, o).last_step == 30);
    BOOST_TEST(fs::read_symlink(dir / "metrics.csv").string() == "checkpoint/metrics.csv");
  }
  // A run directory of graft 0.4: a plain train_state.safetensors, no checkpoint link.
  const fs::path old = fresh_dir("old_layout");
  fs::create_directories(old);
  fs::copy_file(dir / "train_state.safetensors", old / "train_state.safetensors");
  o.run_dir = old.string();
  BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error,
                        [](const Error& e) { return names(e, "were not committed as one unit"); });
}

// Issue 47, one writer per run: while a RunLock (another training, say) holds the run, a
// training into it fails at once, naming the run and the holder, and writes nothing there;
// once the holder is gone the same training runs.
BOOST_AUTO_TEST_CASE(a_second_writer_fails_at_once) {
  manual_seed(1);
  Toy t(3);
  const fs::path dir = fresh_dir("second_writer");
  fs::create_directories(dir);
  {
    const train::RunLock holder(dir.string());
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, opts(dir, 20)), Error, [&](const Error& e) {
      return names(e, "run directory '" + dir.string() + "' is being written by process " +
                          std::to_string(::getpid()));
    });
    BOOST_TEST(!fs::exists(dir / "checkpoint"));
  }
  BOOST_TEST(train::train_loop(t.task, opts(dir, 20)).last_step == 20);
}

// A run killed before its first checkpoint: --resume starts it at step 0 and ends where an
// uninterrupted run does; a fresh run in an old run's directory removes the old checkpoint.
BOOST_AUTO_TEST_CASE(resume_without_a_checkpoint_starts_at_step_0) {
  manual_seed(1);
  Toy a(3);
  train::LoopResult whole = train::train_loop(a.task, opts(fresh_dir("no_ckpt_whole"), 20));
  const fs::path dir = fresh_dir("no_ckpt");
  fs::create_directories(dir / "ckpt-00000010");  // an unfinished commit of the killed run
  std::ofstream(dir / "ckpt-00000010" / "train_state.safetensors") << "half";
  Toy b(3);
  train::LoopOptions o = opts(dir, 20);
  o.resume = true;
  train::LoopResult r = train::train_loop(b.task, o);
  BOOST_TEST(r.first_step == 0);
  BOOST_TEST(r.losses == whole.losses);
  BOOST_TEST(b.model.weight.to_vector<double>() == a.model.weight.to_vector<double>());
  BOOST_TEST(fs::read_symlink(dir / "checkpoint").string() == "ckpt-00000020");
  BOOST_TEST(!fs::exists(dir / "ckpt-00000010"));
  o.resume = false;
  o.steps = 5;
  o.valid_every = 100;
  Toy c(3);
  train::train_loop(c.task, o);
  BOOST_TEST(fs::read_symlink(dir / "checkpoint").string() == "ckpt-00000005");
  BOOST_TEST(!fs::exists(dir / "ckpt-00000020"));
}

BOOST_AUTO_TEST_CASE(non_finite_loss_and_empty_task_are_errors) {
  manual_seed(1);
  Toy t(3);
  auto good = t.task.loss;
  int calls = 0;
  t.task.loss = [&](int64_t i, train::Shard sh) {
    return ++calls == 3 ? affine(good(i, sh), NAN, 0.0) : good(i, sh);
  };
  BOOST_CHECK_EXCEPTION(train::train_loop(t.task, opts(fresh_dir("nan"), 10)), Error,
                        [](const Error& e) { return names(e, "the loss is nan at step 3"); });
  Toy e(3);
  e.task.batches = 0;
  BOOST_CHECK_EXCEPTION(train::train_loop(e.task, opts(fresh_dir("empty"), 10)), Error,
                        [](const Error& x) { return names(x, "no training batches"); });
  Toy ok(3);
  BOOST_CHECK_EXCEPTION(train::train_loop(ok.task, opts(fresh_dir("nobudget"), 0)), Error,
                        [](const Error& x) { return names(x, "give a step budget"); });
  // Options that would train forever or wrongly: a NaN time budget, a negative or NaN lr.
  auto refuse = [&](auto set, const std::string& part) {
    train::LoopOptions o = opts(fresh_dir("badopt"), 10);
    set(o);
    BOOST_CHECK_EXCEPTION(train::train_loop(ok.task, o), Error,
                          [&](const Error& x) { return names(x, part); });
  };
  refuse([](train::LoopOptions& o) { o.steps = 0, o.minutes = NAN; },
         "minutes must be a finite number");
  refuse([](train::LoopOptions& o) { o.minutes = NAN; }, "minutes must be a finite number");
  refuse([](train::LoopOptions& o) { o.lr = -1; }, "lr must be a finite number >= 0");
  refuse([](train::LoopOptions& o) { o.lr = NAN; }, "lr must be a finite number >= 0");
  refuse([](train::LoopOptions& o) { o.lr = 0, o.lr_factor = 0; }, "lr_factor must be");
  refuse([](train::LoopOptions& o) { o.optimizer = "sgd"; },
         "optimizer must be adam or adamw, got 'sgd'");
  refuse([](train::LoopOptions& o) { o.schedule = "linear"; },
         "schedule must be noam, cosine or constant");
  refuse([](train::LoopOptions& o) { o.schedule = "noam"; },
         "the Noam schedule is scaled by lr_factor");
  refuse([](train::LoopOptions& o) { o.schedule = "cosine", o.lr = 0; },
         "schedule cosine needs lr > 0");
  refuse([](train::LoopOptions& o) { o.schedule = "cosine", o.steps = 0, o.minutes = 1; },
         "give steps");
  refuse([](train::LoopOptions& o) { o.schedule = "cosine", o.warmup = 10; },
         "more steps (10) than warmup steps (10)");
  refuse([](train::LoopOptions& o) { o.schedule = "cosine", o.min_lr = 1; },
         "min_lr (1) must not exceed lr (0.05)");
  refuse([](train::LoopOptions& o) { o.weight_decay = -1; },
         "weight_decay must be a finite number >= 0");
  // A run directory that cannot be made is a graft::Error naming it, not a filesystem_error.
  const fs::path file = fresh_dir("blocked") / "a_file";
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "x";
  BOOST_CHECK_EXCEPTION(
      train::train_loop(ok.task, opts(file / "run", 10)), Error, [&](const Error& x) {
        return std::string(x.what()).find("run directory '" + (file / "run").string() +
                                          "': cannot create it: ") == 0;
      });
}

BOOST_AUTO_TEST_SUITE_END()
