/// @file
/// A run directory's checkpoints, each committed as one unit.
///
/// At each validation a training run writes several files: the train state, metrics.csv, the
/// program's weights and curves. A kill between two of them must not leave files that disagree
/// (a train state of step 600 beside metrics of step 500, or best weights missing), so one
/// checkpoint's files go into a directory of their own, and one atomic rename of a symbolic
/// link makes them current together:
/// @code
///   run/checkpoint -> ckpt-00000600                            the current checkpoint
///   run/ckpt-00000600/{train_state.safetensors, metrics.csv, model.safetensors, ...}
///   run/model.safetensors -> checkpoint/model.safetensors     one link per file name
/// @endcode
/// Readers open run/NAME as before. A kill at any moment leaves either the previous checkpoint
/// or the new one current, never a mix; what an interrupted commit left is removed by the next
/// run (clean_checkpoints()).
#pragma once

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

namespace graft::nn {

/// One checkpoint being written: its files go to path(name), and commit() makes them the run
/// directory's current checkpoint at once. Files of the current checkpoint that this one does
/// not write again (best weights that did not improve, say) are carried over unchanged.
class CheckpointCommit {
 public:
  /// Starts checkpoint `step` of run_dir (which must exist) in a fresh directory
  /// "ckpt-<step>" (a suffix is added when that name is the current checkpoint).
  /// @throws graft::Error "checkpoint: '<dir>': ..." when the directory cannot be made.
  CheckpointCommit(const std::string& run_dir, int64_t step);
  /// Removes the directory when commit() was not reached (an error while writing).
  ~CheckpointCommit();
  CheckpointCommit(const CheckpointCommit&) = delete;
  CheckpointCommit& operator=(const CheckpointCommit&) = delete;

  /// Where this checkpoint's file `name` (a plain file name, no '/') is written.
  /// @throws graft::Error for an empty name, one with '/', or a reserved name ("checkpoint",
  ///         "ckpt-...").
  std::string path(const std::string& name) const;
  /// Carries the current checkpoint's other files over (hard links, copies where the
  /// filesystem has none), syncs the directory, gives each file name a link in run_dir, then
  /// points run_dir/checkpoint at this directory with one atomic rename (synced) and removes
  /// the previous checkpoint's directory.
  /// @throws graft::Error "checkpoint: '<path>': ..." naming the file or link that failed; the
  ///         previous checkpoint then stays current.
  void commit();

 private:
  std::string run_dir_, name_;
  bool committed_ = false;
};

/// The paths of dir's entries (not recursive), listed without throwing: `ec` tells an error
/// (then the entries listed until it are returned).
std::vector<std::string> directory_entries(const std::string& dir, std::error_code& ec);

/// Creates run_dir (and its parents) when missing.
/// @throws graft::Error "run directory '<dir>': ..." when it cannot (a file in the way, no
///         permission).
void create_run_directory(const std::string& run_dir);

/// The directory of run_dir's current checkpoint, or "" when none was committed.
std::string current_checkpoint(const std::string& run_dir);

/// Removes what a killed run left in run_dir: checkpoint directories other than the current
/// one and an unfinished pointer link; with keep_current false (a fresh run in an old run's
/// directory) the current checkpoint too. Returns how many entries it removed.
int clean_checkpoints(const std::string& run_dir, bool keep_current);

/// fsync of a directory, so the renames and links made in it survive a power loss. A
/// filesystem that cannot sync directories (EINVAL) counts as done.
/// @throws graft::Error "<who>: '<dir>': ..." when the directory cannot be opened or synced.
void sync_directory(const std::string& dir, const std::string& who);

}  // namespace graft::nn
