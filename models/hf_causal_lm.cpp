#include <filesystem>
#include <map>
#include <set>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/hf.h"
#include "graft/nn/module.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

bool present(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// The model_type, refused unless graft maps it onto DecoderOnlyLM.
std::string hf_model_type(const ConfigReader& r) {
  std::string type;
  r.get("model_type", type);
  if (type != "llama" && type != "mistral" && type != "qwen2")
    r.bad("model_type", "\"" + text::printable(type) +
                            "\" is not supported: graft reads llama, mistral and qwen2 causal LMs");
  return type;
}

// One rope dict (v4 rope_scaling or v5 rope_parameters): only the default type is supported.
void check_rope_type(const nlohmann::json& rope, const ConfigReader& r, const std::string& key) {
  if (!rope.is_object()) r.bad(key.c_str(), "must be an object or null");
  std::string type = "default";
  const ConfigReader inner(rope, "");
  if (rope.contains("rope_type")) inner.get("rope_type", type);
  else if (rope.contains("type")) inner.get("type", type);
  if (type != "default")
    r.bad((key + ".rope_type").c_str(),
          "\"" + text::printable(type) + "\" is not supported (graft reads the default rope)");
}

// rope_theta and the rope type, from either transformers' 4.x or 5.x keys.
double hf_rope_theta(const nlohmann::json& j, const ConfigReader& r) {
  double theta = 10000.0;
  r.get_or_keep("rope_theta", theta);
  if (present(j, "rope_scaling")) check_rope_type(j["rope_scaling"], r, "rope_scaling");
  if (present(j, "rope_parameters")) {
    const nlohmann::json& p = j["rope_parameters"];
    check_rope_type(p, r, "rope_parameters");
    ConfigReader(p, "rope_parameters").get_or_keep("rope_theta", theta);
  }
  if (!(theta > 1)) r.bad("rope_theta", "must be > 1");
  return theta;
}

// head_dim may be stated; graft derives it as hidden_size / num_attention_heads.
void check_head_dim(const nlohmann::json& j, const ConfigReader& r, const LMConfig& c) {
  if (!present(j, "head_dim") || c.heads <= 0) return;
  int64_t dh = 0;
  r.get("head_dim", dh);
  if (dh * c.heads != c.d_model)
    r.bad("head_dim", std::to_string(dh) + " is not hidden_size / num_attention_heads = " +
                          std::to_string(c.d_model) + " / " + std::to_string(c.heads) +
                          " (not supported)");
}

// A sliding window shorter than the positions the model accepts changes the attention.
void check_sliding_window(const nlohmann::json& j, const ConfigReader& r, const std::string& type,
                          int64_t max_positions) {
  if (type == "qwen2") {
    bool use = false;
    r.get_or_keep("use_sliding_window", use);
    if (use) r.bad("use_sliding_window", "is true: sliding-window attention is not supported");
    return;
  }
  if (!present(j, "sliding_window")) return;
  int64_t w = 0;
  r.get("sliding_window", w);
  if (w < max_positions)
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

LMConfig hf_lm_fields(const nlohmann::json& j, const ConfigReader& r) {
  LMConfig c;
  r.get("vocab_size", c.vocab), r.get("hidden_size", c.d_model);
  r.get("intermediate_size", c.d_ff), r.get("num_hidden_layers", c.layers);
  r.get("num_attention_heads", c.heads);
  c.kv_heads = c.heads;
  r.get_or_keep("num_key_value_heads", c.kv_heads);
  c.max_len = 2048;
  r.get_or_keep("max_position_embeddings", c.max_len);
  c.eps = 1e-6;
  r.get_or_keep("rms_norm_eps", c.eps);
  c.tied_output = false;
  r.get_or_keep("tie_word_embeddings", c.tied_output);
  c.positions.kind = nn::Positions::rope;
  c.positions.rope_base = hf_rope_theta(j, r);
  c.rms_norm = true, c.activation = nn::Activation::swiglu, c.norm_first = true;
  c.dropout = 0, c.pad_id = 0, c.mask_pad = false, c.scale_embedding = false;
  return c;
}

}  // namespace

HfLMConfig hf_lm_config(const nlohmann::json& j, const std::string& where) {
  const ConfigReader r(j, where);
  const std::string type = hf_model_type(r);
  HfLMConfig out{hf_lm_fields(j, r), hf_facts(j, r, type)};
  LMConfig& c = out.lm;
  check_head_dim(j, r, c);
  check_sliding_window(j, r, type, c.max_len);
  c.bias = out.hf.attention_bias || out.hf.qkv_bias || out.hf.mlp_bias;
  c.validate(where);
  return out;
}

}  // namespace graft::models
