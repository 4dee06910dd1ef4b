#include <algorithm>
#include <cmath>

#include "graft/autograd/text.h"
#include "graft/models/config_json.h"
#include "graft/models/hf.h"
#include "hf_gpt2.h"

namespace graft::models {

namespace {

bool present(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// The model_type, refused unless graft maps it onto DecoderOnlyLM.
std::string hf_model_type(const ConfigReader& r) {
  std::string type;
  r.get("model_type", type);
  if (type != "llama" && type != "mistral" && type != "qwen2" && type != "gpt2")
    r.bad("model_type", "\"" + text::printable(type) +
                            "\" is not supported: graft reads llama, mistral, qwen2 and gpt2 "
                            "causal LMs");
  return type;
}

// One rope dict (v4 rope_scaling or v5 rope_parameters): the default type, linear or llama3,
// read into o; the other types are refused naming the field.
void read_rope_dict(const nlohmann::json& rope, const ConfigReader& r, const std::string& where,
                    const std::string& key, nn::PositionOptions& o) {
  if (!rope.is_object()) r.bad(key.c_str(), "must be an object or null");
  std::string type = "default";
  const ConfigReader inner(rope, where + ": " + key);
  if (rope.contains("rope_type")) inner.get("rope_type", type);
  else if (rope.contains("type")) inner.get("type", type);
  if (type == "default") return;
  if (type != "linear" && type != "llama3")
    r.bad((key + ".rope_type").c_str(), "\"" + text::printable(type) +
                                            "\" is not supported (graft reads default, linear "
                                            "and llama3)");
  o.rope_scaling = nn::parse_rope_scaling(type);
  inner.get("factor", o.rope_factor);
  if (type == "llama3") {
    inner.get("low_freq_factor", o.rope_low_freq_factor);
    inner.get("high_freq_factor", o.rope_high_freq_factor);
    inner.get("original_max_position_embeddings", o.rope_original_max_len);
  }
  try {
    nn::rope_frequencies(o, 2);
  } catch (const Error& e) {
    r.bad(key.c_str(), e.what());
  }
}

// rope_theta and the rope scaling, from either transformers' 4.x or 5.x keys.
nn::PositionOptions hf_rope(const nlohmann::json& j, const ConfigReader& r,
                            const std::string& where) {
  nn::PositionOptions o;
  o.kind = nn::Positions::rope;
  r.get_or_keep("rope_theta", o.rope_base);
  if (present(j, "rope_scaling")) read_rope_dict(j["rope_scaling"], r, where, "rope_scaling", o);
  if (present(j, "rope_parameters")) {
    const nlohmann::json& p = j["rope_parameters"];
    read_rope_dict(p, r, where, "rope_parameters", o);
    ConfigReader(p, where + ": rope_parameters").get_or_keep("rope_theta", o.rope_base);
  }
  if (!(o.rope_base > 1) || !std::isfinite(o.rope_base))
    r.bad("rope_theta", "must be finite and > 1");
  return o;
}

// head_dim may be stated; graft derives it as hidden_size / num_attention_heads.
void check_head_dim(const nlohmann::json& j, const ConfigReader& r, const LMConfig& c) {
  if (!present(j, "head_dim")) return;
  int64_t dh = 0;
  r.get("head_dim", dh);
  if (dh != c.d_model / c.heads)
    r.bad("head_dim", std::to_string(dh) + " is not hidden_size / num_attention_heads = " +
                          std::to_string(c.d_model) + " / " + std::to_string(c.heads) +
                          " (not supported)");
}

// The sizes' ranges under the file's own field names (LMConfig::validate() would name graft's).
void check_hf_sizes(const LMConfig& c, const std::string& where) {
  const ConfigCheck k(where);
  k.size("vocab_size", c.vocab), k.size("hidden_size", c.d_model);
  k.size("intermediate_size", c.d_ff), k.size("num_hidden_layers", c.layers, kMaxLayers);
  k.size("num_attention_heads", c.heads), k.size("num_key_value_heads", c.kv_heads, c.heads);
  if (c.d_model % c.heads != 0)
    k.bad("num_attention_heads",
          std::to_string(c.heads) + " does not divide hidden_size " + std::to_string(c.d_model));
  if (c.heads % c.kv_heads != 0)
    k.bad("num_key_value_heads", std::to_string(c.kv_heads) +
                                     " does not divide num_attention_heads " +
                                     std::to_string(c.heads));
  if (!(c.eps > 0) || !std::isfinite(c.eps)) k.bad("rms_norm_eps", "must be finite and > 0");
}

// A sliding window shorter than the positions the model accepts changes the attention.
// MistralConfig's window is 4096 when the field is absent; Qwen2's only acts when switched on.
void check_sliding_window(const nlohmann::json& j, const ConfigReader& r, const std::string& type,
                          int64_t max_positions) {
  if (type == "qwen2") {
    bool use = false;
    r.get_or_keep("use_sliding_window", use);
    if (use) r.bad("use_sliding_window", "is true: sliding-window attention is not supported");
    return;
  }
  int64_t w = type == "mistral" && !j.contains("sliding_window") ? 4096 : -1;
  if (present(j, "sliding_window")) r.get("sliding_window", w);
  if (w >= 0 && w < max_positions)
    r.bad("sliding_window", std::to_string(w) + " < max_position_embeddings " +
                                std::to_string(max_positions) +
                                ": sliding-window attention is not supported");
}

std::vector<int64_t> hf_token_ids(const nlohmann::json& j, const ConfigReader& r, const char* key) {
  if (!present(j, key)) return {};
  std::vector<int64_t> ids;
  if (j[key].is_array()) r.get(key, ids);
  else ids.push_back(0), r.get(key, ids[0]);
  return ids;
}

HfLMFacts hf_facts(const nlohmann::json& j, const ConfigReader& r, const std::string& type) {
  HfLMFacts f;
  f.model_type = type;
  f.eos_ids = hf_token_ids(j, r, "eos_token_id");
  const std::vector<int64_t> bos = hf_token_ids(j, r, "bos_token_id");
  if (bos.size() > 1) r.bad("bos_token_id", "must be one id");
  if (!bos.empty()) f.bos_id = bos[0];
  if (type == "qwen2") f.qkv_bias = true;
  else r.get_or_keep("attention_bias", f.attention_bias);
  if (type == "llama") r.get_or_keep("mlp_bias", f.mlp_bias);
  std::string act = "silu";
  r.get_or_keep("hidden_act", act);
  if (act != "silu" && act != "swish")
    r.bad("hidden_act", "must be silu (SwiGLU), got \"" + text::printable(act) + "\"");
  return f;
}

// max_position_embeddings when the file has none: each family's class default.
int64_t default_max_positions(const std::string& type) {
  return type == "mistral" ? 131072 : type == "qwen2" ? 32768 : 2048;
}

LMConfig hf_lm_fields(const nlohmann::json& j, const ConfigReader& r, const std::string& where) {
  LMConfig c;
  r.get("vocab_size", c.vocab), r.get("hidden_size", c.d_model);
  r.get("intermediate_size", c.d_ff), r.get("num_hidden_layers", c.layers);
  r.get("num_attention_heads", c.heads);
  c.kv_heads = c.heads;
  r.get_or_keep("num_key_value_heads", c.kv_heads);
  c.eps = 1e-6;
  r.get_or_keep("rms_norm_eps", c.eps);
  c.tied_output = false;
  r.get_or_keep("tie_word_embeddings", c.tied_output);
  c.positions = hf_rope(j, r, where);
  c.rms_norm = true, c.activation = nn::Activation::swiglu, c.norm_first = true;
  c.dropout = 0, c.pad_id = 0, c.mask_pad = false, c.scale_embedding = false;
  return c;
}

}  // namespace

HfLMConfig hf_lm_config(const nlohmann::json& j, const std::string& where) {
  const ConfigReader r(j, where);
  const std::string type = hf_model_type(r);
  if (type == "gpt2") return hf_gpt2_config(j, where);
  HfLMConfig out{hf_lm_fields(j, r, where), hf_facts(j, r, type)};
  LMConfig& c = out.lm;
  check_hf_sizes(c, where);
  check_head_dim(j, r, c);
  int64_t& positions = out.hf.max_positions;
  positions = default_max_positions(type);
  r.get_or_keep("max_position_embeddings", positions);
  if (positions < 1) r.bad("max_position_embeddings", "must be >= 1");
  check_sliding_window(j, r, type, positions);
  // rope has no table: graft's longest sequence is the file's, up to graft's own limit.
  c.max_len = std::min(positions, kMaxLen);
  for (int64_t id : out.hf.eos_ids) ConfigCheck(where).token_id("eos_token_id", id, c.vocab);
  if (present(j, "bos_token_id"))
    ConfigCheck(where).token_id("bos_token_id", out.hf.bos_id, c.vocab);
  c.bias = out.hf.attention_bias || out.hf.qkv_bias || out.hf.mlp_bias;
  c.validate(where);
  return out;
}

}  // namespace graft::models
