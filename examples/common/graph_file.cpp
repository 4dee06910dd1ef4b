#include "examples/common/graph_file.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "graft/autograd/tensor.h"

extern char** environ;

namespace graft::plot {

namespace {

void write_text(const std::string& text, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) fail("graph: cannot write '" + path + "'");
}

// Runs `dot -T<format> -o <out> <in>`; false when dot is not installed.
bool run_dot(const std::string& format, const std::string& in, const std::string& out) {
  std::vector<std::string> args = {"dot", "-T" + format, "-o", out, in};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, "dot", nullptr, nullptr, argv.data(), environ) != 0) return false;
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

}  // namespace

void check_graph_file_name(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext != ".dot" && ext != ".gv" && ext != ".svg" && ext != ".png" && ext != ".pdf")
    fail("graph: '" + path + "': the file name must end in .dot, .svg, .png or .pdf");
}

void write_graph(const std::string& dot_text, const std::string& path) {
  check_graph_file_name(path);
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".dot" || ext == ".gv") return write_text(dot_text, path);
  const std::string format = ext.substr(1);
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + ".dot";
  write_text(dot_text, tmp);
  bool ran = false;
  try {
    ran = run_dot(format, tmp, path);
  } catch (...) {
    std::filesystem::remove(tmp);
    throw;
  }
  std::filesystem::remove(tmp);
  if (!ran)
    fail("graph: rendering '" + path +
         "' needs Graphviz's dot (apt-get install graphviz), or name a .dot file");
}

}  // namespace graft::plot
