// Shared by the fuzz targets: inputs that the code under test reads from a path go through a
// per-process temp file.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace graft::fuzz {

// Removes the paths when the process exits (the replay tests run in ctest; nothing is left in
// /tmp or /dev/shm).
inline void remove_at_exit(const std::string& path) {
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      std::error_code ec;
      for (auto& p : paths) std::filesystem::remove_all(p, ec);
    }
  };
  static Cleanup c;
  c.paths.push_back(path);
}

inline std::string write_temp(const char* tag, const uint8_t* data, size_t size) {
  const std::string path = "/tmp/graft_fuzz_" + std::to_string(::getpid()) + "_" + tag;
  static std::vector<std::string> registered;
  if (std::find(registered.begin(), registered.end(), path) == registered.end())
    registered.push_back(path), remove_at_exit(path);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("fuzz: cannot write " + path);
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace graft::fuzz
