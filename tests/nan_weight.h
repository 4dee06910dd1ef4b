// A model that loads but computes NaN: one weight tensor of a safetensors file filled with NaN
// through the library, its checksum restored as the library computes it (checksum_metadata), so
// that the file still passes every load check. For the tests of the programs' output checks
// (examples/common/finite.h): test_classify, test_lm and, through tests/nan_weight.cpp,
// tests/bad_inputs.sh.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "graft/nn/train/checkpoint.h"

namespace graft::testing {

// Fills tensor `name` of the safetensors file at `path` with NaN and writes the file back with
// its checksum recomputed (when it has one); throws naming the tensors it has when there is no
// floating tensor of that name.
inline void put_nan_weight(const std::string& path, const std::string& name) {
  train::SafetensorsFile f = train::load_safetensors(path);
  bool done = false;
  std::string names;
  for (auto& [n, t] : f.tensors) {
    names += (names.empty() ? "" : ", ") + n;
    if (n != name || t.dtype() == DType::i64) continue;
    if (t.dtype() == DType::f32)
      t = from_vector(std::vector<float>((size_t)t.numel(), NAN), t.shape());
    else t = from_vector(std::vector<double>((size_t)t.numel(), NAN), t.shape());
    done = true;
  }
  if (!done)
    fail("put_nan_weight: '" + path + "' has no floating tensor '" + name + "' (" + names + ")");
  if (f.metadata.count("checksum"))
    for (const auto& [k, v] : train::checksum_metadata(f.tensors)) f.metadata[k] = v;
  train::save_safetensors(path, f.tensors, f.metadata);
}

}  // namespace graft::testing
