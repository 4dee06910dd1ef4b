#include "hf_gpt2.h"

#include <cmath>

#include "graft/autograd/text.h"
#include "graft/models/config_json.h"

namespace graft::models {

namespace {

bool present(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// An optional field under either of its names (GPT2Config's attribute_map: hidden_size is
// n_embd, ...); the GPT-2 name wins when both are there.
template <class T>
void get_either(const nlohmann::json& j, const ConfigReader& r, const char* name, const char* alias,
                T& v) {
  if (present(j, name)) r.get(name, v);
  else if (present(j, alias)) r.get(alias, v);
}

nn::Activation gpt2_activation(const ConfigReader& r) {
  std::string act = "gelu_new";
  r.get_or_keep("activation_function", act);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return nn::Activation::gelu_tanh;
  if (act == "gelu") return nn::Activation::gelu;
  if (act == "relu") return nn::Activation::relu;
  r.bad("activation_function", std::string("\"").append(text::printable(act)) +
                                   "\" is not supported (gelu_new, gelu_pytorch_tanh, gelu, relu)");
}

// Settings that change GPT-2's attention in ways graft's layers do not express.
void check_gpt2_attention(const ConfigReader& r) {
  bool scale = true, by_layer = false, cross = false;
  r.get_or_keep("scale_attn_weights", scale);
  r.get_or_keep("scale_attn_by_inverse_layer_idx", by_layer);
  r.get_or_keep("add_cross_attention", cross);
  if (!scale) r.bad("scale_attn_weights", "is false: unscaled attention is not supported");
  if (by_layer)
    r.bad("scale_attn_by_inverse_layer_idx",
          "is true: per-layer attention scaling is not supported");
  if (cross) r.bad("add_cross_attention", "is true: a GPT-2 with cross-attention is not supported");
}

LMConfig gpt2_fields(const nlohmann::json& j, const ConfigReader& r) {
  LMConfig c;
  c.vocab = 50257, c.d_model = 768, c.layers = 12, c.heads = 12, c.max_len = 1024;
  r.get_or_keep("vocab_size", c.vocab);
  get_either(j, r, "n_embd", "hidden_size", c.d_model);
  get_either(j, r, "n_layer", "num_hidden_layers", c.layers);
  get_either(j, r, "n_head", "num_attention_heads", c.heads);
  get_either(j, r, "n_positions", "max_position_embeddings", c.max_len);
  c.d_ff = 0;  // n_inner null or absent: 4 * n_embd
  if (present(j, "n_inner")) {
    r.get("n_inner", c.d_ff);
    if (c.d_ff == 0) r.bad("n_inner", "must be >= 1");
  }
  c.eps = 1e-5;
  r.get_or_keep("layer_norm_epsilon", c.eps);
  c.tied_output = true;
  r.get_or_keep("tie_word_embeddings", c.tied_output);
  c.activation = gpt2_activation(r);
  c.positions.kind = nn::Positions::learned;
  c.kv_heads = c.heads, c.rms_norm = false, c.norm_first = true, c.bias = true;
  c.dropout = 0, c.pad_id = 0, c.mask_pad = false, c.scale_embedding = false;
  return c;
}

void check_gpt2_sizes(const LMConfig& c, const std::string& where) {
  const ConfigCheck k(where);
  k.size("vocab_size", c.vocab), k.size("n_embd", c.d_model);
  k.size("n_layer", c.layers, kMaxLayers), k.size("n_head", c.heads);
  k.size("n_positions", c.max_len, kMaxLen);
  if (c.d_model % c.heads != 0)
    k.bad("n_head",
          std::to_string(c.heads) + " does not divide n_embd " + std::to_string(c.d_model));
  if (!(c.eps > 0) || !std::isfinite(c.eps)) k.bad("layer_norm_epsilon", "must be finite and > 0");
}

std::vector<int64_t> token_ids(const nlohmann::json& j, const ConfigReader& r, const char* key,
                               int64_t vocab, const std::string& where) {
  std::vector<int64_t> ids;
  if (!present(j, key)) return ids;
  if (j[key].is_array()) r.get(key, ids);
  else ids.push_back(0), r.get(key, ids[0]);
  for (int64_t id : ids) ConfigCheck(where).token_id(key, id, vocab);
  return ids;
}

}  // namespace

HfLMConfig hf_gpt2_config(const nlohmann::json& j, const std::string& where) {
  const ConfigReader r(j, where);
  HfLMConfig out{gpt2_fields(j, r), {}};
  LMConfig& c = out.lm;
  check_gpt2_sizes(c, where);
  if (c.d_ff == 0) c.d_ff = 4 * c.d_model;  // n_inner null: 4 * n_embd (at most 2^26)
  else ConfigCheck(where).size("n_inner", c.d_ff);
  check_gpt2_attention(r);
  out.hf.model_type = "gpt2";
  out.hf.eos_ids = token_ids(j, r, "eos_token_id", c.vocab, where);
  const std::vector<int64_t> bos = token_ids(j, r, "bos_token_id", c.vocab, where);
  if (bos.size() > 1) r.bad("bos_token_id", "must be one id");
  if (!bos.empty()) out.hf.bos_id = bos[0];
  out.hf.max_positions = c.max_len;
  c.validate(where);
  return out;
}

hf::Reading gpt2_reading(bool tied) {
  return {"load_hf_causal_lm", {"transformer."}, [tied](const std::string& n) {
            return n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias") ||
                   (tied && n == "lm_head.weight");
          }};
}

std::vector<hf::Param> gpt2_params(const LMConfig& c) {
  const int64_t v = c.vocab, d = c.d_model, f = c.d_ff;
  std::vector<hf::Param> m = {{{"wte.weight"}, {{v, d}}, "embedding.weight"},
                              {{"wpe.weight"}, {{c.max_len, d}}, "pos.weight"},
                              {{"ln_f.weight"}, {{d}}, "blocks.norm.weight"},
                              {{"ln_f.bias"}, {{d}}, "blocks.norm.bias"}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".",
                      g = "blocks.layers." + std::to_string(i) + ".";
    for (const char* n : {"weight", "bias"}) {
      m.push_back({{h + "ln_1." + n}, {{d}}, g + "norm1." + n});
      m.push_back({{h + "ln_2." + n}, {{d}}, g + "norm2." + n});
    }
    m.push_back({{h + "attn.c_attn.weight"}, {{d, 3 * d}}, g + "self_attn.in_proj_weight", true});
    m.push_back({{h + "attn.c_attn.bias"}, {{3 * d}}, g + "self_attn.in_proj_bias"});
    m.push_back({{h + "attn.c_proj.weight"}, {{d, d}}, g + "self_attn.out_proj.weight", true});
    m.push_back({{h + "attn.c_proj.bias"}, {{d}}, g + "self_attn.out_proj.bias"});
    m.push_back({{h + "mlp.c_fc.weight"}, {{d, f}}, g + "linear1.weight", true});
    m.push_back({{h + "mlp.c_fc.bias"}, {{f}}, g + "linear1.bias"});
    m.push_back({{h + "mlp.c_proj.weight"}, {{f, d}}, g + "linear2.weight", true});
    m.push_back({{h + "mlp.c_proj.bias"}, {{d}}, g + "linear2.bias"});
  }
  if (!c.tied_output) m.push_back({{"lm_head.weight"}, {{v, d}}, "output.weight"});
  return m;
}

}  // namespace graft::models
