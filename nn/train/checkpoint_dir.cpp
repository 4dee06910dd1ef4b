#include "graft/nn/train/checkpoint_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPointer = "checkpoint";
constexpr const char* kPrefix = "ckpt-";
// A link being made: written beside its final name, then renamed over it.
constexpr const char* kNewLink = ".graft-new-link";
// The writer's lock file (RunLock).
constexpr const char* kLockFile = "writer.lock";
// Far more checkpoints of one step than a library user makes; the bound ends the name search.
constexpr int kMaxSameStep = 1000;

[[noreturn]] void io_fail(const fs::path& path, const std::string& what, int err) {
  fail("checkpoint: '" + path.string() + "': " + what + ": " + std::strerror(err ? err : EIO));
}

std::string step_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%08lld", kPrefix, (long long)step);
  return buf;
}

bool reserved(const std::string& name) {
  return name == kPointer || name == kLockFile || name.rfind(kPrefix, 0) == 0;
}

// The name of the directory run/checkpoint points at, "" when there is no pointer.
std::string pointer_target(const fs::path& run) {
  std::error_code ec;
  const fs::path p = run / kPointer;
  if (!fs::is_symlink(fs::symlink_status(p, ec))) return "";
  const std::string target = fs::read_symlink(p, ec).string();
  if (ec || target.find('/') != std::string::npos || target.rfind(kPrefix, 0) != 0)
    fail("checkpoint: '" + p.string() + "' points at '" + target +
         "', not at a checkpoint directory of its run (a ckpt-* directory beside it)");
  const fs::file_status st = fs::symlink_status(run / target, ec);
  if (fs::is_symlink(st))
    fail("checkpoint: '" + (run / target).string() +
         "' is a symbolic link, not a checkpoint directory of its run: refusing to read or carry "
         "over files from outside the run");
  if (!fs::is_directory(st))
    fail("checkpoint: '" + p.string() + "' points at '" + target +
         "', which is missing: the run directory was damaged");
  return target;
}

// Makes `link` a symbolic link to `target`, replacing whatever was there in one rename.
void replace_link(const fs::path& link, const std::string& target) {
  const std::string tmp = link.string() + kNewLink;
  ::unlink(tmp.c_str());
  if (::symlink(target.c_str(), tmp.c_str()) != 0)
    io_fail(tmp, "cannot create a symbolic link", errno);
  if (::rename(tmp.c_str(), link.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    io_fail(link, "cannot rename a new link over it", err);
  }
}

// run/<name> -> checkpoint/<name>, made once per file name.
void link_name(const fs::path& run, const std::string& name) {
  const std::string target = std::string(kPointer) + "/" + name;
  std::error_code ec;
  const fs::path link = run / name;
  if (fs::is_symlink(fs::symlink_status(link, ec)) &&
      fs::read_symlink(link, ec).string() == target && !ec)
    return;
  replace_link(link, target);
}

// The previous checkpoint's files this one did not write, as hard links (copies where the
// filesystem has none).
void carry_over(const fs::path& from, const fs::path& to) {
  std::error_code list_ec;
  const std::vector<std::string> files = directory_entries(from.string(), list_ec);
  if (list_ec) io_fail(from, "cannot list the previous checkpoint", list_ec.value());
  for (const fs::path src : files) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(src, ec);
    if (!fs::is_regular_file(st))  // a link could name any file outside the run
      fail("checkpoint: '" + src.string() +
           "' is not a regular file: a checkpoint holds only the files its run wrote, so it is "
           "not carried over into the next one");
    const fs::path dst = to / src.filename();
    if (fs::exists(fs::symlink_status(dst, ec))) continue;
    fs::create_hard_link(src, dst, ec);
    if (ec && !fs::copy_file(src, dst, ec))
      io_fail(dst, "cannot carry the previous checkpoint's file over", ec.value());
  }
}

}  // namespace

void sync_directory(const std::string& dir, const std::string& who) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    fail(who + ": '" + dir + "': cannot open the directory to fsync it: " + std::strerror(errno));
  int r;
  do r = ::fsync(fd);
  while (r != 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (r != 0 && err != EINVAL)
    fail(who + ": '" + dir + "': fsync of the directory failed: " + std::strerror(err));
}

CheckpointCommit::CheckpointCommit(const std::string& run_dir, int64_t step) : run_dir_(run_dir) {
  pointer_target(run_dir);  // refuses a damaged run before anything is written into it
  const std::string base = step_name(step);
  // Never an existing name: it may be the current checkpoint, or another commit's of this step
  // still being written (what killed runs left, clean_checkpoints() removed at the start).
  for (int k = 0; k < kMaxSameStep; ++k) {
    name_ = k == 0 ? base : base + "." + std::to_string(k);
    const fs::path dir = fs::path(run_dir) / name_;
    if (::mkdir(dir.c_str(), 0777) == 0) return;
    if (errno != EEXIST) io_fail(dir, "cannot create the checkpoint directory", errno);
  }
  fail("checkpoint: '" + run_dir + "': " + std::to_string(kMaxSameStep) +
       " checkpoint directories of step " + std::to_string(step) + " exist already");
}

CheckpointCommit::~CheckpointCommit() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(fs::path(run_dir_) / name_, ec);
}

std::string CheckpointCommit::path(const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
      reserved(name))
    fail("checkpoint: '" + name + "' is not a plain file name a checkpoint can hold");
  return (fs::path(run_dir_) / name_ / name).string();
}

void CheckpointCommit::commit() {
  const fs::path run(run_dir_), dir = run / name_;
  if (committed_) fail("checkpoint: '" + dir.string() + "' was committed already");
  const std::string previous = pointer_target(run);
  if (!previous.empty()) carry_over(run / previous, dir);
  sync_directory(dir.string(), "checkpoint");
  std::error_code list_ec;
  const std::vector<std::string> files = directory_entries(dir.string(), list_ec);
  if (list_ec) io_fail(dir, "cannot list the checkpoint", list_ec.value());
  for (const fs::path f : files) link_name(run, f.filename().string());
  replace_link(run / kPointer, name_);  // the commit
  // From here the pointer names this directory, so it must stay whatever fails next; the
  // previous one stays too until the rename is durable (a power loss may bring it back), and
  // clean_checkpoints() removes it on the next start.
  committed_ = true;
  sync_directory(run_dir_, "checkpoint");
  std::error_code ec;
  if (!previous.empty()) fs::remove_all(run / previous, ec);
}

std::vector<std::string> directory_entries(const std::string& dir, std::error_code& ec) {
  std::vector<std::string> out;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) out.push_back(it->path().string());
  return out;
}

void create_run_directory(const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) fail("run directory '" + run_dir + "': cannot create it: " + ec.message());
  if (!fs::is_directory(run_dir, ec)) fail("run directory '" + run_dir + "': not a directory");
}

std::string current_checkpoint(const std::string& run_dir) {
  const std::string target = pointer_target(run_dir);
  return target.empty() ? "" : (fs::path(run_dir) / target).string();
}

int clean_checkpoints(const std::string& run_dir, bool keep_current) {
  const fs::path run(run_dir);
  std::error_code ec;
  int removed = 0;
  std::string current;
  if (keep_current) current = pointer_target(run);
  else if (fs::remove(run / kPointer, ec))
    ++removed;                  // first: from here on the run has no checkpoint
  std::vector<fs::path> stale;  // collected first: removing while iterating may skip entries
  std::error_code list_ec;      // a run directory that cannot be listed has nothing to clean
  for (const fs::path e : directory_entries(run_dir, list_ec)) {
    const std::string name = e.filename().string();
    const bool new_link =
        name.size() > std::strlen(kNewLink) &&
        name.compare(name.size() - std::strlen(kNewLink), std::string::npos, kNewLink) == 0;
    if (new_link || (name.rfind(kPrefix, 0) == 0 && name != current)) stale.push_back(e);
  }
  for (const fs::path& p : stale)
    if (fs::remove_all(p, ec) > 0) ++removed;
  return removed;
}

namespace {

// The runs this process holds until it exits (lock_run_until_exit()), by the directory's
// device and inode: a RunLock on one of them is already held.
struct HeldRuns {
  std::mutex mu;
  std::vector<std::pair<dev_t, ino_t>> ids;
  std::vector<std::unique_ptr<RunLock>> locks;
};
HeldRuns& held_runs() {
  static HeldRuns* h = new HeldRuns;  // never destroyed: the locks last until the process exits
  return *h;
}

std::pair<dev_t, ino_t> run_id(const std::string& run_dir) {
  struct stat st;
  if (::stat(run_dir.c_str(), &st) != 0)
    fail("run directory '" + run_dir + "': cannot lock it: " + std::strerror(errno));
  return {st.st_dev, st.st_ino};
}

bool held_until_exit(const std::pair<dev_t, ino_t>& id) {
  HeldRuns& h = held_runs();
  std::lock_guard<std::mutex> lock(h.mu);
  for (const auto& held : h.ids)
    if (held == id) return true;
  return false;
}

// The holder, for the message: the pid it wrote into the lock file, when that process runs (a
// holder that is not graft, such as flock(1), leaves the pid of an earlier writer there).
std::string lock_holder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid(buf, n > 0 ? size_t(n) : 0);
  while (!pid.empty() && pid.back() == '\n') pid.pop_back();
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos)
    return "another process";
  if (::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH) return "another process";
  return "process " + pid;
}

}  // namespace

RunLock::RunLock(const std::string& run_dir) {
  if (held_until_exit(run_id(run_dir))) return;
  const std::string path = (fs::path(run_dir) / kLockFile).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail("run directory '" + run_dir + "': cannot open its lock file '" + path +
         "': " + std::strerror(errno));
  // O_NOFOLLOW stops a planted symbolic link, not a hard link to a file outside the run (or a
  // device, a FIFO): the pid written below would truncate it.
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd_);
    fd_ = -1;
    fail("run directory '" + run_dir + "': its lock file '" + path +
         "' is not a plain file of the run (a hard link, a device or a FIFO); remove it");
  }
  int r;
  do r = ::flock(fd_, LOCK_EX | LOCK_NB);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? lock_holder(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      fail("run directory '" + run_dir + "': cannot lock '" + path + "': " + std::strerror(err));
    fail("run directory '" + run_dir + "' is being written by " + holder + " (it holds '" + path +
         "'): one writer per run; wait for it to end, or give another --out");
  }
  // The pid is only for the message a second writer gets: failing to record it loses nothing.
  const std::string pid = std::to_string(::getpid()) + "\n";
  const bool recorded =
      ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == ssize_t(pid.size());
  (void)recorded;
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the only descriptor releases the flock
}

void lock_run_until_exit(const std::string& run_dir) {
  create_run_directory(run_dir);
  const std::pair<dev_t, ino_t> id = run_id(run_dir);
  if (held_until_exit(id)) return;
  auto lock = std::make_unique<RunLock>(run_dir);
  HeldRuns& h = held_runs();
  std::lock_guard<std::mutex> guard(h.mu);
  h.ids.push_back(id);
  h.locks.push_back(std::move(lock));
}

}  // namespace graft::train
