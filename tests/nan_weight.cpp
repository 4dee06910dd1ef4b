// nan_weight FILE TENSOR: fills one weight of a safetensors file with NaN, its checksum restored
// (tests/nan_weight.h), for tests/bad_inputs.sh's cases of a model that computes NaN.
#include <cstdio>
#include <exception>

#include "tests/nan_weight.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: nan_weight FILE TENSOR\n");
    return 2;
  }
  try {
    graft::testing::put_nan_weight(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nan_weight: %s\n", e.what());
    return 1;
  }
  return 0;
}
