#include <algorithm>
#include <map>

#include "graft/models/config_json.h"
#include "graft/models/decoding.h"
#include "graft/models/hf.h"
#include "graft/nn/module.h"
#include "graft/ops/precision.h"
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

namespace {

// A directory's config, file headers and parameters, all checked against each other.
struct HfLMFiles {
  HfLMConfig c;
  hf::FileTensors file;
  std::vector<hf::Param> params;
};

HfLMFiles inspect_hf_lm(const std::string& dir) {
  const std::string cfg_path = dir + "/config.json";
  HfLMConfig c = hf_lm_config(train::load_json(cfg_path), cfg_path);
  const bool gpt2 = c.hf.model_type == "gpt2";
  const hf::Reading reading =
      gpt2 ? gpt2_reading(c.lm.tied_output) : llama_reading(c.lm.tied_output);
  hf::FileTensors file = hf::inspect_hf_tensors(dir, reading);
  std::vector<hf::Param> params = gpt2 ? gpt2_params(c.lm) : hf_params(c);
  hf::check_params(file, params, reading, dir);
  c.lm.dtype = hf::common_dtype(file);
  return {std::move(c), std::move(file), std::move(params)};
}

// The model with no memory behind its parameters (adopt_state_dict or an int8 form gives it).
std::unique_ptr<DecoderOnlyLM> unfilled_model(const LMConfig& c, nn::SkipInit::Memory memory) {
  const nn::SkipInit skip(memory);
  return std::make_unique<DecoderOnlyLM>(c);
}

// The parameters largest first: loading peaks at the int8 forms made so far plus the float32
// values of the one being read, so the big float32 tensors (embedding, output projection) come
// while little is held (TinyLlama int8's peak RSS: 1429 MiB with its output projection read
// last, 1279 largest first).
std::vector<hf::Param> largest_first(std::vector<hf::Param> params) {
  const auto elements = [](const hf::Param& p) {
    int64_t n = 0;
    for (const Shape& s : p.shapes) n += shape_numel(s);
    return n;
  };
  std::stable_sort(params.begin(), params.end(), [&](const hf::Param& a, const hf::Param& b) {
    return elements(a) > elements(b);
  });
  return params;
}

// int8: each linear weight and embedding table quantized as it is read (float32 values of one
// parameter at a time, largest first), the rest adopted in float32.
void load_int8(DecoderOnlyLM& model, const HfLMFiles& f) {
  std::map<std::string, Tensor> int8_params;
  for (const auto& [name, w] : int8_linear_weights(model)) int8_params.emplace(name, w);
  for (const auto& [name, w] : embedding_tables(model)) int8_params.emplace(name, w);
  nn::NamedTensors adopted;
  hf::for_each_param(f.file, largest_first(f.params), DType::f32,
                     [&](const std::string& name, Tensor t) {
                       auto it = int8_params.find(name);
                       if (it == int8_params.end()) {
                         adopted.emplace_back(name, std::move(t));
                         return;
                       }
                       quantize_weight_int8_from(it->second, t, name);
                       adopted.emplace_back(name, it->second);
                     });
  model.adopt_state_dict(adopted);
}

}  // namespace

HfCausalLM load_hf_causal_lm(const std::string& dir) {
  HfLMFiles f = inspect_hf_lm(dir);
  check_config_memory(f.c.lm, dir + "/config.json", /*copies=*/2);  // the files' and the model
  nn::NamedTensors weights = hf::load_params(f.file, f.params, f.c.lm.dtype);
  HfCausalLM out;
  out.model = unfilled_model(f.c.lm, nn::SkipInit::Memory::uninitialised);
  out.model->adopt_state_dict(weights);
  out.model->eval();
  out.hf = f.c.hf;
  return out;
}

HfCausalLM load_hf_causal_lm(const std::string& dir, Precision precision) {
  if (precision != Precision::int8) {
    HfCausalLM out = load_hf_causal_lm(dir);
    if (precision == Precision::fp32) out.model->to(DType::f32);
    keep_for_inference(*out.model, precision);
    return out;
  }
  HfLMFiles f = inspect_hf_lm(dir);
  LMConfig int8_sized = f.c.lm;  // 1 byte a weight (one parameter's float32 values at a time)
  int8_sized.dtype = DType::i8;
  check_config_memory(int8_sized, dir + "/config.json", /*copies=*/1);
  f.c.lm.dtype = DType::f32;
  HfCausalLM out;
  out.model = unfilled_model(f.c.lm, nn::SkipInit::Memory::none);
  load_int8(*out.model, f);
  out.model->eval();
  keep_for_inference(*out.model, Precision::int8);  // what the loader left (nothing, as a rule)
  out.hf = f.c.hf;
  return out;
}

}  // namespace graft::models
