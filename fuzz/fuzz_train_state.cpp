// Fuzz target: the train state's metadata, the part of a checkpoint --resume trusts most (step,
// epoch, batch order and position, generator states, optimizer state). The input is the trainer
// JSON, a NUL byte, the optimizer JSON; the target wraps them in an otherwise genuine state
// file with correct checksums, so the fuzzer reaches the validation behind them, and resumes a
// toy run from it. Resuming must either continue or throw graft::Error.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_util.h"
#include "graft/nn/layers.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/ops.h"
#include "tests/toy_task.h"

using namespace graft;
namespace fs = std::filesystem;

namespace {

// The toy task of test_trainer, with 4 batches.
struct Toy : testing::ToyTask {
  Toy() : ToyTask(1, 4) {}
};

train::LoopOptions options(const std::string& dir, bool resume) {
  train::LoopOptions o;
  o.run_dir = dir;
  o.steps = 6;
  o.lr = 0.05;
  o.valid_every = 3;
  o.log_every = 3;
  o.patience = 2;
  o.quiet = true;
  o.resume = resume;
  return o;
}

std::string run_dir() {
  const char* shm = "/dev/shm";  // fsync is free there; every execution writes a state
  const fs::path base = fs::is_directory(shm) ? fs::path(shm) : fs::temp_directory_path();
  return (base / ("graft_fuzz_state_" + std::to_string(::getpid()))).string();
}

// The seed run's directory: a genuine checkpoint after 3 steps, made once.
const std::string& seed_dir() {
  static const std::string dir = [] {
    const std::string d = run_dir() + "_seed";
    fs::create_directories(d);
    fuzz::remove_at_exit(d);
    fuzz::remove_at_exit(run_dir());
    Toy t;
    train::LoopOptions o = options(d, false);
    o.steps = 3;
    train::train_loop(t.task, o);
    return d;
  }();
  return dir;
}

// Its genuine train state.
const train::SafetensorsFile& genuine() {
  static const train::SafetensorsFile f =
      train::load_safetensors(seed_dir() + "/train_state.safetensors");
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\0');
  const std::string trainer = in.substr(0, cut);
  const std::string optimizer =
      cut == std::string::npos ? genuine().metadata.at("optimizer") : in.substr(cut + 1);
  std::map<std::string, std::string> meta = genuine().metadata;
  meta["trainer"] = trainer;
  meta["optimizer"] = optimizer;
  meta["metadata_checksum"] = train::text_checksum(trainer + '\n' + optimizer);
  const std::string dir = run_dir();
  fs::create_directories(dir);
  try {  // a checkpoint of the seed run's metrics.csv and this state
    train::CheckpointCommit c(dir, 3);
    fs::copy_file(seed_dir() + "/metrics.csv", c.path("metrics.csv"),
                  fs::copy_options::overwrite_existing);
    train::save_safetensors(c.path("train_state.safetensors"), genuine().tensors, meta);
    c.commit();
  } catch (const Error&) {
    return 0;  // metadata that is not UTF-8 cannot be written
  }
  Toy t;
  try {
    const train::LoopResult r = train::train_loop(t.task, options(dir, true));
    if (r.last_step < r.first_step) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
