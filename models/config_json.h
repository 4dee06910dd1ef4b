// One JSON reader for the model configs (Transformer, LM, classifier): every missing, mistyped
// or out-of-range field is an error naming the field and where it came from (e.g. the file).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "nn/positions.h"
#include "nn/transformer.h"

namespace graft::models {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  // Required field.
  template <class T>
  void get(const char* name, T& v) const {
    try {
      v = j_.at(name).get<T>();
    } catch (const std::exception& e) {
      bad(name, j_.contains(name) ? "has the wrong type (" + std::string(e.what()) + ")" : "is missing");
    }
  }
  // Optional field: left as is when absent.
  template <class T>
  void get_or_keep(const char* name, T& v) const {
    if (j_.contains(name)) get(name, v);
  }
  // A size in [1, max].
  void size(const char* name, int64_t& v, int64_t max = int64_t(1) << 24) const;
  void probability(const char* name, double& v) const;  // in [0, 1)
  DType dtype(const char* name) const;                  // "float32" | "float64"
  // "positions" (+ rope_base, relative_buckets, relative_max_distance), each optional.
  void positions(nn::PositionOptions& p) const;
  [[noreturn]] void bad(const char* name, const std::string& why) const;

 private:
  const nlohmann::json& j_;
  std::string where_;
};

// The same fields written back.
nlohmann::json positions_json(const nn::PositionOptions& p);

// What the single-stack models (DecoderOnlyLM, EncoderClassifier) share: sizes, dropout,
// positions, LayerNorm placement, pad id, dtype, seed. Their configs derive from it.
struct StackConfig {
  int64_t vocab = 1000, d_model = 128, heads = 4, d_ff = 512, layers = 2, max_len = 256;
  double dropout = 0.1;
  nn::PositionOptions positions;
  bool norm_first = false;
  int64_t pad_id = 0;
  DType dtype = DType::f32;
  uint64_t seed = 1;

  nlohmann::json stack_json() const;
  void read_stack(const ConfigReader& r);  // every field required, range-checked
  nn::LayerConfig layer() const;
};

// A model's token ids: int64 (B, T), else an error naming `who` and the tensor.
void check_token_ids(const char* who, const Tensor& ids);

}  // namespace graft::models
