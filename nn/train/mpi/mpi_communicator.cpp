// The Open MPI implementation of train::Communicator, the one file of graft that includes mpi.h.
// Compiled into graft_nn when CMake finds MPI (GRAFT_HAVE_MPI); world_communicator() creates it
// when mpirun started the process.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <iostream>
#include <memory>
#include <sstream>

#include "graft/nn/train/communicator.h"

namespace graft::train {

namespace {

MPI_Datatype mpi_type(const Tensor& t, const char* what) {
  if (!t.defined() || !t.is_contiguous())
    fail(std::string("mpi: ") + what + " needs a contiguous tensor, got " + describe(t));
  switch (t.dtype()) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i64:
      return MPI_INT64_T;
    default:
      break;
  }
  fail(std::string("mpi: ") + what + " of " + describe(t) + ": only f32, f64 and i64 tensors");
}

int mpi_count(int64_t n, const char* what) {
  if (n > INT_MAX)
    fail(std::string("mpi: ") + what + " of " + std::to_string(n) +
         " elements (at most INT_MAX per call)");
  return (int)n;
}

using Clock = std::chrono::steady_clock;

// The watchdog's messages on its own communicator (a copy of MPI_COMM_WORLD, so that they never
// match the training's collectives): a rank whose wait has timed out sends kPing to every other
// rank; a rank in a wait answers kPong at once. Who does not answer is the rank to name.
constexpr int kPing = 1, kPong = 2;
const int kToken = 0;  // the content of both (the tag is the message)
// How long a timed-out rank waits for the answers: the others answer within microseconds when
// they are waiting too; this leaves room for oversubscribed cores.
constexpr double kAnswerSeconds = 2;

// Now plus `seconds`, saturated at the clock's end: a duration past what Clock::duration holds
// (int64 nanoseconds, ~292 years) would overflow into the past and end the wait at once.
Clock::time_point after(double seconds) {
  const Clock::time_point now = Clock::now();
  const double room = std::chrono::duration<double>(Clock::time_point::max() - now).count();
  if (!(seconds < room / 2)) return Clock::time_point::max();  // half: no rounding over it
  return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// "3", "0.5", "600": seconds for messages.
std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

// "rank 1 of 2 has", "ranks 1, 3 of 4 have".
std::string ranks_have(const std::vector<int>& ranks, int size) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + " of " + std::to_string(size) + (ranks.size() == 1 ? " has" : " have");
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      // Only the thread that called init talks to MPI; OpenMP threads never do.
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owns_init_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, (size_t)len);
    name_ = "MPI (" + v.substr(0, v.find(',')) + ")";
    MPI_Comm_dup(MPI_COMM_WORLD, &watch_);
    listen_for_pings();
  }
  ~MpiCommunicator() override {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised) return;
    // A watched barrier first: MPI_Finalize waits for every rank too, without a watchdog.
    if (owns_init_) {
      MPI_Request r;
      MPI_Ibarrier(watch_, &r);
      wait(&r, 1);
    }
    MPI_Cancel(&ping_);
    MPI_Wait(&ping_, MPI_STATUS_IGNORE);
    MPI_Comm_free(&watch_);
    if (owns_init_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void allreduce_sum(Tensor& t) override {
    const MPI_Datatype dt = mpi_type(t, "allreduce");
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, t.raw(), mpi_count(t.numel(), "allreduce"), dt, MPI_SUM,
                   MPI_COMM_WORLD, &r);
    wait(&r, 1);
  }
  void start_allreduce_sum(Tensor& t) override {
    const MPI_Datatype dt = mpi_type(t, "allreduce");
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, t.raw(), mpi_count(t.numel(), "allreduce"), dt, MPI_SUM,
                   MPI_COMM_WORLD, &r);
    pending_.push_back(r);
  }
  void progress() override {
    if (pending_.empty()) return;
    int done = 0;
    MPI_Testall((int)pending_.size(), pending_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) pending_.clear();
  }
  void wait_all() override {
    wait(pending_.data(), (int)pending_.size());
    pending_.clear();
  }
  void broadcast(Tensor& t, int root) override {
    mpi_type(t, "broadcast");
    // In chunks of 1 GiB: MPI counts are ints.
    char* p = static_cast<char*>(t.raw());
    const int64_t bytes = t.numel() * (int64_t)dtype_size(t.dtype());
    for (int64_t at = 0; at < bytes; at += (int64_t)1 << 30)
      bcast(p + at, (int)std::min<int64_t>(bytes - at, (int64_t)1 << 30), MPI_BYTE, root);
  }
  std::string broadcast_string(const std::string& s, int root) override {
    int64_t n = (int64_t)s.size();
    bcast(&n, 1, MPI_INT64_T, root);
    std::string out = rank_ == root ? s : std::string((size_t)n, '\0');
    bcast(out.data(), mpi_count(n, "broadcast_string"), MPI_CHAR, root);
    return out;
  }
  std::vector<std::vector<uint64_t>> allgather(const std::vector<uint64_t>& values) override {
    const int n = mpi_count((int64_t)values.size(), "allgather");
    int lo = n, hi = n;
    MPI_Request r[2];
    MPI_Iallreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &r[0]);
    MPI_Iallreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r[1]);
    wait(r, 2);
    if (lo != hi)
      fail("mpi: allgather of " + std::to_string(lo) + " to " + std::to_string(hi) +
           " values: the ranks disagree");
    std::vector<uint64_t> all((size_t)n * (size_t)size_);
    MPI_Request g;
    MPI_Iallgather(values.data(), n, MPI_UINT64_T, all.data(), n, MPI_UINT64_T, MPI_COMM_WORLD, &g);
    wait(&g, 1);
    std::vector<std::vector<uint64_t>> out((size_t)size_);
    for (int r = 0; r < size_; ++r)
      out[(size_t)r].assign(all.begin() + (int64_t)r * n, all.begin() + (int64_t)(r + 1) * n);
    return out;
  }
  void barrier() override {
    MPI_Request r;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    wait(&r, 1);
  }
  [[noreturn]] void abort(const std::string& message, int code) override {
    std::cerr << message << std::endl;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // MPI_Abort does not return; this keeps the compiler sure of it
  }

 private:
  void bcast(void* p, int count, MPI_Datatype dt, int root) {
    MPI_Request r;
    MPI_Ibcast(p, count, dt, root, MPI_COMM_WORLD, &r);
    wait(&r, 1);
  }

  // Every blocking call ends here: MPI_Waitall with the watchdog. It polls the requests,
  // answers the other ranks' pings, and past the collective timeout ends the job, naming the
  // ranks that do not answer.
  void wait(MPI_Request* reqs, int n) {
    int done = 0;
    MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    const double timeout = collective_timeout();
    if (timeout == 0) {
      MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
      return;
    }
    const Clock::time_point deadline = after(timeout);
    for (;;) {
      MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
      if (done) return;
      answer_pings();
      if (Clock::now() >= deadline) end_the_job(timeout);
    }
  }

  void listen_for_pings() {
    MPI_Irecv(&ping_token_, 1, MPI_INT, MPI_ANY_SOURCE, kPing, watch_, &ping_);
  }

  void answer_pings() {
    for (;;) {
      int got = 0;
      MPI_Status st;
      MPI_Test(&ping_, &got, &st);
      if (!got) return;
      send(st.MPI_SOURCE, kPong);
      listen_for_pings();
    }
  }

  // A small message that nobody waits to complete (kToken outlives every send).
  void send(int to, int tag) {
    MPI_Request r;
    MPI_Isend(&kToken, 1, MPI_INT, to, tag, watch_, &r);
    MPI_Request_free(&r);
  }

  // The ranks that do not answer a ping within kAnswerSeconds (answering the others' meanwhile).
  std::vector<int> silent_ranks() {
    std::vector<int> tokens((size_t)size_);
    std::vector<MPI_Request> answers((size_t)size_, MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Irecv(&tokens[(size_t)r], 1, MPI_INT, r, kPong, watch_, &answers[(size_t)r]);
      send(r, kPing);
    }
    const Clock::time_point deadline = after(kAnswerSeconds);
    std::vector<int> silent;
    do {
      answer_pings();
      silent.clear();
      for (int r = 0; r < size_; ++r) {
        int got = 0;
        MPI_Test(&answers[(size_t)r], &got, MPI_STATUS_IGNORE);  // a null request tests as done
        if (!got) silent.push_back(r);
      }
    } while (!silent.empty() && Clock::now() < deadline);
    return silent;
  }

  [[noreturn]] void end_the_job(double timeout) {
    const std::vector<int> silent = silent_ranks();
    const std::string waited = seconds_text(timeout) + " s";
    abort(silent.empty()
              ? "data parallel: every rank answered, but a collective has not completed in " +
                    waited + " (the ranks are not in the same collective); ending the job"
              : "data parallel: " + ranks_have(silent, size_) + " not answered for " + waited +
                    " (stopped or hung); ending the job",
          1);
  }

  int rank_ = 0, size_ = 1;
  bool owns_init_ = false;
  std::string name_;
  std::vector<MPI_Request> pending_;
  MPI_Comm watch_ = MPI_COMM_NULL;       // the watchdog's pings and answers
  MPI_Request ping_ = MPI_REQUEST_NULL;  // listens for a ping from any rank
  int ping_token_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

}  // namespace graft::train
