// Checkpoint files: tensors in the safetensors format, JSON side files, and the atomic write
// that every checkpoint file goes through so a crash mid-save never destroys the last good one.
//
// safetensors layout: an 8-byte little-endian header length N, N bytes of JSON header
//   {"__metadata__": {str: str}, "name": {"dtype": "F32"|"F64"|"I64", "shape": [...],
//    "data_offsets": [begin, end]}, ...}
// then the raw little-endian tensor bytes; offsets are relative to the first byte after the
// header. The data regions tile the data section exactly: no gaps, no overlap, no trailing bytes.
#pragma once

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/tensor.h"

namespace graft::nn {

// Writes the tensors in the order given (names must be unique and not "__metadata__");
// non-contiguous tensors are written as their contiguous copy. Bit-exact: loading the file
// gives back the same bytes. Goes through atomic_write.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  // In data-offset order, which is the order they were saved in for files written here.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;
  std::string path;  // where it was loaded from, for error messages

  // Throws a graft::Error naming the missing tensor and the file.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
};

// Validates the whole file before trusting any of it; every problem is a graft::Error whose
// message starts with "load_safetensors: '<path>': " and names the tensor involved.
SafetensorsFile load_safetensors(const std::string& path);

// Writes "<path>.tmp.<pid>", flushes and fsyncs it, renames it over path, then fsyncs the
// directory. If the writer throws or any step fails, the temp file is removed and whatever
// was at path before is untouched; the writer's own exception is rethrown unchanged, I/O
// failures are graft::Errors naming path. The temp name is per process, so two threads of one
// process must not write the same path at the same time.
void atomic_write(const std::string& path, const std::function<void(std::ostream&)>& writer);

// A hash over every tensor's name, shape and bytes, as 16 hex digits: safetensors carries no
// checksum of its own, so flipped bits in the data section would otherwise load silently.
// Checkpoints store it in their metadata and verify it on load.
std::string weights_checksum(const std::vector<std::pair<std::string, Tensor>>& tensors);

// A module's weights for inference: its state_dict with the step and weights_checksum in the
// metadata, written atomically ...
void save_weights(const std::vector<std::pair<std::string, Tensor>>& state_dict, const std::string& path,
                  int64_t step, const std::string& format);
// ... and read back: the checksum verified (errors "<who>: '<path>': ..." name the file), the
// tensors returned for load_state_dict.
std::vector<std::pair<std::string, Tensor>> load_weights(const std::string& path, const char* who);

void save_json(const std::string& path, const nlohmann::json& j);  // atomic, pretty-printed
// Throws a graft::Error naming the path and, for malformed JSON, the parse error position.
nlohmann::json load_json(const std::string& path);

}  // namespace graft::nn
