#include "graft/nn/train/communicator.h"

#include <cmath>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>

#include "graft/autograd/text.h"
#include "graft/ops/elementwise.h"
#include "graft/ops/shape.h"

namespace graft::train {

#ifdef GRAFT_HAVE_MPI
// nn/train/mpi/mpi_communicator.cpp: initialises MPI and returns its world communicator.
std::unique_ptr<Communicator> make_mpi_communicator();
bool mpi_available() { return true; }
#else
bool mpi_available() { return false; }
#endif

void SingleProcessCommunicator::abort(const std::string& message, int code) {
  std::cerr << message << std::endl;
  std::exit(code);
}

namespace {

// "a number of seconds in [0, 1000000] (0: wait forever)": what both setters accept.
std::string timeout_range() {
  return "a number of seconds in [0, " +
         std::to_string((long long)Communicator::kMaxCollectiveTimeout) + "] (0: wait forever)";
}

bool valid_timeout(double seconds) {
  return std::isfinite(seconds) && seconds >= 0 && seconds <= Communicator::kMaxCollectiveTimeout;
}

}  // namespace

void Communicator::set_collective_timeout(double seconds) {
  if (!valid_timeout(seconds)) {
    std::ostringstream got;
    got << seconds;
    fail("data parallel: the collective timeout must be " + timeout_range() + ", got " + got.str());
  }
  collective_timeout_ = seconds;
}

double collective_timeout_from_environment() {
  const char* s = std::getenv("GRAFT_COLLECTIVE_TIMEOUT");
  if (!s || !*s) return Communicator::kDefaultCollectiveTimeout;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (*end != '\0' || !valid_timeout(v))
    fail(std::string("data parallel: GRAFT_COLLECTIVE_TIMEOUT='") + text::printable(s, 100) +
         "' is not " + timeout_range());
  return v;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

Communicator& world_communicator() {
  static std::unique_ptr<Communicator> world = []() -> std::unique_ptr<Communicator> {
    if (!launched_by_mpi()) return std::make_unique<SingleProcessCommunicator>();
#ifdef GRAFT_HAVE_MPI
    const double timeout = collective_timeout_from_environment();  // before MPI starts
    std::unique_ptr<Communicator> mpi = make_mpi_communicator();
    mpi->set_collective_timeout(timeout);
    return mpi;
#else
    fail(
        "this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK "
        "is set), "
        "but graft was built without MPI: install libopenmpi-dev and rebuild (make), or run "
        "without mpirun");
#endif
  }();
  return *world;
}

void on_every_rank(Communicator& c, const std::function<void()>& f) {
  std::exception_ptr err;
  std::string msg;
  try {
    f();
  } catch (const std::exception& e) {
    err = std::current_exception();
    msg = e.what();
  }
  if (c.size() == 1) {
    if (err) std::rethrow_exception(err);
    return;
  }
  const auto failed = c.allgather({err ? 1ull : 0ull});
  int first = -1;
  for (int r = 0; r < c.size() && first < 0; ++r)
    if (failed[(size_t)r][0]) first = r;
  if (first < 0) return;
  msg = c.broadcast_string(msg, first);
  if (err) std::rethrow_exception(err);
  if (msg.rfind("rank ", 0) == 0) fail(msg);
  fail("rank " + std::to_string(first) + " of " + std::to_string(c.size()) + ": " + msg);
}

void on_rank0(Communicator& c, const std::function<void()>& f) {
  on_every_rank(c, [&] {
    if (c.rank() == 0) f();
  });
}

std::pair<int64_t, int64_t> shard_rows(int64_t n, Shard s) {
  if (s.size < 1 || s.rank < 0 || s.rank >= s.size)
    fail("shard: rank " + std::to_string(s.rank) + " of " + std::to_string(s.size) +
         " is not a rank");
  if (n < 0) fail("shard: a negative row count");
  const int64_t base = n / s.size, extra = n % s.size, r = s.rank;
  const int64_t first = r * base + std::min<int64_t>(r, extra);
  return {first, first + base + (r < extra ? 1 : 0)};
}

Tensor shard_of(const Tensor& t, Shard s) {
  if (!t.defined() || t.dim() < 1) fail("shard: needs a tensor with rows, got " + describe(t));
  const auto [first, last] = shard_rows(t.size(0), s);
  if (first == last)
    fail("shard: rank " + std::to_string(s.rank) + " of " + std::to_string(s.size) +
         " has no rows of " + describe(t));
  if (first == 0 && last == t.size(0)) return t;
  return slice(t, 0, first, last);
}

Tensor shard_loss(const Tensor& mean, int64_t count, int64_t total) {
  if (total < 1 || count < 1 || count > total)
    fail("shard_loss: a shard of " + std::to_string(count) + " items of a batch of " +
         std::to_string(total) + " (a shard needs 1 to all of the batch's items)");
  if (count == total) return mean;
  return affine(mean, (double)count / (double)total, 0.0);
}

}  // namespace graft::train
