/// @file
/// The training loop, written once for every model family: Adam or AdamW (weight decay on the
/// matrices only, decay_groups()) with the Noam schedule, warmup then cosine decay, or warmup
/// then a constant lr, gradient clipping, periodic validation through a callback, a progress line
/// (loss, lr, tokens/s, ETA; redrawn in place on a TTY), metrics.csv, a time or step budget,
/// early stopping, and checkpoints committed as one unit with exact resume.
///
/// It lives in nn/ because it needs only what nn/ has (Module, optimizers, schedules,
/// checkpoints): a family plugs in through TrainTask, which names its batches by index and gives
/// the loss of one batch and the metrics of a validation, so no program retypes the loop.
///
/// A run directory holds one committed checkpoint (checkpoint_dir.h: the files of one
/// validation, made current together by one atomic rename, so a kill at any moment leaves the
/// previous checkpoint or the new one, never a mix), with these files besides what the program
/// adds through on_validated:
/// - train_state.safetensors: the weights, the optimizer moments, and in the metadata the step,
///   every RNG state, the epoch, its batch order and the position in it, the data fingerprint:
///   everything an exact resume needs
/// - metrics.csv: step, train_loss, lr, tokens_per_s, valid_<metric>...
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graft/nn/module.h"
#include "graft/nn/train/checkpoint_dir.h"
#include "graft/nn/train/communicator.h"
#include "graft/nn/train/optim.h"

/// Training (nn/train/, library graft_train): the loop, optimizers and schedules, safetensors
/// checkpoints and run directories, the communicator of data-parallel training.
namespace graft::train {

/// One line of metrics.csv. The rows the loop hands to TrainTask::on_validated hold the values as
/// the file does (6 significant digits), so a resumed run, which reads its earlier rows back from
/// the file, sees the same numbers an uninterrupted one did.
struct MetricsRow {
  int64_t step = 0;  ///< the step the row was written after
  /// The mean training loss, the learning rate and the throughput since the previous row (NaN
  /// when unknown).
  ///@{
  double train_loss = NAN, lr = NAN, tokens_per_s = NAN;
  ///@}
  std::map<std::string, double> valid;  ///< empty on rows without a validation
};

/// Whether the newest row's `metric` is the best of all rows so far (higher or lower, as
/// higher_is_better says): false when the newest row has no such metric; a tie with an earlier
/// row counts as best (no measured difference, and the newer weights trained longer).
bool newest_is_best(const std::vector<MetricsRow>& rows, const std::string& metric,
                    bool higher_is_better);

/// What TrainTask::on_validated is handed after each validation.
struct Validated {
  int64_t step = 0;                     ///< the step just validated
  const std::vector<MetricsRow>& rows;  ///< every metrics row so far (this validation's last)
  /// This validation's stop metric is the best so far (newest_is_best(); always true without a
  /// stop metric): its weights are the run's best.
  bool best = false;
  /// Where this checkpoint's files go (CheckpointCommit::path()); a file not written again is
  /// carried over from the previous checkpoint.
  const CheckpointCommit& checkpoint;
};

/// What the loop needs from a model family. Batches are the program's own, by index.
/// model, tokens, validate and one of loss and loss_of_batch are required.
struct TrainTask {
  nn::Module* model = nullptr;  ///< the model to train (its parameters are optimized and saved)
  int64_t batches = 0;          ///< training batches per epoch
  /// The scalar training loss (recorded) of `shard`'s part of the batch, scaled so the parts of
  /// all ranks add up to the whole batch's loss: the shard's mean times its share of the batch's
  /// items (shard_of() and shard_loss() do both). With one process the shard is the whole batch.
  /// Called only for a shard with rows (shard_rows()); a rank without rows adds nothing.
  std::function<Tensor(int64_t batch, Shard shard)> loss;
  /// Instead of loss, for a task that only ever runs in one process: the scalar training loss of
  /// a whole batch (no shards). The loop refuses to run such a task on several ranks.
  std::function<Tensor(int64_t batch)> loss_of_batch;
  /// The rows (examples) of a batch, which shards split (shard_rows()). Needed on more than one
  /// rank; the largest batch must give every rank a row.
  std::function<int64_t(int64_t batch)> examples;
  std::function<int64_t(int64_t batch)> tokens;  ///< what the batch trains on (for tokens/s)
  /// Validation metrics by name (the model is in eval mode meanwhile); metric_names lists them
  /// in the order of the CSV columns.
  std::function<std::map<std::string, double>()> validate;
  std::vector<std::string> metric_names;  ///< the metrics validate returns, in CSV column order
  /// Early stopping watches this metric ("" or patience 0: never stop early).
  std::string stop_metric;
  /// Whether stop_metric improves upwards (accuracy) or downwards (loss).
  bool higher_is_better = false;
  /// Generators an exact resume restores besides the loop's own (such as the model's
  /// dropout generator).
  std::vector<Generator*> generators;
  /// Identifies the training data and batching: a resume refuses a train state made from other
  /// data or batching.
  std::string data_fingerprint;
  /// What the program built the model and the batches from (its config.json's JSON, say). On
  /// several ranks every rank must give the same, checked before any step (not saved).
  std::string run_config;
  /// Side files (config.json, the tokenizer) tied to the run: a resume refuses to continue when
  /// one of them is not the file the run started with (their fingerprints are taken at the
  /// start and kept in the train state).
  std::vector<std::string> tied_files;
  /// After each validation: the program writes what else the checkpoint keeps (the best
  /// weights for inference, curves) through Validated::checkpoint, so they are committed with
  /// the train state and metrics.csv as one unit.
  std::function<void(const Validated&)> on_validated;
};

/// The loop's settings: budget, optimizer and schedule, intervals, stopping rules.
struct LoopOptions {
  std::string run_dir;  ///< where the train state and metrics.csv go (created when missing)
  int64_t steps = 0;    ///< stop after this many steps (0: no step limit)
  double minutes = 0;   ///< stop after this much training time, summed over resumes (0: none)
  /// "adam" (weight_decay as L2 on the decaying parameters) or "adamw" (decoupled weight decay).
  std::string optimizer = "adam";
  /// The weight decay of the parameters decays_by_default() picks (matrices; never norms,
  /// biases or embeddings: decay_groups()); 0: one group, no decay.
  double weight_decay = 0;
  /// The learning-rate schedule (Schedule):
  /// - "auto": Noam when lr is 0, else lr from the first step (the loop's behaviour before the
  ///   schedules could be chosen; the default)
  /// - "noam": Noam(lr_factor, d_model, warmup); lr must be 0
  /// - "cosine": linear warmup to lr, then cosine decay to min_lr at step decay_steps (0: steps)
  /// - "constant": linear warmup to lr, then lr
  std::string schedule = "auto";
  /// The peak learning rate of "cosine" and "constant" (> 0 for them), or with "auto" a constant
  /// learning rate (0: Noam).
  double lr = 0;
  double min_lr = 0;        ///< "cosine": the floor it decays to (<= lr)
  int64_t decay_steps = 0;  ///< "cosine": the step it reaches min_lr (0: the step budget, steps)
  double lr_factor = 1.0;   ///< the Noam schedule's factor
  /// The Noam schedule's model width, and the warm-up steps of every schedule (Noam: >= 1;
  /// cosine and constant: >= 0).
  ///@{
  int64_t d_model = 512, warmup = 4000;
  ///@}
  /// Adam's betas and epsilon (the Transformer paper's values).
  ///@{
  double beta1 = 0.9, beta2 = 0.98, adam_eps = 1e-9;
  ///@}
  double clip = 1.0;  ///< global gradient-norm clip
  /// Steps between validations (and saves), and between progress lines and metrics rows.
  ///@{
  int64_t valid_every = 500, log_every = 100;
  ///@}
  int64_t patience = 0;  ///< stop when stop_metric has not improved for this many validations
  double min_delta = 0;  ///< an improvement counts only when it beats the best by more than this
  /// Time to quality: stop at the first validation whose stop_metric reaches this (>= when higher
  /// is better, else <=); NaN: never.
  double stop_at = NAN;
  uint64_t seed = 1;  ///< batch order and the global generator
  /// Continue run_dir's current checkpoint exactly; a run with none committed yet (killed
  /// before its first validation) starts from step 0. Without resume a run starts afresh and
  /// removes an earlier run's checkpoint from run_dir.
  bool resume = false;
  bool quiet = false;  ///< no progress lines
  /// Data parallel: the ranks that train the model together (nullptr: world_communicator(), a
  /// single process unless mpirun started the program). Each rank takes a shard of every batch;
  /// the gradients are summed across the ranks; rank 0 validates, writes the train state,
  /// metrics.csv and progress.
  Communicator* comm = nullptr;
  /// Gradient bucket size for the cross-rank sums, in MiB (> 0): smaller buckets start sooner
  /// (more overlap), larger ones make fewer calls (less latency across many hosts).
  double bucket_mb = 4;
  /// Start each bucket's sum during backward as soon as its gradients are complete (off: sum
  /// every bucket after backward).
  bool overlap = true;
};

/// What train_loop() did.
struct LoopResult {
  /// The step the call started from (0, or the resumed step) and the step it ended at.
  ///@{
  int64_t first_step = 0, last_step = 0;
  ///@}
  std::vector<double> losses;                ///< losses[i]: the loss of step first_step + 1 + i
  std::map<std::string, double> last_valid;  ///< the metrics of the last validation
  /// Training throughput of this call (validation time excluded) and the seconds the call's
  /// loop ran (validation included).
  ///@{
  double tokens_per_s = 0, train_seconds = 0;
  ///@}
  bool stopped_early = false;  ///< early stopping (patience) ended the run
  int ranks = 1;               ///< the number of ranks that trained
  /// Data parallel: the gradient buckets and bytes summed per step, and the seconds this call
  /// waited for the sums after backward (what the overlap did not hide).
  ///@{
  size_t buckets = 0, gradient_bytes = 0;
  double allreduce_wait_seconds = 0;
  ///@}
  /// stop_at reached: at which step, after how many seconds of training (validation excluded,
  /// this call only) and of wall time since the call began.
  bool reached_target = false;
  int64_t target_step = 0;  ///< the step stop_at was reached at
  /// Training seconds and wall seconds until stop_at was reached.
  ///@{
  double seconds_to_target = 0, wall_seconds_to_target = 0;
  ///@}
};

/// Trains task.model until the budget is spent (or early stopping), validating every
/// valid_every steps and at the end. On several ranks (LoopOptions::comm) rank 0's initial
/// weights go to every rank, every rank takes its shard of each batch and applies the same
/// step; checks that find a disagreement between the ranks (data, config, options) or a batch
/// too small to shard throw on every rank before any step, and an error on one rank during
/// training ends every rank through Communicator::abort() (the others would wait forever).
/// Throws graft::Error naming the file on a bad train state, and naming the step on a
/// non-finite loss. A step whose gradient norm is not finite is
/// skipped, so the Adam moments stay clean.
/// @throws graft::Error "train: ..." for a task without model, loss, tokens or validate, no
///         batches, bad options (check_loop_options()), a stop metric that validate does not
///         return, or a non-finite loss or metric; "resume: '<path>': ..." for a missing,
///         corrupted or mismatched train state (other data, edited tied files, another
///         optimizer state); and the errors of the task's own callbacks and of saving.
LoopResult train_loop(const TrainTask& task, const LoopOptions& o);

/// The options' own checks (budget, optimizer, lr, schedule, clip, intervals), which train_loop
/// runs too: a program calls it before any expensive preparation. Errors name the option.
/// @throws graft::Error "train: ..." when there is no step or time budget, an unknown optimizer
///         or schedule, a schedule without what it needs (cosine: a step budget or decay_steps,
///         and lr > 0), or minutes, lr, min_lr, weight_decay, lr_factor, clip, min_delta,
///         warmup, d_model, valid_every, log_every or patience is out of range.
void check_loop_options(const LoopOptions& o);

/// The schedule the options choose (LoopOptions::schedule), after check_loop_options().
/// @throws graft::Error as check_loop_options().
Schedule loop_schedule(const LoopOptions& o);

/// The options that shape the optimization (optimizer, weight decay, schedule and its numbers,
/// betas, eps, clip), as JSON: the train state keeps it, and a resume whose options give another
/// is refused. A program may save it in its config to restore the options on --resume
/// (apply_recipe()).
/// @throws graft::Error as check_loop_options().
nlohmann::json loop_recipe(const LoopOptions& o);

/// Sets o's optimizer, weight_decay, schedule, lr, min_lr, decay_steps, lr_factor, d_model and
/// warmup from a recipe loop_recipe() made (such as a config's copy), for --resume.
/// @throws graft::Error "<where>: ..." naming a missing or malformed field.
void apply_recipe(const nlohmann::json& recipe, LoopOptions& o, const std::string& where);

/// Fisher-Yates over 0..n-1 drawn from gen.
std::vector<int64_t> shuffled_order(int64_t n, Generator& gen);

}  // namespace graft::train
