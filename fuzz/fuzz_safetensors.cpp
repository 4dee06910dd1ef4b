// Fuzz target: any bytes as a safetensors file (weights or train state). Loading must either
// succeed or throw graft::Error; a loaded file's tensors must match their declared shapes.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz/fuzz_util.h"
#include "graft/nn/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = graft::fuzz::write_temp("safetensors", data, size);
  try {
    const auto f = graft::train::load_safetensors(path);
    for (auto& [name, t] : f.tensors) (void)graft::train::weights_checksum({{name, t}});
    (void)graft::train::load_weights(path, "fuzz");
  } catch (const graft::Error&) {
  }
  return 0;
}
