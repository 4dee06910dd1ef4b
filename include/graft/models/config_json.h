/// @file
/// One JSON reader for the model configs (Transformer, LM, classifier): every missing, mistyped
/// or out-of-range field is an error naming the field and where it came from (such as the file).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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

/// The range checks of a config's values, written once: the field factories (size_field() ...)
/// use them, and both a config's from_json() and its model's constructor call validate().
/// Errors are bad_field()'s.
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
  /// An integer in [lo, hi].
  /// @throws graft::Error when v is outside [lo, hi].
  void range(const char* name, int64_t v, int64_t lo, int64_t hi) const;
  /// Throws bad_field(where, name, why).
  /// @throws graft::Error always.
  [[noreturn]] void bad(const char* name, const std::string& why) const {
    bad_field(where_, name, why);
  }

 private:
  std::string where_;
};

/// Reads the fields of one JSON object (a config's "model" section) by type; the ranges are
/// checked afterwards by the config's validate() (ConfigCheck, check_fields()). Every error is
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
  /// Throws the reader's error for field `name`: `<where>: field "<name>" <why>`.
  /// @throws graft::Error always.
  [[noreturn]] void bad(const char* name, const std::string& why) const {
    bad_field(where_, name, why);
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

/// One field of a model config, the one place it is described: its JSON key (also its name in
/// errors), an older key it is still read from, whether a file must hold it, and how it is read,
/// written and range-checked. A config's table of fields (its fields()) drives its to_json(),
/// from_json() and validate() through write_fields(), read_fields() and check_fields().
template <class C>
struct ConfigField {
  const char* name = "";  ///< the JSON key, and the field's name in errors
  const char* doc = "";   ///< what it is, in a line
  bool required = true;   ///< absent from a file: an error (false: the default is kept)
  /// An older key, read when `name` is absent and never written (old runs' config.json files).
  const char* alias = nullptr;
  /// Reads the value at JSON key `key` (`name`, or `alias` for an older file) into the config.
  std::function<void(C&, const ConfigReader&, const char* key)> read;
  /// Writes the value under `name`.
  std::function<void(const C&, nlohmann::json&)> write;
  /// Checks the range (empty: any value of the type is valid).
  std::function<void(const C&, const ConfigCheck&)> check;

  /// This field, absent from a file meaning its default.
  ConfigField optional() const {
    ConfigField f = *this;
    f.required = false;
    return f;
  }
  /// This field, also read from the older key `old` (with the same reader, unless `old_read`).
  ConfigField or_old(
      const char* old,
      std::function<void(C&, const ConfigReader&, const char*)> old_read = {}) const {
    ConfigField f = *this;
    f.alias = old;
    if (old_read)
      f.read = [key = name, now = read, old_read](C& c, const ConfigReader& r, const char* k) {
        (std::string(k) == key ? now : old_read)(c, r, k);
      };
    return f;
  }
  /// This field with a further check `more` after its own (e.g. one that involves another field).
  ConfigField and_check(std::function<void(const C&, const ConfigCheck&)> more) const {
    ConfigField f = *this;
    f.check = [first = check, more](const C& c, const ConfigCheck& k) {
      if (first) first(c, k);
      more(c, k);
    };
    return f;
  }
};

/// A config's field table.
template <class C>
using ConfigFields = std::vector<ConfigField<C>>;

/// The accessor of member m, for the field factories: `member(&C::vocab)`.
template <class M>
auto member(M m) {
  return [m](auto& c) -> auto& { return c.*m; };
}

/// A field of any JSON-readable type (bool, integer, double, string) that every value of is
/// valid, held at `at(c)` (member() or a lambda).
template <class C, class At>
ConfigField<C> value_field(const char* name, At at, const char* doc) {
  ConfigField<C> f;
  f.name = name, f.doc = doc;
  f.read = [at](C& c, const ConfigReader& r, const char* key) { r.get(key, at(c)); };
  f.write = [at, name](const C& c, nlohmann::json& j) { j[name] = at(c); };
  return f;
}

/// An int64 field in [lo, hi].
template <class C, class At>
ConfigField<C> range_field(const char* name, At at, int64_t lo, int64_t hi, const char* doc) {
  return value_field<C>(name, at, doc).and_check([=](const C& c, const ConfigCheck& k) {
    k.range(name, at(c), lo, hi);
  });
}

/// A size: an int64 field in [1, max].
template <class C, class At>
ConfigField<C> size_field(const char* name, At at, const char* doc, int64_t max = kMaxSize) {
  return range_field<C>(name, at, 1, max, doc);
}

/// A drop probability in [0, 1].
template <class C, class At>
ConfigField<C> probability_field(const char* name, At at, const char* doc) {
  return value_field<C>(name, at, doc).and_check([=](const C& c, const ConfigCheck& k) {
    k.probability(name, at(c));
  });
}

/// A token id in [0, vocab) (the config's vocab field).
template <class C, class At>
ConfigField<C> token_field(const char* name, At at, const char* doc) {
  return value_field<C>(name, at, doc).and_check([=](const C& c, const ConfigCheck& k) {
    k.token_id(name, at(c), c.vocab);
  });
}

/// The values of a choice_field and their JSON names.
template <class E>
using ChoiceNames = std::vector<std::pair<E, const char*>>;

/// "a, b or c": the names of a choice_field's values.
template <class E>
std::string choices_text(const ChoiceNames<E>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i].second);
  return s;
}

/// The JSON name of value v in `names` ("" when it is not there).
template <class E>
const char* choice_name(const ChoiceNames<E>& names, E v) {
  for (auto& [e, n] : names)
    if (e == v) return n;
  return "";
}

/// s made printable for an error message (text::printable()).
std::string printable_value(const std::string& s);

/// A field of named values (an enum E held at `at(c)`): `names` maps each allowed value to its
/// JSON string; another string, or a value outside `names`, is an error listing them.
template <class C, class E, class At>
ConfigField<C> choice_field(const char* name, At at, ChoiceNames<E> names, const char* doc) {
  ConfigField<C> f;
  f.name = name, f.doc = doc;
  f.read = [=](C& c, const ConfigReader& r, const char* key) {
    std::string s;
    r.get(key, s);
    for (auto& [v, n] : names)
      if (s == n) return void(at(c) = v);
    r.bad(key, "must be " + choices_text(names) + ", got '" + printable_value(s) + "'");
  };
  f.write = [=](const C& c, nlohmann::json& j) { j[name] = choice_name(names, at(c)); };
  f.check = [=](const C& c, const ConfigCheck& k) {
    if (!*choice_name(names, at(c)))
      k.bad(name, "must be " + choices_text(names) + ", got another value");
  };
  return f;
}

/// The FFN activation field "activation", one of `allowed` (by nn::activation_name()).
template <class C, class At>
ConfigField<C> activation_field(At at, const std::vector<nn::Activation>& allowed) {
  ChoiceNames<nn::Activation> names;
  for (nn::Activation a : allowed) names.push_back({a, nn::activation_name(a)});
  ConfigField<C> f =
      choice_field<C, nn::Activation>("activation", at, names, "the FFN's activation");
  f.check = [=](const C& c, const ConfigCheck& k) {  // names the value refused
    if (!*choice_name(names, at(c)))
      k.bad("activation", "must be " + choices_text(names) + ", got " + nn::activation_name(at(c)));
  };
  return f;
}

/// Writes every field of the table into a JSON object.
template <class C>
nlohmann::json write_fields(const C& c, const ConfigFields<C>& fields) {
  nlohmann::json j = nlohmann::json::object();
  for (const ConfigField<C>& f : fields) f.write(c, j);
  return j;
}

/// Reads every field of the table present in j (by its name, else its older alias); a required
/// field that is absent is an error `<where>: field "<name>" is missing`.
/// @throws graft::Error naming the field and `where` for a missing or mistyped value, or when j
///         is not a JSON object.
template <class C>
void read_fields(C& c, const nlohmann::json& j, const std::string& where,
                 const ConfigFields<C>& fields) {
  const ConfigReader r(j, where);
  for (const ConfigField<C>& f : fields) {
    if (!j.is_object()) r.bad(f.name, "cannot be read: the section is not a JSON object");
    const char* key = f.alias && !j.contains(f.name) && j.contains(f.alias) ? f.alias : f.name;
    if (j.contains(key)) f.read(c, r, key);
    else if (f.required) r.bad(f.name, "is missing");
  }
}

/// Checks every field's range, in the table's order.
/// @throws graft::Error `<where>: field "<name>" ...` for the first field out of range.
template <class C>
void check_fields(const C& c, const std::string& where, const ConfigFields<C>& fields) {
  const ConfigCheck k(where);
  for (const ConfigField<C>& f : fields)
    if (f.check) f.check(c, k);
}

/// What every model config holds (the Transformer's and the single-stack models'): sizes,
/// dropout, positions, LayerNorm placement, pad id, dtype, seed. Its fields' table is
/// model_fields().
struct ModelConfig {
  /// Vocabulary size, model width, attention heads (dividing d_model), FFN width, and the
  /// longest sequence (the learned or precomputed position table).
  ///@{
  int64_t vocab = 1000, d_model = 128, heads = 4, d_ff = 512, max_len = 256;
  ///@}
  double dropout = 0.1;           ///< on the embeddings and in every layer
  nn::PositionOptions positions;  ///< the positional encoding and its settings
  bool norm_first = false;        ///< pre-LN (true) or post-LN (false)
  int64_t pad_id = 0;             ///< the padding token, in [0, vocab)
  DType dtype = DType::f32;       ///< of every parameter
  uint64_t seed = 1;              ///< initialisation and dropout masks
};

/// The optional field "rope_scaling" (nn::parse_rope_scaling(): none, linear, llama3); its
/// factors are checked by nn::rope_frequencies(), named in the error.
template <class C>
ConfigField<C> rope_scaling_field() {
  ConfigField<C> f;
  f.name = "rope_scaling", f.doc = "rope: how the frequencies are scaled", f.required = false;
  f.read = [](C& c, const ConfigReader& r, const char* key) {
    std::string s;
    r.get(key, s);
    try {
      c.positions.rope_scaling = nn::parse_rope_scaling(s);
    } catch (const Error& e) {
      r.bad("rope_scaling", e.what());
    }
  };
  f.write = [](const C& c, nlohmann::json& j) {
    j["rope_scaling"] = nn::rope_scaling_name(c.positions.rope_scaling);
  };
  f.check = [](const C& c, const ConfigCheck& k) {
    if (c.positions.rope_scaling == nn::RopeScaling::none) return;
    try {
      nn::rope_frequencies(c.positions, 2);
    } catch (const Error& e) {
      k.bad("rope_scaling", e.what());
    }
  };
  return f;
}

/// The position settings' fields, each optional: "positions" (the kind, nn::parse_positions()),
/// "rope_base" (> 1), the rope scaling ("rope_scaling", "rope_factor",
/// "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_len"),
/// "relative_buckets" (in [4, 4096]) and "relative_max_distance" (in [1, 2^24]), of a config C
/// with a `positions` member.
template <class C>
ConfigFields<C> positions_fields() {
  ConfigField<C> kind;
  kind.name = "positions", kind.doc = "the positional encoding", kind.required = false;
  kind.read = [](C& c, const ConfigReader& r, const char* key) {
    std::string s;
    r.get(key, s);
    try {
      c.positions.kind = nn::parse_positions(s);
    } catch (const Error& e) {
      r.bad("positions", e.what());
    }
  };
  kind.write = [](const C& c, nlohmann::json& j) {
    j["positions"] = nn::positions_name(c.positions.kind);
  };
  auto pos = [](auto nn::PositionOptions::*m) {
    return [m](auto& c) -> auto& { return c.positions.*m; };
  };
  return {
      kind,
      value_field<C>("rope_base", pos(&nn::PositionOptions::rope_base), "rope's frequency base")
          .optional()
          .and_check([](const C& c, const ConfigCheck& k) {
            if (!(c.positions.rope_base > 1)) k.bad("rope_base", "must be > 1");
          }),
      rope_scaling_field<C>(),
      value_field<C>("rope_factor", pos(&nn::PositionOptions::rope_factor),
                     "rope linear/llama3: the frequency divisor")
          .optional(),
      value_field<C>("rope_low_freq_factor", pos(&nn::PositionOptions::rope_low_freq_factor),
                     "rope llama3: original_max_len / this is the longest blended wavelength")
          .optional(),
      value_field<C>("rope_high_freq_factor", pos(&nn::PositionOptions::rope_high_freq_factor),
                     "rope llama3: original_max_len / this is the shortest blended wavelength")
          .optional(),
      value_field<C>("rope_original_max_len", pos(&nn::PositionOptions::rope_original_max_len),
                     "rope llama3: the context the model was trained on")
          .optional(),
      range_field<C>("relative_buckets", pos(&nn::PositionOptions::relative_buckets), 4, 4096,
                     "relative: the bias table's buckets")
          .optional(),
      range_field<C>("relative_max_distance", pos(&nn::PositionOptions::relative_max_distance), 1,
                     int64_t(1) << 24, "relative: the distance of the last bucket")
          .optional(),
  };
}

/// The fields of every model config (ModelConfig's), for a config type C derived from it:
/// vocab, d_model, heads (dividing d_model), d_ff, max_len, dropout, norm_first, pad_id, dtype,
/// seed and the position settings (positions_fields()).
template <class C>
ConfigFields<C> model_fields() {
  auto heads_divide = [](const C& c, const ConfigCheck& k) { k.heads_divide(c.heads, c.d_model); };
  ConfigFields<C> f = {
      size_field<C>("vocab", member(&C::vocab), "vocabulary size"),
      size_field<C>("d_model", member(&C::d_model), "model width"),
      size_field<C>("heads", member(&C::heads), "attention heads").and_check(heads_divide),
      size_field<C>("d_ff", member(&C::d_ff), "FFN width"),
      size_field<C>("max_len", member(&C::max_len), "the longest sequence", kMaxLen),
      probability_field<C>("dropout", member(&C::dropout), "on the embeddings and every layer"),
      value_field<C>("norm_first", member(&C::norm_first), "pre-LN (true) or post-LN (false)"),
      token_field<C>("pad_id", member(&C::pad_id), "the padding token"),
      choice_field<C, DType>("dtype", member(&C::dtype),
                             {{DType::f32, "float32"},
                              {DType::f64, "float64"},
                              {DType::bf16, "bfloat16"},
                              {DType::f16, "float16"}},
                             "of every parameter")
          .optional(),
      value_field<C>("seed", member(&C::seed), "initialisation and dropout masks").optional(),
  };
  for (ConfigField<C>& p : positions_fields<C>()) f.push_back(std::move(p));
  return f;
}

/// What the single-stack models (DecoderOnlyLM, EncoderClassifier, BertEncoder) share: a
/// ModelConfig and one stack of `layers` layers. Their configs derive from it.
struct StackConfig : ModelConfig {
  int64_t layers = 2;  ///< the number of layers
  /// Parameter count of embedding + positions + the layers (+ a final LayerNorm when
  /// final_norm), without building anything.
  /// @throws graft::Error when the count overflows int64.
  int64_t stack_parameters(bool final_norm) const;
  /// The LayerConfig of each layer.
  nn::LayerConfig layer() const;
};

/// model_fields() and "layers" in [1, kMaxLayers]: the fields of a StackConfig C.
template <class C>
ConfigFields<C> stack_fields() {
  ConfigFields<C> f = model_fields<C>();
  f.insert(f.begin() + 4,
           size_field<C>("layers", member(&C::layers), "the number of layers", kMaxLayers));
  return f;
}

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

/// Refuses, naming `path`, a model loaded from a weights file of `file_bytes` bytes whose
/// tensors become the model's (an export): the file's size, plus 8 bytes for each of `buffers`
/// elements built in float64, against this machine's memory. Checked before the file is read.
/// @throws graft::Error "<path>: loading it takes ... more than this machine's ... of memory".
void check_file_memory(double file_bytes, int64_t buffers, const std::string& path);

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

/// load_run_weights() returning the whole file: its tensors and its metadata (checksum, step).
/// @throws graft::Error as load_run_weights().
template <class Config>
train::SafetensorsFile load_run_weights_file(const Config& c, const std::string& config_path,
                                             const std::string& weights_path,
                                             const std::vector<std::string>& tied_files) {
  train::SafetensorsFile f = train::load_weights_file(weights_path, "load_run", tied_files);
  check_weights_count(c.parameter_count(), f.tensors, config_path, weights_path);
  check_config_memory(c, config_path, /*copies=*/2);  // the file's tensors and the model's
  return f;
}

/// A run directory's weights for config c, in the order that keeps a bad directory from costing
/// anything: the weights file (its checksum, its fingerprints of the tied files), then the
/// config's sizes against it and against memory. Build the model only after this.
/// @throws graft::Error from train::load_weights(), check_weights_count() or check_config_memory().
template <class Config>
std::vector<std::pair<std::string, Tensor>> load_run_weights(
    const Config& c, const std::string& config_path, const std::string& weights_path,
    const std::vector<std::string>& tied_files) {
  return load_run_weights_file(c, config_path, weights_path, tied_files).tensors;
}

/// A model's token ids: int64 (B, T), else an error naming `who` and the tensor.
/// @throws graft::Error "<who>: token ids must be int64 (B, T), got ...".
void check_token_ids(const char* who, const Tensor& ids);

}  // namespace graft::models
