#include "graft/models/config_json.h"
#include "graft/models/hf.h"
#include "graft/nn/module.h"
#include "hf_gpt2.h"

namespace graft::models {

namespace {

hf::Reading llama_reading(bool tied) {
  return {"load_hf_causal_lm", {"model."}, [tied](const std::string& n) {
            return n.ends_with(".rotary_emb.inv_freq") || (tied && n == "lm_head.weight");
          }};
}

void add_bias_params(std::vector<hf::Param>& m, const HfLMConfig& c, const std::string& h,
                     const std::string& g) {
  const LMConfig& l = c.lm;
  const int64_t d = l.d_model, f = l.d_ff, kv = l.kv_heads * (l.d_model / l.heads);
  const std::string a = h + "self_attn.", p = h + "mlp.";
  const bool qkv = c.hf.attention_bias || c.hf.qkv_bias, mlp = c.hf.mlp_bias;
  // A bias the file has no place for (Qwen2's o_proj, the MLP's) is zero-filled.
  const auto one = [](bool has, const std::string& n, int64_t size, const std::string& to) {
    return has ? hf::Param{{n}, {{size}}, to} : hf::Param{{}, {{size}}, to};
  };
  m.push_back(qkv ? hf::Param{{a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"},
                              {{d}, {kv}, {kv}},
                              g + "self_attn.in_proj_bias"}
                  : hf::Param{{}, {{d + 2 * kv}}, g + "self_attn.in_proj_bias"});
  m.push_back(one(c.hf.attention_bias, a + "o_proj.bias", d, g + "self_attn.out_proj.bias"));
  m.push_back(one(mlp, p + "gate_proj.bias", f, g + "linear1.bias"));
  m.push_back(one(mlp, p + "up_proj.bias", f, g + "linear3.bias"));
  m.push_back(one(mlp, p + "down_proj.bias", d, g + "linear2.bias"));
}

void add_layer_params(std::vector<hf::Param>& m, const HfLMConfig& c, int64_t i) {
  const LMConfig& l = c.lm;
  const int64_t d = l.d_model, f = l.d_ff, kv = l.kv_heads * (l.d_model / l.heads);
  const std::string h = "layers." + std::to_string(i) + ".",
                    g = "blocks.layers." + std::to_string(i) + ".";
  const std::string a = h + "self_attn.", p = h + "mlp.";
  m.push_back({{h + "input_layernorm.weight"}, {{d}}, g + "norm1.weight"});
  m.push_back({{h + "post_attention_layernorm.weight"}, {{d}}, g + "norm2.weight"});
  m.push_back({{a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
               {{d, d}, {kv, d}, {kv, d}},
               g + "self_attn.in_proj_weight"});
  m.push_back({{a + "o_proj.weight"}, {{d, d}}, g + "self_attn.out_proj.weight"});
  m.push_back({{p + "gate_proj.weight"}, {{f, d}}, g + "linear1.weight"});
  m.push_back({{p + "up_proj.weight"}, {{f, d}}, g + "linear3.weight"});
  m.push_back({{p + "down_proj.weight"}, {{d, f}}, g + "linear2.weight"});
  if (l.bias) add_bias_params(m, c, h, g);
}

// Every parameter of the LM with its sources.
std::vector<hf::Param> hf_params(const HfLMConfig& c) {
  const int64_t v = c.lm.vocab, d = c.lm.d_model;
  std::vector<hf::Param> m = {{{"embed_tokens.weight"}, {{v, d}}, "embedding.weight"},
                              {{"norm.weight"}, {{d}}, "blocks.norm.weight"}};
  for (int64_t i = 0; i < c.lm.layers; ++i) add_layer_params(m, c, i);
  if (!c.lm.tied_output) m.push_back({{"lm_head.weight"}, {{v, d}}, "output.weight"});
  return m;
}

}  // namespace

HfCausalLM load_hf_causal_lm(const std::string& dir) {
  const std::string cfg_path = dir + "/config.json";
  HfLMConfig c = hf_lm_config(train::load_json(cfg_path), cfg_path);
  const bool gpt2 = c.hf.model_type == "gpt2";
  const hf::Reading reading =
      gpt2 ? gpt2_reading(c.lm.tied_output) : llama_reading(c.lm.tied_output);
  const hf::FileTensors file = hf::inspect_hf_tensors(dir, reading);
  const std::vector<hf::Param> params = gpt2 ? gpt2_params(c.lm) : hf_params(c);
  hf::check_params(file, params, reading, dir);
  c.lm.dtype = hf::common_dtype(file);
  check_config_memory(c.lm, cfg_path, /*copies=*/2);  // the files' tensors and the model
  nn::NamedTensors weights = hf::load_params(file, params, c.lm.dtype);
  HfCausalLM out;
  {
    const nn::SkipInit skip;
    out.model = std::make_unique<DecoderOnlyLM>(c.lm);
  }
  out.model->adopt_state_dict(weights);
  out.model->eval();
  out.hf = c.hf;
  return out;
}

}  // namespace graft::models
