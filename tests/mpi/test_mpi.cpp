// Data-parallel training (train::train_loop over MPI), run by ctest as `mpirun -np 2 test_mpi`
// (tests/CMakeLists.txt): the ranks train the same model as one process, deterministically,
// resume exactly (also from and to another rank count), and refuse bad input on every rank before
// any step. The cases of suite `failures` are disabled here; failures.sh runs them one at a time
// to check that a rank that throws or is killed ends the job instead of hanging it.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "graft/models/transformer.h"
#include "graft/nn/train/communicator.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using graft::testing::names;
namespace fs = std::filesystem;

namespace {

train::Communicator& world() { return train::world_communicator(); }

struct Batch {
  Tensor src, tgt_in, tgt_out;  // (rows, 8) int64, padded with 0
  int64_t tokens = 0;           // non-pad targets
};

// `count` batches of `rows` random sentence pairs, 2 to 7 tokens each, ids 4..vocab-1; the
// targets are BOS (2) + y and y + EOS (3).
std::vector<Batch> make_batches(int count, int64_t rows, int64_t vocab) {
  constexpr int64_t T = 8;
  Generator g(7);
  std::vector<Batch> out;
  for (int b = 0; b < count; ++b) {
    std::vector<int64_t> src((size_t)(rows * T), 0), tin(src), tout(src);
    Batch batch;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t ls = 2 + (int64_t)g.below(6), lt = 2 + (int64_t)g.below(6);
      for (int64_t t = 0; t < ls; ++t)
        src[(size_t)(r * T + t)] = 4 + (int64_t)g.below((uint64_t)vocab - 4);
      tin[(size_t)(r * T)] = 2;
      for (int64_t t = 0; t < lt; ++t) {
        const int64_t y = 4 + (int64_t)g.below((uint64_t)vocab - 4);
        tout[(size_t)(r * T + t)] = tin[(size_t)(r * T + t + 1)] = y;
      }
      tout[(size_t)(r * T + lt)] = 3;
      batch.tokens += lt + 1;
    }
    batch.src = from_vector(src, {rows, T}, DType::i64);
    batch.tgt_in = from_vector(tin, {rows, T}, DType::i64);
    batch.tgt_out = from_vector(tout, {rows, T}, DType::i64);
    out.push_back(batch);
  }
  return out;
}

models::TransformerConfig tiny_config(double dropout) {
  models::TransformerConfig c;
  c.vocab = 16, c.d_model = 16, c.heads = 2, c.d_ff = 32, c.enc_layers = 1, c.dec_layers = 1,
  c.max_len = 16;
  c.dropout = dropout;
  c.dtype = DType::f64;  // so that the order of the sums is the only difference, far below 1e-5
  return c;
}

// A tiny encoder-decoder Transformer in float64 on padded batches of `rows` rows (5: shards of 3
// and 2 rows with different token counts), label smoothing 0.1.
struct Tiny {
  models::Transformer model;
  std::vector<Batch> batches;
  train::TrainTask task;

  explicit Tiny(double dropout, int64_t rows = 5, int count = 4)
      : model(tiny_config(dropout)), batches(make_batches(count, rows, 16)) {
    task.model = &model;
    task.batches = count;
    task.loss = [this](int64_t i, train::Shard s) {
      const Batch& b = batches[(size_t)i];
      const Tensor out = train::shard_of(b.tgt_out, s);
      const auto ids = out.to_vector<int64_t>();
      const int64_t targets =
          (int64_t)std::count_if(ids.begin(), ids.end(), [](int64_t t) { return t != 0; });
      return train::shard_loss(
          model.loss(train::shard_of(b.src, s), train::shard_of(b.tgt_in, s), out, 0.1), targets,
          b.tokens);
    };
    task.examples = [this](int64_t i) { return batches[(size_t)i].src.size(0); };
    task.tokens = [this](int64_t i) { return batches[(size_t)i].tokens; };
    task.metric_names = {"loss"};
    task.validate = [this]() -> std::map<std::string, double> {
      double s = 0;
      for (const Batch& b : batches) s += model.loss(b.src, b.tgt_in, b.tgt_out).item();
      return {{"loss", s / (double)batches.size()}};
    };
    task.generators = {&model.dropout_gen};
    task.data_fingerprint = "tiny " + std::to_string(rows) + "x" + std::to_string(count);
  }
};

train::LoopOptions options(const fs::path& dir, int64_t steps, train::Communicator& comm) {
  train::LoopOptions o;
  o.run_dir = dir.string();
  o.steps = steps;
  o.lr = 3e-3;
  o.valid_every = 10;
  o.quiet = true;
  o.comm = &comm;
  o.bucket_mb = 0.01;  // several buckets (the model has ~80 KB of gradients), so overlap happens
  return o;
}

// A run directory shared by the ranks, in a directory that rank 0 makes (and removes at its
// exit) on the first call, which is on every rank; rank 0 empties it.
fs::path shared_dir(const std::string& name) {
  static const std::unique_ptr<graft::testing::TempDir> mine =
      world().rank() == 0 ? std::make_unique<graft::testing::TempDir>("mpi") : nullptr;
  static const fs::path shared = world().broadcast_string(mine ? mine->path.string() : "", 0);
  const fs::path d = shared / name;
  train::on_rank0(world(), [&] { fs::remove_all(d); });
  return d;
}
// A directory of this rank's own, for a single-process run.
fs::path own_dir(const std::string& name) {
  static const graft::testing::TempDir mine("mpi_rank" + std::to_string(world().rank()));
  return mine.path / name;
}

// The world's collective timeout for a scope.
struct TimeoutFor {
  double saved = world().collective_timeout();
  explicit TimeoutFor(double seconds) { world().set_collective_timeout(seconds); }
  ~TimeoutFor() { world().set_collective_timeout(saved); }
};

// GRAFT_COLLECTIVE_TIMEOUT for a scope (unset: nullptr).
struct TimeoutVariable {
  const char* name = "GRAFT_COLLECTIVE_TIMEOUT";
  std::optional<std::string> saved =
      std::getenv(name) ? std::optional<std::string>(std::getenv(name)) : std::nullopt;
  explicit TimeoutVariable(const char* value) { value ? setenv(name, value, 1) : unsetenv(name); }
  ~TimeoutVariable() { saved ? setenv(name, saved->c_str(), 1) : unsetenv(name); }
};

// One process's run of `steps` steps on the same batches (the reference).
std::unique_ptr<Tiny> one_process(const std::string& name, double dropout, int64_t steps) {
  auto t = std::make_unique<Tiny>(dropout);
  train::SingleProcessCommunicator one;
  train::train_loop(t->task, options(own_dir(name), steps, one));
  return t;
}

// Every parameter element of a within `rel` of b's, relative to the element's size (at least
// 1e-3: elements near zero, such as biases that start at 0, compare absolutely).
void check_close(const nn::Module& a, const nn::Module& b, double rel) {
  const nn::NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  BOOST_REQUIRE_EQUAL(pa.size(), pb.size());
  double worst = 0;
  std::string where;
  for (size_t k = 0; k < pa.size(); ++k) {
    const auto va = pa[k].second.to_vector<double>(), vb = pb[k].second.to_vector<double>();
    for (size_t i = 0; i < va.size(); ++i) {
      const double e = std::fabs(va[i] - vb[i]) / std::max(std::fabs(vb[i]), 1e-3);
      if (!(e <= worst)) worst = e, where = pa[k].first;
    }
  }
  BOOST_CHECK_MESSAGE(worst <= rel,
                      "worst relative difference " << worst << " (in " << where << ") > " << rel);
  BOOST_TEST_MESSAGE("worst relative difference " << worst << " (in " << where << ")");
}

void check_identical(const nn::Module& a, const nn::Module& b) {
  const nn::NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  BOOST_REQUIRE_EQUAL(pa.size(), pb.size());
  for (size_t k = 0; k < pa.size(); ++k)
    BOOST_CHECK_MESSAGE(pa[k].second.to_vector<double>() == pb[k].second.to_vector<double>(),
                        pa[k].first << " differs");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(data_parallel)

// The ranks' model after 20 steps is one process's on the same global batches: the shards' loss
// parts add up to the batch's loss over its target tokens, the gradient sums to the batch's.
BOOST_AUTO_TEST_CASE(same_model_as_one_process) {
  BOOST_REQUIRE_MESSAGE(world().size() >= 2, "run under mpirun -np 2 (ctest does)");
  Tiny dp(0.0);
  const train::LoopResult r = train::train_loop(dp.task, options(shared_dir("same"), 20, world()));
  BOOST_TEST(r.ranks == world().size());
  BOOST_TEST(r.buckets > 1u);
  BOOST_TEST(r.last_step == 20);
  auto ref = one_process("same_ref", 0.0, 20);
  check_close(dp.model, ref->model, 1e-5);

  // The same with the sums started after backward (no overlap).
  Tiny late(0.0);
  train::LoopOptions o = options(shared_dir("same_late"), 20, world());
  o.overlap = false;
  train::train_loop(late.task, o);
  check_close(late.model, ref->model, 1e-5);
}

// With dropout, two runs on the same (seed, ranks) are bit-identical.
BOOST_AUTO_TEST_CASE(dropout_runs_are_deterministic) {
  Tiny a(0.1), b(0.1);
  const train::LoopResult ra = train::train_loop(a.task, options(shared_dir("det_a"), 20, world()));
  const train::LoopResult rb = train::train_loop(b.task, options(shared_dir("det_b"), 20, world()));
  BOOST_TEST(ra.losses == rb.losses);
  check_identical(a.model, b.model);
  // Each rank draws other masks: the ranks' dropout streams differ.
  const auto mine = a.model.dropout_gen.state();
  Tensor s = full({1}, (double)(mine >> 11), DType::f64);
  world().broadcast(s, 0);
  if (world().rank() != 0) BOOST_TEST(s.item() != (double)(mine >> 11));
}

// Stopped at step 10 and resumed to 20 on the same ranks: bit-identical to 20 steps at once.
BOOST_AUTO_TEST_CASE(resume_is_bit_exact) {
  Tiny whole(0.1);
  const train::LoopResult rw =
      train::train_loop(whole.task, options(shared_dir("whole"), 20, world()));
  const fs::path dir = shared_dir("split");
  {
    Tiny first(0.1);
    train::train_loop(first.task, options(dir, 10, world()));
  }
  manual_seed(99);  // whatever happens in between is restored from the state
  Tiny rest(0.1);
  train::LoopOptions o = options(dir, 20, world());
  o.resume = true;
  const train::LoopResult rr = train::train_loop(rest.task, o);
  BOOST_TEST(rr.first_step == 10);
  BOOST_TEST(rr.losses == std::vector<double>(rw.losses.begin() + 10, rw.losses.end()));
  check_identical(rest.model, whole.model);
}

// A run saved on 2 ranks resumes in one process, and one saved in one process resumes on 2:
// without dropout both end at one process's 20 steps (within the order of the sums).
BOOST_AUTO_TEST_CASE(resume_with_another_rank_count) {
  auto ref = one_process("count_ref", 0.0, 20);
  const fs::path two_to_one = shared_dir("two_to_one");
  {
    Tiny first(0.0);
    train::train_loop(first.task, options(two_to_one, 10, world()));
  }
  train::on_rank0(world(), [&] {
    Tiny rest(0.0);
    train::SingleProcessCommunicator one;
    train::LoopOptions o = options(two_to_one, 20, one);
    o.resume = true;
    BOOST_TEST(train::train_loop(rest.task, o).first_step == 10);
    check_close(rest.model, ref->model, 1e-5);
  });

  const fs::path one_to_two = shared_dir("one_to_two");
  train::on_rank0(world(), [&] {
    Tiny first(0.0);
    train::SingleProcessCommunicator one;
    train::train_loop(first.task, options(one_to_two, 10, one));
  });
  Tiny rest(0.0);
  train::LoopOptions o = options(one_to_two, 20, world());
  o.resume = true;
  BOOST_TEST(train::train_loop(rest.task, o).first_step == 10);
  check_close(rest.model, ref->model, 1e-5);
}

// Data too small for the ranks, or ranks that disagree on the data or the options: an error on
// every rank before any step (no train state written).
BOOST_AUTO_TEST_CASE(bad_input_is_an_error_on_every_rank) {
  const int rank = world().rank();
  {
    Tiny t(0.0, /*rows=*/1);
    const fs::path dir = shared_dir("too_small");
    BOOST_CHECK_EXCEPTION(
        train::train_loop(t.task, options(dir, 20, world())), Error,
        [](const Error& e) { return names(e, "the data is too small for 2 ranks"); });
    BOOST_TEST(!fs::exists(dir / "train_state.safetensors"));
  }
  {
    Tiny t(0.0);
    if (rank == 1) t.task.data_fingerprint = "other data";
    const fs::path dir = shared_dir("disagree_data");
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, options(dir, 20, world())), Error,
                          [](const Error& e) {
                            return names(e, "the ranks disagree") && names(e, "rank 1 differs");
                          });
    BOOST_TEST(!fs::exists(dir / "train_state.safetensors"));
  }
  {
    Tiny t(0.0);
    if (rank == 1) t.task.run_config = "{\"heads\": 4}";  // a model option that keeps the shapes
    BOOST_CHECK_EXCEPTION(
        train::train_loop(t.task, options(shared_dir("disagree_config"), 20, world())), Error,
        [](const Error& e) { return names(e, "rank 1 differs from rank 0"); });
  }
  {
    Tiny t(0.0);
    const fs::path dir = shared_dir("disagree_steps");
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, options(dir, rank == 1 ? 21 : 20, world())),
                          Error,
                          [](const Error& e) { return names(e, "rank 1 differs from rank 0"); });
  }
  {
    Tiny t(0.0);
    train::LoopOptions o = options(shared_dir("bad_option"), 20, world());
    if (rank == 1) o.bucket_mb = 0;
    // Rank 1 its own error; rank 0 the same, naming rank 1.
    BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [rank](const Error& e) {
      return names(e, "the gradient bucket size must be in (0, 4096] MiB") &&
             (rank == 1 || names(e, "rank 1 of 2: "));
    });
  }
}

// Ranks that resume from different train states (run directories that are not one shared
// directory) are refused before any step.
BOOST_AUTO_TEST_CASE(resume_from_different_states_is_an_error) {
  const fs::path at10 = shared_dir("states_10"), at20 = shared_dir("states_20");
  {
    Tiny a(0.0), b(0.0);
    train::train_loop(a.task, options(at10, 10, world()));
    train::train_loop(b.task, options(at20, 20, world()));
  }
  Tiny t(0.0);
  train::LoopOptions o = options(world().rank() == 0 ? at10 : at20, 30, world());
  o.resume = true;
  BOOST_CHECK_EXCEPTION(train::train_loop(t.task, o), Error, [](const Error& e) {
    return names(e, "resume: rank 1 loaded another train state than rank 0 (step 20 against 10)");
  });
}

// The watchdog's timeout: a number of seconds in [0, 10^6], from GRAFT_COLLECTIVE_TIMEOUT when set
// (10^10 s once overflowed the deadline into the past and ended a healthy job at once).
BOOST_AUTO_TEST_CASE(collective_timeout_option) {
  {
    TimeoutVariable unset(nullptr);
    BOOST_TEST(train::collective_timeout_from_environment() ==
               train::Communicator::kDefaultCollectiveTimeout);
  }
  {
    TimeoutVariable v("2.5");
    BOOST_TEST(train::collective_timeout_from_environment() == 2.5);
  }
  {
    TimeoutVariable v("1e6");
    BOOST_TEST(train::collective_timeout_from_environment() == 1e6);
  }
  for (const char* bad : {"-1", "ten", "5s", "nan", "inf", "1e10", "1000000.5"}) {
    TimeoutVariable v(bad);
    BOOST_CHECK_EXCEPTION(
        train::collective_timeout_from_environment(), Error, [bad](const Error& e) {
          return names(e, std::string("GRAFT_COLLECTIVE_TIMEOUT='") + bad +
                              "' is not a number of seconds in [0, 1000000] (0: wait forever)");
        });
  }
  TimeoutFor t(0);  // restores the world's timeout
  BOOST_TEST(world().collective_timeout() == 0.0);
  for (double bad : {-1.0, (double)NAN, (double)INFINITY, 1e10, 1e6 + 1})
    BOOST_CHECK_EXCEPTION(world().set_collective_timeout(bad), Error, [](const Error& e) {
      return names(e, "the collective timeout must be a number of seconds in [0, 1000000]");
    });
  BOOST_TEST(world().collective_timeout() == 0.0);
  world().set_collective_timeout(1e6);
  BOOST_TEST(world().collective_timeout() == 1e6);
}

// A rank slower than the others by less than the timeout (1.5 s late at its third step, against
// a timeout of 4 s) is waited for: the run ends as one process's does.
BOOST_AUTO_TEST_CASE(a_slow_rank_within_the_timeout_is_waited_for) {
  TimeoutFor t(4);
  Tiny dp(0.0);
  auto good = dp.task.loss;
  int calls = 0;
  dp.task.loss = [&](int64_t i, train::Shard s) {
    if (world().rank() == 1 && ++calls == 3)
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return good(i, s);
  };
  BOOST_TEST(train::train_loop(dp.task, options(shared_dir("slow"), 20, world())).last_step == 20);
  check_close(dp.model, one_process("slow_ref", 0.0, 20)->model, 1e-5);
}

BOOST_AUTO_TEST_SUITE_END()

// Run one at a time by failures.sh (disabled otherwise): rank 1 fails at its third step, in its
// loss (rank 0 then waits for it in the loss's sum) or in its backward (with sums in flight).
BOOST_AUTO_TEST_SUITE(failures, *boost::unit_test::disabled())

BOOST_AUTO_TEST_CASE(rank_throws) {
  Tiny t(0.0);
  auto good = t.task.loss;
  int calls = 0;
  t.task.loss = [&](int64_t i, train::Shard s) {
    if (world().rank() == 1 && ++calls == 3) fail("a failure injected on rank 1");
    return good(i, s);
  };
  train::train_loop(t.task, options(shared_dir("throws"), 20, world()));
}

// An op that passes its input through and throws in backward on rank 1: the failure comes while
// rank 1 has gradient sums in flight (the op is the first on the tape, so its backward runs last).
GRAFT_DECLARE_OP("fail_in_backward_on_rank1", "test");
Tensor fail_in_backward_on_rank1(const Tensor& x) {
  Tensor y = x.detach();
  autograd::record("fail_in_backward_on_rank1", {x}, {y}, {},
                   [](const autograd::Ctx&, const Tensors& dout) -> Tensors {
                     if (world().rank() == 1) fail("a failure injected in rank 1's backward");
                     return {dout[0]};
                   });
  return y;
}

BOOST_AUTO_TEST_CASE(rank_throws_in_backward) {
  Tiny t(0.0);
  auto good = t.task.loss;
  int calls = 0;
  t.task.loss = [&](int64_t i, train::Shard s) {
    if (++calls < 3) return good(i, s);
    const Tensor first = t.model.named_parameters()[0].second;
    const Tensor through = fail_in_backward_on_rank1(first);
    return add(good(i, s), affine(sum(through), 0.0, 0.0));
  };
  train::train_loop(t.task, options(shared_dir("throws_in_backward"), 20, world()));
}

// Rank `stopper` stops itself (SIGSTOP) at its third step, as `kill -STOP` would: the other
// rank's watchdog ends the job after the collective timeout.
void stop_at_third_step(int stopper, const std::string& name) {
  Tiny t(0.0);
  auto good = t.task.loss;
  int calls = 0;
  t.task.loss = [&](int64_t i, train::Shard s) {
    if (world().rank() == stopper && ++calls == 3) raise(SIGSTOP);
    return good(i, s);
  };
  train::train_loop(t.task, options(shared_dir(name), 20, world()));
}

// The timeout set in the program (2 s).
BOOST_AUTO_TEST_CASE(rank_stopped) {
  TimeoutFor t(2);
  stop_at_third_step(1, "stopped");
}

// The timeout from GRAFT_COLLECTIVE_TIMEOUT (failures.sh sets 2 s).
BOOST_AUTO_TEST_CASE(rank0_stopped) { stop_at_third_step(0, "stopped0"); }

BOOST_AUTO_TEST_CASE(rank_killed) {
  Tiny t(0.0);
  auto good = t.task.loss;
  int calls = 0;
  t.task.loss = [&](int64_t i, train::Shard s) {
    if (world().rank() == 1 && ++calls == 3) kill(getpid(), SIGKILL);
    return good(i, s);
  };
  train::train_loop(t.task, options(shared_dir("killed"), 20, world()));
}

BOOST_AUTO_TEST_SUITE_END()
