/// @file
/// One JSON reader for the model configs (Transformer, LM, classifier): every missing, mistyped
/// or out-of-range field is an error naming the field and where it came from (such as the file).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "graft/nn/positions.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/nn/transformer.h"

/// The models (Transformer, decoder-only LM, encoder classifier), their configs, decoding and
/// loading from a run directory.
namespace graft::models {

/// The largest max_len of any config: 2^16 = 65536 positions (the lm program's --context
/// bound). The learned or sinusoidal position table has max_len x d_model elements, and its
/// time and memory are spent when the model is built, before a single token is read.
constexpr int64_t kMaxLen = int64_t(1) << 16;
/// The most layers of one stack (layers, enc_layers, dec_layers).
constexpr int64_t kMaxLayers = 1024;
/// The largest other size (vocab, d_model, heads, d_ff, classes, ngram_buckets).
constexpr int64_t kMaxSize = int64_t(1) << 24;

/// Throws `<where>: field "<name>" <why>`, the one form of every config error.
/// @throws graft::Error always.
[[noreturn]] void bad_field(const std::string& where, const char* name, const std::string& why);

/// The range checks of a config's values, written once: each family's validate() uses them,
/// and both its from_json() and its model's constructor call validate(). Errors are
/// bad_field()'s.
class ConfigCheck {
 public:
  /// `where` names the config in errors (a file, or the model being built).
  explicit ConfigCheck(std::string where) : where_(std::move(where)) {}
  /// A size in [1, max].
  /// @throws graft::Error when v is outside [1, max].
  void size(const char* name, int64_t v, int64_t max = kMaxSize) const;
  /// A drop probability: in [0, 1] (is_dropout_p; NaN is refused).
  /// @throws graft::Error when v is outside [0, 1] or NaN.
  void probability(const char* name, double v) const;
  /// A token id in [0, vocab).
  /// @throws graft::Error when id is outside [0, vocab).
  void token_id(const char* name, int64_t id, int64_t vocab) const;
  /// heads divides d_model.
  /// @throws graft::Error naming "heads" when it does not.
  void heads_divide(int64_t heads, int64_t d_model) const;
  /// The position settings: rope_base > 1, relative_buckets in [4, 4096],
  /// relative_max_distance in [1, 2^24].
  /// @throws graft::Error naming the field out of range.
  void positions(const nn::PositionOptions& p) const;
  /// Throws bad_field(where, name, why).
  /// @throws graft::Error always.
  [[noreturn]] void bad(const char* name, const std::string& why) const {
    bad_field(where_, name, why);
  }

 private:
  std::string where_;
};

/// Reads the fields of one JSON object (a config's "model" section) by type; the ranges are
/// checked afterwards by the config's validate() (ConfigCheck). Every error is
/// `<where>: field "<name>" ...` (see bad()).
class ConfigReader {
 public:
  /// Reads from `j` (kept by reference: it must outlive the reader); `where` names it in errors.
  ConfigReader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}

  /// Required field, of exactly the JSON type T needs (train::json_complaint): 2.5 is not an
  /// integer, -1 is not an unsigned seed, "3" is not a number.
  /// @throws graft::Error when the section is not an object, or the field is missing or of
  ///         the wrong type.
  template <class T>
  void get(const char* name, T& v) const {
    if (!j_.is_object()) bad(name, "cannot be read: the section is not a JSON object");
    if (!j_.contains(name)) bad(name, "is missing");
    if (std::string c = train::json_complaint<T>(j_[name]); !c.empty()) bad(name, c);
    v = j_[name].get<T>();
  }
  /// Optional field: left as is when absent.
  /// @throws graft::Error when the field is present but of the wrong type.
  template <class T>
  void get_or_keep(const char* name, T& v) const {
    if (j_.contains(name)) get(name, v);
  }
  /// An optional dtype, "float32" (the default) or "float64".
  /// @throws graft::Error for another value.
  DType dtype(const char* name) const;
  /// "positions" (+ rope_base, relative_buckets, relative_max_distance), each optional; their
  /// ranges are ConfigCheck::positions()'.
  /// @throws graft::Error for an unknown kind or a mistyped field.
  void positions(nn::PositionOptions& p) const;
  /// Throws the reader's error for field `name`: `<where>: field "<name>" <why>`.
  /// @throws graft::Error always.
  [[noreturn]] void bad(const char* name, const std::string& why) const {
    bad_field(where_, name, why);
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

/// The fields ConfigReader::positions() reads, written back.
nlohmann::json positions_json(const nn::PositionOptions& p);

/// What the single-stack models (DecoderOnlyLM, EncoderClassifier) share: sizes, dropout,
/// positions, LayerNorm placement, pad id, dtype, seed. Their configs derive from it.
struct StackConfig {
  /// Vocabulary size, model width, attention heads (dividing d_model), FFN width, number of
  /// layers, and the longest sequence (the learned or precomputed position table).
  ///@{
  int64_t vocab = 1000, d_model = 128, heads = 4, d_ff = 512, layers = 2, max_len = 256;
  ///@}
  double dropout = 0.1;           ///< on the embeddings and in every layer
  nn::PositionOptions positions;  ///< the positional encoding and its settings
  bool norm_first = false;        ///< pre-LN (true) or post-LN (false)
  int64_t pad_id = 0;             ///< the padding token, in [0, vocab)
  DType dtype = DType::f32;       ///< of every parameter
  uint64_t seed = 1;              ///< initialisation and dropout masks

  /// The fields as JSON (read_stack() reads them back).
  nlohmann::json stack_json() const;
  /// Parameter count of embedding + positions + the layers (+ a final LayerNorm when
  /// final_norm), without building anything.
  /// @throws graft::Error when the count overflows int64.
  int64_t stack_parameters(bool final_norm) const;
  /// Reads every field (required; dtype and the position settings optional), by type only:
  /// validate() checks the ranges.
  /// @throws graft::Error naming the field for a missing or mistyped value.
  void read_stack(const ConfigReader& r);
  /// Checks every range: sizes in [1, kMaxSize], layers in [1, kMaxLayers], max_len in
  /// [1, kMaxLen], dropout in [0, 1], heads dividing d_model, pad_id in [0, vocab), the
  /// position settings. Errors name `where` and the field.
  /// @throws graft::Error naming the first field out of range.
  void validate_stack(const std::string& where) const;
  /// The LayerConfig of each layer.
  nn::LayerConfig layer() const;
};

/// Parameters of the token embedding and, for learned positions, the position table.
///
/// What a config costs before the model is built: its parameter count (each config's
/// parameter_count(), equal to the built model's num_parameters(); tested) and the buffer
/// elements (the sinusoid table). Errors on int64 overflow.
/// @throws graft::Error when the count overflows int64.
int64_t embedding_parameters(int64_t vocab, int64_t d_model, int64_t max_len, nn::Positions kind);
/// Buffer elements (the sinusoid table; 0 for other kinds), see embedding_parameters().
/// @throws graft::Error when the count overflows int64.
int64_t buffer_elements(int64_t d_model, int64_t max_len, nn::Positions kind);

/// The peak bytes of building a model of `parameters` parameters and `buffers` buffer elements
/// of dtype dt, with `copies` values per parameter (4 for training: weights, gradients and
/// Adam's two moments; 2 for loading: the weights file's tensors and the model's; 1 for a model
/// alone). A sinusoid table is built in float64 before its conversion to dt, so each buffer
/// element costs 8 more bytes while it is built: a float32 table peaks at 3 times its size.
/// @throws graft::Error "model size: the count overflows int64".
double model_peak_bytes(int64_t parameters, int64_t buffers, DType dt, int copies);

/// Refuses, naming `where` (the config file), a model whose model_peak_bytes() exceed this
/// machine's memory (the smaller of physical memory and the cgroup limit). Checked before any
/// module is built, so a config with 10^9 layers fails in microseconds.
/// @throws graft::Error "<where>: the config describes a model of ..." when it does not fit,
///         or "model size: the count overflows int64".
void check_model_memory(int64_t parameters, int64_t buffers, DType dt, const std::string& where,
                        int copies = 4);

/// Loading: the weights file must hold exactly the parameters the config describes, checked
/// before the model is built (config_path and weights_path are named in the error).
/// @throws graft::Error when the element counts differ.
void check_weights_count(int64_t parameters,
                         const std::vector<std::pair<std::string, Tensor>>& weights,
                         const std::string& config_path, const std::string& weights_path);

/// check_model_memory for any family's config (a type with parameter_count(), d_model,
/// max_len, positions and dtype).
/// @throws graft::Error naming `where` when the model does not fit or its size overflows.
template <class Config>
void check_config_memory(const Config& c, const std::string& where, int copies = 4) {
  try {
    check_model_memory(c.parameter_count(), buffer_elements(c.d_model, c.max_len, c.positions.kind),
                       c.dtype, where, copies);
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.rfind(where, 0) == 0) throw;
    fail(where + ": " + m);  // an overflow while counting: name the file too
  }
}

/// A run directory's weights for config c, in the order that keeps a bad directory from costing
/// anything: the weights file (its checksum, its fingerprints of the tied files), then the
/// config's sizes against it and against memory. Build the model only after this.
/// @throws graft::Error from train::load_weights(), check_weights_count() or check_config_memory().
template <class Config>
std::vector<std::pair<std::string, Tensor>> load_run_weights(
    const Config& c, const std::string& config_path, const std::string& weights_path,
    const std::vector<std::string>& tied_files) {
  auto w = train::load_weights(weights_path, "load_run", tied_files);
  check_weights_count(c.parameter_count(), w, config_path, weights_path);
  check_config_memory(c, config_path, /*copies=*/2);  // the file's tensors and the model's
  return w;
}

/// A model's token ids: int64 (B, T), else an error naming `who` and the tensor.
/// @throws graft::Error "<who>: token ids must be int64 (B, T), got ...".
void check_token_ids(const char* who, const Tensor& ids);

}  // namespace graft::models
