// One JSON reader for the model configs (Transformer, LM, classifier): every missing, mistyped
// or out-of-range field is an error naming the field and where it came from (e.g. the file).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "graft/nn/checkpoint.h"
#include "graft/nn/positions.h"
#include "graft/nn/transformer.h"

namespace graft::models {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  // Required field, of exactly the JSON type T needs (nn::json_complaint): 2.5 is not an
  // integer, -1 is not an unsigned seed, "3" is not a number.
  template <class T>
  void get(const char* name, T& v) const {
    if (!j_.is_object()) bad(name, "cannot be read: the section is not a JSON object");
    if (!j_.contains(name)) bad(name, "is missing");
    if (std::string c = nn::json_complaint<T>(j_[name]); !c.empty()) bad(name, c);
    v = j_[name].get<T>();
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
  int64_t stack_parameters(bool final_norm) const;  // embedding + positions + the layers
  void read_stack(const ConfigReader& r);  // every field required, range-checked
  nn::LayerConfig layer() const;
};

// What a config costs before the model is built: its parameter count (each config's
// parameter_count(), equal to the built model's num_parameters(); tested) and the buffer
// elements (the sinusoid table). Errors on int64 overflow.
int64_t embedding_parameters(int64_t vocab, int64_t d_model, int64_t max_len, nn::Positions kind);
int64_t buffer_elements(int64_t d_model, int64_t max_len, nn::Positions kind);

// Refuses, naming `where` (the config file), a model that would not fit in this machine's memory
// (the smaller of physical memory and the cgroup limit): for training (copies = 4: weights,
// gradients and Adam's two moments) or inference (copies = 1), plus the buffers. Checked
// before any module is built, so a config with 10^9 layers fails in microseconds.
void check_model_memory(int64_t parameters, int64_t buffers, DType dt, const std::string& where, int copies = 4);

// Loading: the weights file must hold exactly the parameters the config describes, checked
// before the model is built (config_path and weights_path are named in the error).
void check_weights_count(int64_t parameters, const std::vector<std::pair<std::string, Tensor>>& weights,
                         const std::string& config_path, const std::string& weights_path);

// check_model_memory for any family's config.
template <class Config>
void check_config_memory(const Config& c, const std::string& where, int copies = 4) {
  try {
    check_model_memory(c.parameter_count(), buffer_elements(c.d_model, c.max_len, c.positions.kind), c.dtype, where,
                       copies);
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.rfind(where, 0) == 0) throw;
    fail(where + ": " + m);  // an overflow while counting: name the file too
  }
}

// A run directory's weights for config c, in the order that keeps a bad directory from costing
// anything: the weights file (its checksum, its fingerprints of the tied files), then the
// config's sizes against it and against memory. Build the model only after this.
template <class Config>
std::vector<std::pair<std::string, Tensor>> load_run_weights(const Config& c, const std::string& config_path,
                                                             const std::string& weights_path,
                                                             const std::vector<std::string>& tied_files) {
  auto w = nn::load_weights(weights_path, "load_run", tied_files);
  check_weights_count(c.parameter_count(), w, config_path, weights_path);
  check_config_memory(c, config_path, /*copies=*/1);
  return w;
}

// A model's token ids: int64 (B, T), else an error naming `who` and the tensor.
void check_token_ids(const char* who, const Tensor& ids);

}  // namespace graft::models
