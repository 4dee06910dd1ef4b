// Fuzz target: any bytes as a safetensors file (weights or train state). Loading must either
// succeed or throw graft::Error; a loaded tensor of any dtype (BF16, F16 and I8 bits included:
// NaN payloads, subnormals) converts to float32 and back to its own dtype without crashing.
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
    for (auto& [name, t] : f.tensors) {
      (void)graft::train::weights_checksum({{name, t}});
      if (t.numel() > (1 << 16)) continue;  // keeps each input's work bounded
      (void)t.to_vector<double>();
      // float32 holds every bf16, f16 and int8 value exactly, so each comes back.
      if (graft::is_half(t.dtype()) || t.dtype() == graft::DType::i8)
        (void)graft::cast_copy(graft::cast_copy(t, graft::DType::f32), t.dtype());
    }
    (void)graft::train::load_weights(path, "fuzz");
  } catch (const graft::Error&) {
  }
  return 0;
}
