// Command-line parsing shared by the example programs: --help prints and exits 0; any other
// parse error (an unknown flag, a bad value, a missing option) is one line on stderr and exit
// code 2, as a usage error should be.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/decoding.h"
#include "graft/nn/train/communicator.h"
#include "graft/nn/train/trainer.h"
#include "graft/ops/precision.h"

namespace graft::cli {

// The range check of every floating option: CLI::Range lets NaN through (each comparison with NaN
// is false), so "--stop-at-bleu nan" once passed and was never reached. This one refuses NaN
// first ("--dropout: Value nan is not a number"), then checks [lo, hi] as CLI::Range does.
inline CLI::Validator range(double lo, double hi) {
  const CLI::Range inside(lo, hi);
  return CLI::Validator(
      [inside](std::string& s) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(s, v) && std::isnan(v))
          return "Value " + s + " is not a number";
        return inside(s);
      },
      inside.get_description());
}
// A finite number >= 0 (NaN and inf refused), for the options with no natural upper bound.
inline CLI::Validator non_negative() { return range(0.0, std::numeric_limits<double>::max()); }

// Seeds are unsigned: "-1" must not wrap to 2^64 - 1.
inline CLI::Validator seed_range() { return CLI::Range(uint64_t(0), uint64_t(1) << 62); }

// --beam, --sample, --temperature, --top-k, --top-p, --seed: how a program decodes
// (models/decoding.h; check_decode_options() checks the values before any work).
inline void add_decoding_options(CLI::App* sub, models::DecodeOptions& o) {
  sub->add_option("--beam", o.beam, "beam size (1: greedy)")->check(CLI::Range(1, 64));
  sub->add_flag("--sample", o.sample,
                "sample each token (with --temperature, --top-k, --top-p, --seed)");
  // 0 passes these two (NaN does not): check_decode_options() then names the option.
  sub->add_option("--temperature", o.sampling.temperature, "sampling temperature (> 0)")
      ->check(non_negative());
  sub->add_option("--top-k", o.sampling.top_k, "sample among the k most likely tokens (0: all)");
  sub->add_option("--top-p", o.sampling.top_p,
                  "sample from the nucleus of probability p, in (0, 1]")
      ->check(range(0.0, 1.0));
  sub->add_option("--seed", o.seed, "sampling seed (same seed, same output)")->check(seed_range());
}

// The training recipe's flags, the same in every training program: they set these fields (of an
// train::LoopOptions, or a program's copies of them).
struct RecipeFlags {
  std::string* optimizer;
  double* weight_decay;
  std::string* schedule;
  double* lr;
  double* min_lr;
  int64_t* warmup;
  double* lr_factor;
};

// The warmup a run gets when --warmup is not given: a tenth of a --steps budget (at least 1),
// 400 steps for a --minutes budget, and never more than the program's `cap` (translate 4000, lm
// 400, classify 200). A Noam warmup of 4000 left a two-minute run (~500 steps) at lr ~7e-5.
inline int64_t auto_warmup(int64_t steps, int64_t cap) {
  return std::min(cap, steps > 0 ? std::max<int64_t>(1, steps / 10) : int64_t(400));
}

// --optimizer, --weight-decay, --schedule, --lr, --min-lr, --warmup, --lr-factor
// (train::LoopOptions). Call set_auto_warmup() after parsing.
inline void add_recipe_options(CLI::App* sub, const RecipeFlags& f, int64_t warmup_cap) {
  sub->add_option("--optimizer", *f.optimizer,
                  "adam (weight decay as L2) or adamw (decoupled weight decay)")
      ->check(CLI::IsMember({"adam", "adamw"}));
  sub->add_option("--weight-decay", *f.weight_decay,
                  "weight decay of the weight matrices (never norms, biases or embeddings)")
      ->check(non_negative());
  sub->add_option(
         "--schedule", *f.schedule,
         "learning-rate schedule: auto (noam when --lr is 0, else --lr from the first step), noam, "
         "cosine (warmup, then cosine decay to --min-lr at the last of --steps) or constant "
         "(warmup, then --lr)")
      ->check(CLI::IsMember({"auto", "noam", "cosine", "constant"}));
  sub->add_option(
         "--lr", *f.lr,
         "the peak learning rate of cosine and constant (with auto: a constant rate; 0: noam)")
      ->check(range(0.0, 10.0));
  sub->add_option("--min-lr", *f.min_lr, "cosine: the learning rate it decays to")
      ->check(range(0.0, 10.0));
  sub->add_option("--warmup", *f.warmup, "warmup steps of every schedule")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30))
      ->default_str("auto: --steps/10, 400 with --minutes, at most " + std::to_string(warmup_cap));
  sub->add_option("--lr-factor", *f.lr_factor, "noam: the schedule's factor")
      ->check(range(1e-6, 1e3));
}

// Sets the warmup by auto_warmup() unless --warmup was given (a resumed run then takes its
// config's, as for every recipe option).
inline void set_auto_warmup(const CLI::App* sub, int64_t& warmup, int64_t steps, int64_t cap) {
  if (sub->count("--warmup") == 0) warmup = auto_warmup(steps, cap);
}

// Every option's default in --help (CLI11 captures each option's value when it is added).
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

// --detect-anomaly: anomaly mode for the whole run (autograd/tape.h).
inline void add_detect_anomaly(CLI::App* sub) {
  sub->add_flag_callback(
      "--detect-anomaly", [] { autograd::set_anomaly_mode(true); },
      "check every op for NaN/Inf and name the first one (op, shapes, module); slower");
}

// --bucket-mb, --no-overlap: how data-parallel training (under mpirun) sums the gradients
// (train::LoopOptions::bucket_mb and overlap); --collective-timeout: its watchdog.
inline void add_data_parallel_options(CLI::App* sub, double& bucket_mb, bool& overlap) {
  sub->add_option("--bucket-mb", bucket_mb,
                  "under mpirun: gradient bucket size in MiB for the cross-rank sums")
      ->check(range(0.01, 4096.0));
  sub->add_flag_callback(
      "--no-overlap", [&overlap] { overlap = false; },
      "under mpirun: sum the gradients after backward instead of during it (for measuring)");
  // The watchdog belongs to the communicator (train::Communicator::set_collective_timeout). NaN
  // once passed CLI::NonNegativeNumber and the setter's graft::Error, thrown inside CLI11's
  // parse, aborted the program; the range check refuses it first, and the setter's own error
  // becomes a usage error too.
  const double max = train::Communicator::kMaxCollectiveTimeout;
  sub->add_option_function<double>(
         "--collective-timeout",
         [](const double& s) {
           try {
             train::world_communicator().set_collective_timeout(s);
           } catch (const Error& e) {
             throw CLI::ValidationError("--collective-timeout", e.what());
           }
         },
         "under mpirun: seconds a rank waits for the others before ending the job, naming a rank "
         "that stopped answering (0: forever, at most " +
             std::to_string((long long)max) + "; default GRAFT_COLLECTIVE_TIMEOUT or " +
             std::to_string((int)train::Communicator::kDefaultCollectiveTimeout) + ")")
      ->check(range(0.0, max));
}

// The training loop's flags of the three programs (their options hold an train::LoopOptions):
// --steps or --minutes (one of them), the recipe (add_recipe_options), --valid-every,
// --log-every, --patience and --min-delta (early stopping on `metric`, the validation metric it
// watches), --seed (what it seeds: `seeds`), --resume, the data-parallel options and
// --detect-anomaly.
inline void add_loop_options(CLI::App* sub, train::LoopOptions& l, int64_t warmup_cap,
                             const std::string& metric, const std::string& seeds) {
  auto* steps = sub->add_option("--steps", l.steps, "training steps")
                    ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  auto* minutes =
      sub->add_option("--minutes", l.minutes, "training time budget")->check(range(0.01, 1e6));
  steps->excludes(minutes);
  add_recipe_options(
      sub, {&l.optimizer, &l.weight_decay, &l.schedule, &l.lr, &l.min_lr, &l.warmup, &l.lr_factor},
      warmup_cap);
  sub->add_option("--valid-every", l.valid_every, "validate and checkpoint every N steps")
      ->check(CLI::Range(1, 1 << 30));
  sub->add_option("--log-every", l.log_every, "metrics row / non-TTY progress line every N steps")
      ->check(CLI::Range(1, 1 << 30));
  sub->add_option("--patience", l.patience,
                  "early stopping after N validations without a better " + metric + " (0: off)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--min-delta", l.min_delta,
                  "early stopping: an improvement of the " + metric + " must exceed this")
      ->check(non_negative());
  sub->add_option("--seed", l.seed, "seed for " + seeds)->check(seed_range());
  sub->add_flag("--resume", l.resume, "continue the run in --out exactly where it stopped");
  add_data_parallel_options(sub, l.bucket_mb, l.overlap);
  add_detect_anomaly(sub);
}

// --precision fp32|bf16 (|int8 for inference subcommands): the matmul precision of the whole run
// (ops/precision.h), entered by `PrecisionGuard guard(cli::precision_choice());` after parsing.
// bf16 or int8 on a CPU where oneDNN has no kernel for it is refused as a usage error (the
// reference paths would only be slower).
inline Precision& precision_choice() {
  static Precision p = Precision::fp32;
  return p;
}
enum class PrecisionUse { training, inference };
inline void add_precision(CLI::App* sub, PrecisionUse use = PrecisionUse::training) {
  const bool inference = use == PrecisionUse::inference;
  sub->add_option_function<std::string>(
         "--precision",
         [](const std::string& s) {
           const Precision p = parse_precision(s, "--precision");
           if (p != Precision::fp32) {
             const bool bf16 = p == Precision::bf16;
             if (bf16 && !bf16_unavailable_reason("--precision").empty())
               throw CLI::ValidationError(bf16_unavailable_reason("--precision"));
             std::cerr << (bf16 ? bf16_description() : int8_description()) << '\n';
           }
           precision_choice() = p;
         },
         std::string("matmul precision: fp32 (default), bf16 (") +
             (inference ? "the model converted to bf16 tensors once, 2 bytes a weight, its "
                          "matmuls on oneDNN's bf16 kernel; needs a CPU with AVX512_BF16 or AMX)"
                        : "bf16 operands, float32 accumulation and everything else float32; "
                          "needs a CPU with AVX512_BF16 or AMX)") +
             (inference ? " or int8 (linear layers on int8 weights per output channel and int8 "
                          "inputs per row; oneDNN's VNNI kernel where the CPU has one, else "
                          "graft's integer loop, the same sums)"
                        : ""))
      ->check(inference ? CLI::IsMember({"fp32", "bf16", "int8"})
                        : CLI::IsMember({"fp32", "bf16"}));
}

// The one line a program prints for an error: the message escaped, and the standard library's
// internal names ("std::bad_alloc", "vector::reserve") replaced by what they mean.
inline std::string error_line(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "out of memory";
  if (dynamic_cast<const std::length_error*>(&e))
    return "a requested size is too large (" + text::printable(e.what()) + ")";
  return text::printable(e.what(), 1000);
}

// -1 when the program should go on, else the exit code.
inline int parse(CLI::App& app, int argc, char** argv) {
  const std::string prog = std::filesystem::path(argv[0]).filename().string();
  // CLI11 says "A subcommand is required" or "arguments were not expected" for a mistyped
  // subcommand; name it and the known ones instead.
  if (app.get_require_subcommand_min() > 0) {
    std::string known;
    bool found = argc < 2 || argv[1][0] == '-';
    for (const CLI::App* sub : app.get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found |= argc >= 2 && sub->get_name() == argv[1];
    }
    if (argc < 2 || !found) {
      std::cerr << prog << ": "
                << (argc < 2 ? std::string("a subcommand is required")
                             : "unknown subcommand '" + text::printable(argv[1]) + "'")
                << " (one of: " << known << "; see --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << prog << ": " << text::printable(e.what(), 400) << " (see --help)\n";
    return 2;
  }
}

// One subcommand of a program: its CLI11 app, whose options are bound to what `run` reads.
struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

// A program's main after its subcommands are added: parses (usage errors exit 2), enters the
// --precision chosen, runs the subcommand given; any error is one line "<prog>: <message>" on
// stderr and exit code 2.
inline int run_commands(CLI::App& app, const std::vector<Command>& commands, int argc,
                        char** argv) {
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  PrecisionGuard precision(precision_choice());
  try {
    for (const Command& c : commands)
      if (*c.sub) return c.run();
  } catch (const std::exception& e) {
    const std::string line =
        std::filesystem::path(argv[0]).filename().string() + ": " + error_line(e);
    // Under mpirun the other ranks may be waiting for this one in a collective: end them all.
    if (train::launched_by_mpi() && train::mpi_available())
      train::world_communicator().abort(line, 2);
    std::cerr << line << '\n';
    return 2;
  }
  return 0;
}

}  // namespace graft::cli
