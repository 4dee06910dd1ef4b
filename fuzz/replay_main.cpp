// The fuzz targets as plain programs for `make test`: runs LLVMFuzzerTestOneInput over every
// file in the given directories (the seed corpus and every crashing or slow input a fuzzing run
// found, kept under fuzz/regressions/<target>). A crash or sanitizer report fails the test; a
// hang runs into ctest's timeout.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  size_t n = 0;
  double slowest = 0;
  std::string slowest_name;
  for (int a = 1; a < argc; ++a) {
    if (!fs::is_directory(argv[a])) continue;
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(argv[a]))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      const auto t0 = std::chrono::steady_clock::now();
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > slowest) slowest = s, slowest_name = f.filename().string();
      ++n;
    }
  }
  std::printf("replayed %zu inputs (slowest %.3f s: %s)\n", n, slowest, slowest_name.c_str());
  return n > 0 ? 0 : 1;  // an empty corpus means the paths are wrong
}
