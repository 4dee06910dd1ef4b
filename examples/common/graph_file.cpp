#include "examples/common/graph_file.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <vector>

#include "graft/autograd/tensor.h"
#include "graft/nn/train/checkpoint.h"

extern char** environ;

namespace graft::plot {

namespace {

// The DOT text in a temp file beside `path` (created exclusively, never through a planted
// link) for dot to read; its name goes to tmp, which the caller removes.
void write_dot_input(const std::string& text, const std::string& path, std::string& tmp) {
  const int fd = train::create_temp_file(path, tmp, "graph");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      fail("graph: cannot write '" + tmp + "': " + std::strerror(err));
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) fail("graph: cannot write '" + tmp + "': " + std::strerror(errno));
}

// Waits for dot; false when it was not installed (the shell's 127).
bool dot_finished(pid_t pid, const std::string& out) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      fail("graph: waiting for Graphviz's dot: " + std::string(std::strerror(errno)));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return false;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("graph: Graphviz's dot could not render '" + out + "' (exit status " +
         std::to_string(WEXITSTATUS(status)) + ")");
  return true;
}

// Runs `dot -T<format> <in>` and copies what it prints into os (dot never opens the output
// path itself: atomic_write owns it); false when dot is not installed.
bool run_dot(const std::string& format, const std::string& in, const std::string& out,
             std::ostream& os) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    fail("graph: cannot start Graphviz's dot: " + std::string(std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  std::vector<std::string> args = {"dot", "-T" + format, in};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "dot", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    return false;
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    os.write(buf, n);
  }
  ::close(pipe_fds[0]);
  return dot_finished(pid, out);
}

}  // namespace

void check_graph_file_name(const std::string& path, const std::vector<train::NamedInput>& inputs) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext != ".dot" && ext != ".gv" && ext != ".svg" && ext != ".png" && ext != ".pdf")
    fail("graph: '" + path + "': the file name must end in .dot, .svg, .png or .pdf");
  train::check_output_path("graph", path, inputs);
}

void write_graph(const std::string& dot_text, const std::string& path) {
  check_graph_file_name(path);
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".dot" || ext == ".gv")
    return train::atomic_write(path, [&](std::ostream& os) {
      os.write(dot_text.data(), std::streamsize(dot_text.size()));
    });
  std::string tmp;
  write_dot_input(dot_text, path, tmp);
  try {
    train::atomic_write(path, [&](std::ostream& os) {
      if (!run_dot(ext.substr(1), tmp, path, os))
        fail("graph: rendering '" + path +
             "' needs Graphviz's dot (apt-get install graphviz), or name a .dot file");
    });
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  ::unlink(tmp.c_str());
}

}  // namespace graft::plot
