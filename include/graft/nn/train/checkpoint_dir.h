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
/// run (clean_checkpoints()). A checkpoint directory that is a symbolic link, or holds one, is
/// refused: its files could be anywhere outside the run.
///
/// One process writes a run at a time: it holds run/writer.lock (RunLock), and a second writer
/// fails at once naming the holder's pid. Readers take no lock.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

namespace graft::train {

/// One checkpoint being written: its files go to path(name), and commit() makes them the run
/// directory's current checkpoint at once. Files of the current checkpoint that this one does
/// not write again (best weights that did not improve, say) are carried over unchanged.
class CheckpointCommit {
 public:
  /// Starts checkpoint `step` of run_dir (which must exist) in a fresh directory
  /// "ckpt-<step>" (a suffix ".<k>" is added when that name exists: the current checkpoint, or
  /// another CheckpointCommit of the same step).
  /// @throws graft::Error "checkpoint: '<dir>': ..." when the directory cannot be made, or the
  ///         run's pointer is damaged (see current_checkpoint()).
  CheckpointCommit(const std::string& run_dir, int64_t step);
  /// Removes the directory when commit() did not make it current (an error while writing, or
  /// before the pointer's rename); a directory the pointer names is never removed.
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
  /// the previous checkpoint's directory. When it throws, either the previous checkpoint is
  /// still current, or (the sync after the rename failed) this one is, complete, and the
  /// previous one is kept on disk as well.
  /// @throws graft::Error "checkpoint: '<path>': ..." naming the file or link that failed, a
  ///         previous checkpoint file that is not a regular file (a symbolic link), or a second
  ///         call ("... was committed already").
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
/// @throws graft::Error "checkpoint: '<run>/checkpoint' points at ..." when the pointer names
///         no ckpt-* directory of the run, or "checkpoint: '<run>/ckpt-...' is a symbolic link,
///         not a checkpoint directory of its run ...".
std::string current_checkpoint(const std::string& run_dir);

/// Removes what a killed run left in run_dir: checkpoint directories other than the current
/// one and an unfinished pointer link; with keep_current false (a fresh run in an old run's
/// directory) the current checkpoint too. Returns how many entries it removed.
int clean_checkpoints(const std::string& run_dir, bool keep_current);

/// The writer's exclusive lock on a run directory (flock of run_dir/writer.lock, which records
/// the holder's pid), held while the object lives. A run this process locked with
/// lock_run_until_exit() counts as held: the RunLock then takes nothing. The kernel releases
/// the lock when the holder dies, so a killed run never blocks its resume.
class RunLock {
 public:
  /// Takes the lock; run_dir must exist.
  /// @throws graft::Error "run directory '<dir>' is being written by process <pid> (it holds
  ///         '<dir>/writer.lock'): one writer per run; ..." when another writer holds it ("by
  ///         another process" when its pid is not known), or
  ///         "run directory '<dir>': cannot ..." when the lock file cannot be opened (a
  ///         symbolic link there is refused) or locked.
  explicit RunLock(const std::string& run_dir);
  /// Releases the lock.
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

/// Creates run_dir when missing (create_run_directory()) and takes its RunLock for the rest of
/// the process: what a command that writes a run calls before it writes anything there (its
/// config.json, a tokenizer), so a second writer cannot change them under the first.
/// @throws graft::Error as create_run_directory() and RunLock().
void lock_run_until_exit(const std::string& run_dir);

/// fsync of a directory, so the renames and links made in it survive a power loss. A
/// filesystem that cannot sync directories (EINVAL) counts as done.
/// @throws graft::Error "<who>: '<dir>': ..." when the directory cannot be opened or synced.
void sync_directory(const std::string& dir, const std::string& who);

}  // namespace graft::train
