// The Open MPI implementation of nn::Communicator, the one file of graft that includes mpi.h.
// Compiled into graft_nn when CMake finds MPI (GRAFT_HAVE_MPI); world_communicator() creates it
// when mpirun started the process.
#include <mpi.h>

#include <climits>
#include <iostream>
#include <memory>

#include "graft/nn/communicator.h"

namespace graft::nn {

namespace {

MPI_Datatype mpi_type(const Tensor& t, const char* what) {
  if (!t.defined() || !t.is_contiguous())
    fail(std::string("mpi: ") + what + " needs a contiguous tensor, got " + describe(t));
  switch (t.dtype()) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
    default: break;
  }
  fail(std::string("mpi: ") + what + " of " + describe(t) + ": only f32, f64 and i64 tensors");
}

int mpi_count(int64_t n, const char* what) {
  if (n > INT_MAX) fail(std::string("mpi: ") + what + " of " + std::to_string(n) + " elements (at most INT_MAX per call)");
  return (int)n;
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
  }
  ~MpiCommunicator() override {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owns_init_ && !finalised) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void allreduce_sum(Tensor& t) override {
    const MPI_Datatype dt = mpi_type(t, "allreduce");
    MPI_Allreduce(MPI_IN_PLACE, t.raw(), mpi_count(t.numel(), "allreduce"), dt, MPI_SUM, MPI_COMM_WORLD);
  }
  void start_allreduce_sum(Tensor& t) override {
    const MPI_Datatype dt = mpi_type(t, "allreduce");
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, t.raw(), mpi_count(t.numel(), "allreduce"), dt, MPI_SUM, MPI_COMM_WORLD, &r);
    pending_.push_back(r);
  }
  void progress() override {
    if (pending_.empty()) return;
    int done = 0;
    MPI_Testall((int)pending_.size(), pending_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) pending_.clear();
  }
  void wait_all() override {
    if (pending_.empty()) return;
    MPI_Waitall((int)pending_.size(), pending_.data(), MPI_STATUSES_IGNORE);
    pending_.clear();
  }
  void broadcast(Tensor& t, int root) override {
    mpi_type(t, "broadcast");
    // In chunks of 1 GiB: MPI counts are ints.
    char* p = static_cast<char*>(t.raw());
    const int64_t bytes = t.numel() * (int64_t)dtype_size(t.dtype());
    for (int64_t at = 0; at < bytes; at += (int64_t)1 << 30)
      MPI_Bcast(p + at, (int)std::min<int64_t>(bytes - at, (int64_t)1 << 30), MPI_BYTE, root, MPI_COMM_WORLD);
  }
  std::string broadcast_string(const std::string& s, int root) override {
    int64_t n = (int64_t)s.size();
    MPI_Bcast(&n, 1, MPI_INT64_T, root, MPI_COMM_WORLD);
    std::string out = rank_ == root ? s : std::string((size_t)n, '\0');
    MPI_Bcast(out.data(), mpi_count(n, "broadcast_string"), MPI_CHAR, root, MPI_COMM_WORLD);
    return out;
  }
  std::vector<std::vector<uint64_t>> allgather(const std::vector<uint64_t>& values) override {
    const int n = mpi_count((int64_t)values.size(), "allgather");
    int lo = n, hi = n;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (lo != hi)
      fail("mpi: allgather of " + std::to_string(lo) + " to " + std::to_string(hi) + " values: the ranks disagree");
    std::vector<uint64_t> all((size_t)n * (size_t)size_);
    MPI_Allgather(values.data(), n, MPI_UINT64_T, all.data(), n, MPI_UINT64_T, MPI_COMM_WORLD);
    std::vector<std::vector<uint64_t>> out((size_t)size_);
    for (int r = 0; r < size_; ++r) out[(size_t)r].assign(all.begin() + (int64_t)r * n, all.begin() + (int64_t)(r + 1) * n);
    return out;
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  [[noreturn]] void abort(const std::string& message, int code) override {
    std::cerr << message << std::endl;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // MPI_Abort does not return; this keeps the compiler sure of it
  }

 private:
  int rank_ = 0, size_ = 1;
  bool owns_init_ = false;
  std::string name_;
  std::vector<MPI_Request> pending_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace graft::nn
