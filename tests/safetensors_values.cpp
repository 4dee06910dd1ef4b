// The graft side of tests/test_safetensors_py.py (the check against Python's safetensors):
//   safetensors_values dump FILE
//     prints each tensor of FILE as "name dtype (shape) v1 v2 ..." (graft's short dtype name,
//     values as graft reads them, to_vector<double>, printed with 17 significant digits);
//   safetensors_values write FILE F... -- I...
//     writes FILE with the floats F in bf16, f16, f32 and f64 (graft's rounding) and the
//     integers I in i8 and i64, each under its dtype's short name.
// Exit 2 with the message on stderr for a usage error or a graft::Error.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "graft/nn/train/checkpoint.h"

using namespace graft;

namespace {

void dump(const std::string& path) {
  for (const auto& [name, t] : train::load_safetensors(path).tensors) {
    std::printf("%s %s %s", name.c_str(), dtype_short_name(t.dtype()),
                shape_str(t.shape()).c_str());
    for (double v : t.to_vector<double>()) std::printf(" %.17g", v);
    std::printf("\n");
  }
}

void write(const std::string& path, const std::vector<std::string>& args) {
  std::vector<double> floats;
  std::vector<int64_t> ints;
  bool after = false;
  for (const std::string& a : args) {
    if (a == "--") after = true;
    else if (after) ints.push_back(std::stoll(a));
    else floats.push_back(std::strtod(a.c_str(), nullptr));
  }
  const Shape fs{(int64_t)floats.size()}, is{(int64_t)ints.size()};
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64})
    tensors.emplace_back(dtype_short_name(dt), from_vector(floats, fs, dt));
  for (DType dt : {DType::i8, DType::i64})
    tensors.emplace_back(dtype_short_name(dt), from_vector(ints, is, dt));
  train::save_safetensors(path, tensors, {{"writer", "graft"}});
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 2 && args[0] == "dump") dump(args[1]);
    else if (args.size() >= 2 && args[0] == "write")
      write(args[1], std::vector<std::string>(args.begin() + 2, args.end()));
    else {
      std::cerr << "usage: safetensors_values dump FILE | write FILE FLOAT... -- INT...\n";
      return 2;
    }
  } catch (const Error& e) {
    std::cerr << "safetensors_values: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
