/// @file
/// Data-parallel training's only contact with the outside world: a Communicator among `size()`
/// processes (ranks) that sums tensors, broadcasts them and waits for the others. train_loop()
/// uses nothing else, so an engine other than MPI plugs in by implementing this interface.
///
/// Two implementations come with graft: a single process (everything is a no-op), and Open MPI
/// (nn/train/mpi/mpi_communicator.cpp, compiled when CMake finds MPI). world_communicator() picks
/// the MPI one when the program was started by mpirun, the single-process one otherwise.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft::train {

/// Collective operations among the ranks of one job. Every rank must make the same calls in the
/// same order (the MPI rule); a call one rank skips leaves the others waiting.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  ///< this process's index in [0, size())
  virtual int size() const = 0;  ///< the number of ranks
  /// "single process", "MPI (Open MPI v4.1.4)", ...: for messages.
  virtual std::string name() const = 0;

  /// Sums a contiguous f32, f64 or i64 tensor in place across the ranks (blocking).
  /// @throws graft::Error for another dtype or a non-contiguous tensor.
  virtual void allreduce_sum(Tensor& t) = 0;
  /// Starts summing `t` in place across the ranks and returns at once; `t` must stay alive and
  /// untouched until wait_all(). Same dtypes as allreduce_sum().
  virtual void start_allreduce_sum(Tensor& t) = 0;
  /// Lets started reductions advance (MPI makes progress only inside its calls); cheap.
  virtual void progress() = 0;
  /// Waits until every started reduction has finished.
  virtual void wait_all() = 0;
  /// Copies `t` (contiguous; same shape and dtype on every rank) from rank `root` to every rank.
  virtual void broadcast(Tensor& t, int root) = 0;
  /// Rank `root`'s string, on every rank.
  virtual std::string broadcast_string(const std::string& s, int root) = 0;
  /// Every rank's `values` (the same length on every rank), rank by rank.
  virtual std::vector<std::vector<uint64_t>> allgather(const std::vector<uint64_t>& values) = 0;
  /// Returns once every rank has called it.
  virtual void barrier() = 0;
  /// Prints `message` to stderr and ends every rank of the job with exit code `code` (the only
  /// way out when one rank fails while the others wait in a collective).
  [[noreturn]] virtual void abort(const std::string& message, int code) = 0;

  /// The watchdog: how long a blocking call (a collective, wait_all()) may wait for the other
  /// ranks before it ends the job, naming the ranks that did not answer (a rank stopped with
  /// SIGSTOP, hung, or busy longer than that). 0 waits forever. Set the same on every rank;
  /// kDefaultCollectiveTimeout unless changed. One process never waits, so it has no effect there.
  /// @throws graft::Error unless `seconds` is a number in [0, kMaxCollectiveTimeout].
  void set_collective_timeout(double seconds);
  /// The watchdog's timeout in seconds (0: none); see set_collective_timeout().
  double collective_timeout() const { return collective_timeout_; }

  /// The default collective timeout, in seconds: longer than any wait of a healthy run (rank 0
  /// validating or saving while the others wait), short enough to end a stalled job the same hour.
  static constexpr double kDefaultCollectiveTimeout = 600;
  /// The longest collective timeout, in seconds (10^6, 11.6 days): a deadline this far ahead
  /// still fits the clock (steady_clock counts int64 nanoseconds, ~292 years), where 10^10 s once
  /// overflowed it into the past and ended a healthy job at its first wait. Longer: use 0.
  static constexpr double kMaxCollectiveTimeout = 1e6;

 private:
  double collective_timeout_ = kDefaultCollectiveTimeout;
};

/// One process: rank 0 of 1; the collectives return at once and leave the data as it is. Not
/// final: a test's stand-in for several ranks in one process derives from it.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  void allreduce_sum(Tensor&) override {}
  void start_allreduce_sum(Tensor&) override {}
  void progress() override {}
  void wait_all() override {}
  void broadcast(Tensor&, int) override {}
  std::string broadcast_string(const std::string& s, int) override { return s; }
  std::vector<std::vector<uint64_t>> allgather(const std::vector<uint64_t>& v) override {
    return {v};
  }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message, int code) override;
};

/// True when this graft was built with MPI (libopenmpi-dev found at configure time).
bool mpi_available();
/// True when a launcher (mpirun, mpiexec, srun) started this process as one rank of several:
/// OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is set.
bool launched_by_mpi();
/// The collective timeout that world_communicator() gives an MPI communicator: the environment
/// variable GRAFT_COLLECTIVE_TIMEOUT (seconds, 0: wait forever) when set, else
/// Communicator::kDefaultCollectiveTimeout.
/// @throws graft::Error when GRAFT_COLLECTIVE_TIMEOUT is set to anything but a number in
///         [0, Communicator::kMaxCollectiveTimeout].
double collective_timeout_from_environment();
/// The process-wide communicator: MPI's when launched_by_mpi() (initialising MPI on the first
/// call, finalising it at exit; its collective timeout from collective_timeout_from_environment()),
/// a SingleProcessCommunicator otherwise.
/// @throws graft::Error when started by mpirun but built without MPI (the ranks would each
///         train a model of their own and overwrite each other's files), or as
///         collective_timeout_from_environment().
Communicator& world_communicator();

/// Runs `f` on every rank. When it throws on any rank, every rank throws: the failing rank its
/// own error, the others the lowest failing rank's message prefixed "rank R of N: ", so no rank
/// is left waiting in a collective that a failed one never reaches. With one rank, `f`'s
/// exception passes through unchanged.
void on_every_rank(Communicator& c, const std::function<void()>& f);
/// Runs `f` on rank 0 only (writing a run's shared files, say), then every rank goes on once it
/// has finished; an error in `f` is thrown on every rank as on_every_rank() does.
void on_rank0(Communicator& c, const std::function<void()>& f);

/// Which part of a global batch a rank trains on: `rank` of `size` near-equal parts.
struct Shard {
  int rank = 0;  ///< this rank
  int size = 1;  ///< the number of ranks (1: the whole batch)
};
/// Rows [first, second) of `n` that `s` takes: contiguous parts whose sizes differ by at most one,
/// in rank order, covering 0..n-1 once (with n < s.size the last ranks get none).
/// @throws graft::Error when n is negative or s is not a valid shard.
std::pair<int64_t, int64_t> shard_rows(int64_t n, Shard s);
/// The rows (dim 0) of `t` that `s` takes, as a view (recorded, so gradients flow back).
/// @throws graft::Error as shard_rows(), when t is a scalar, or when the shard has no rows.
Tensor shard_of(const Tensor& t, Shard s);
/// Turns a shard's mean loss (over `count` items: tokens, rows) into its part of the whole batch's
/// mean over `total` items: mean * count / total, so the parts of all ranks add up to the
/// batch's mean loss and the summed gradients are the batch's. Returns `mean` itself when
/// count == total (one process: nothing changes).
/// @throws graft::Error unless 1 <= count <= total.
Tensor shard_loss(const Tensor& mean, int64_t count, int64_t total);

}  // namespace graft::train
