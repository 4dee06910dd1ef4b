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

// A file's tensor under its name without the `model.` prefix, and the file it came from.
struct HfTensor {
  Tensor t;
  std::string file;
};
using HfTensors = std::map<std::string, HfTensor>;

// One graft parameter: its Hugging Face source names (q, k, v: concatenated rows), each
// part's shape, or no names for a bias the file has no place for (zero-filled: Qwen2's o_proj).
struct HfParam {
  std::vector<std::string> hf;
  Shape part;
  std::string graft;
};

bool ignorable(const std::string& name, bool tied) {
  return name.ends_with(".rotary_emb.inv_freq") || (tied && name == "lm_head.weight");
}

void add_file(HfTensors& out, const std::string& path, bool tied) {
  const train::SafetensorsFile f = train::load_safetensors(path);
  for (const auto& [name, t] : f.tensors) {
    const std::string n = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
    if (ignorable(n, tied)) continue;
    if (!is_floating(t.dtype()))
      fail("load_hf_causal_lm: '" + path + "': tensor '" + name + "' is " + dtype_name(t.dtype()) +
           ", not a float weight");
    auto [it, fresh] = out.emplace(n, HfTensor{t, path});
    if (!fresh)
      fail("load_hf_causal_lm: '" + path + "': tensor '" + name + "' is also in '" +
           it->second.file + "' (with or without the 'model.' prefix); keep one of them");
  }
}

// The shard files model.safetensors.index.json names, each checked to exist.
std::vector<std::string> shard_files(const std::string& dir, const std::string& index) {
  const nlohmann::json j = train::load_json(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    fail("load_hf_causal_lm: '" + index + "': field \"weight_map\" is missing or not an object");
  std::set<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      fail("load_hf_causal_lm: '" + index + "': weight_map[\"" + text::printable(name) +
           "\"] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.find("..") != std::string::npos)
      fail("load_hf_causal_lm: '" + index + "': shard '" + text::printable(f) +
           "' is not a file name in the directory");
    files.insert(f);
  }
  std::vector<std::string> paths;
  std::error_code ec;
  for (const std::string& f : files) {
    const std::string p = dir + "/" + f;
    if (!std::filesystem::exists(p, ec))
      fail("load_hf_causal_lm: '" + index + "' names shard '" + p + "', which is missing");
    paths.push_back(p);
  }
  return paths;
}

HfTensors read_hf_tensors(const std::string& dir, bool tied) {
  const std::string single = dir + "/model.safetensors",
                    index = dir + "/model.safetensors.index.json";
  std::error_code ec;
  HfTensors out;
  if (std::filesystem::exists(index, ec)) {
    for (const std::string& p : shard_files(dir, index)) add_file(out, p, tied);
  } else if (std::filesystem::exists(single, ec)) {
    add_file(out, single, tied);
  } else {
    fail("load_hf_causal_lm: '" + dir + "' holds neither model.safetensors nor " +
         "model.safetensors.index.json");
  }
  return out;
}

void add_layer_params(std::vector<HfParam>& m, const HfLMConfig& c, int64_t i) {
  const LMConfig& l = c.lm;
  const int64_t d = l.d_model, f = l.d_ff;
  const std::string h = "layers." + std::to_string(i) + ".",
                    g = "blocks.layers." + std::to_string(i) + ".";
  const std::string a = h + "self_attn.", p = h + "mlp.";
  m.push_back({{h + "input_layernorm.weight"}, {d}, g + "norm1.weight"});
  m.push_back({{h + "post_attention_layernorm.weight"}, {d}, g + "norm2.weight"});
  m.push_back({{a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
               {0, d},
               g + "self_attn.in_proj_weight"});
  m.push_back({{a + "o_proj.weight"}, {d, d}, g + "self_attn.out_proj.weight"});
  m.push_back({{p + "gate_proj.weight"}, {f, d}, g + "linear1.weight"});
  m.push_back({{p + "up_proj.weight"}, {f, d}, g + "linear3.weight"});
  m.push_back({{p + "down_proj.weight"}, {d, f}, g + "linear2.weight"});
  if (!l.bias) return;
  const bool qkv = c.hf.attention_bias || c.hf.qkv_bias, mlp = c.hf.mlp_bias;
  const auto src = [](bool has, const std::string& n) {
    return has ? std::vector<std::string>{n} : std::vector<std::string>{};
  };
  m.push_back(
      {qkv ? std::vector<std::string>{a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}
           : std::vector<std::string>{},
       {0},
       g + "self_attn.in_proj_bias"});
  m.push_back({src(c.hf.attention_bias, a + "o_proj.bias"), {d}, g + "self_attn.out_proj.bias"});
  m.push_back({src(mlp, p + "gate_proj.bias"), {f}, g + "linear1.bias"});
  m.push_back({src(mlp, p + "up_proj.bias"), {f}, g + "linear3.bias"});
  m.push_back({src(mlp, p + "down_proj.bias"), {d}, g + "linear2.bias"});
}

// Every parameter of the LM with its sources; q/k/v parts get their rows by part_shape().
std::vector<HfParam> hf_params(const HfLMConfig& c) {
  std::vector<HfParam> m = {
      {{"embed_tokens.weight"}, {c.lm.vocab, c.lm.d_model}, "embedding.weight"},
      {{"norm.weight"}, {c.lm.d_model}, "blocks.norm.weight"}};
  for (int64_t i = 0; i < c.lm.layers; ++i) add_layer_params(m, c, i);
  if (!c.lm.tied_output)
    m.push_back({{"lm_head.weight"}, {c.lm.vocab, c.lm.d_model}, "output.weight"});
  return m;
}

// The shape of part k of p: q rows d, k and v rows kv_heads * head_dim.
Shape part_shape(const HfParam& p, size_t k, const LMConfig& c) {
  if (p.hf.size() != 3) return p.part;
  Shape s = p.part;
  s[0] = k == 0 ? c.d_model : c.kv_heads * (c.d_model / c.heads);
  return s;
}

// Every needed tensor is there with its shape and nothing else is: before any allocation.
void check_hf_tensors(const HfTensors& file, const std::vector<HfParam>& params, const LMConfig& c,
                      const std::string& dir) {
  std::set<std::string> unused;
  for (const auto& [n, t] : file) unused.insert(n);
  for (const HfParam& p : params)
    for (size_t k = 0; k < p.hf.size(); ++k) {
      auto it = file.find(p.hf[k]);
      if (it == file.end())
        fail("load_hf_causal_lm: '" + dir + "': tensor '" + p.hf[k] + "' is missing");
      const Shape want = part_shape(p, k, c);
      if (it->second.t.shape() != want)
        fail("load_hf_causal_lm: '" + it->second.file + "': tensor '" + p.hf[k] + "' has shape " +
             shape_str(it->second.t.shape()) + ", the config needs " + shape_str(want));
      unused.erase(p.hf[k]);
    }
  if (!unused.empty())
    fail("load_hf_causal_lm: '" + file.at(*unused.begin()).file + "': unexpected tensor '" +
         *unused.begin() + "'");
}

// One dtype when every tensor has it, else float32 (each converted exactly or rounded once).
DType common_dtype(const HfTensors& file) {
  std::set<DType> seen;
  for (const auto& [n, t] : file) seen.insert(t.t.dtype());
  return seen.size() == 1 ? *seen.begin() : DType::f32;
}

nn::NamedTensors map_hf_params(const HfTensors& file, const std::vector<HfParam>& params,
                               const LMConfig& c) {
  nn::NamedTensors out;
  for (const HfParam& p : params) {
    if (p.hf.empty()) {
      const int64_t n = p.graft.ends_with("in_proj_bias")
                            ? c.d_model + 2 * c.kv_heads * (c.d_model / c.heads)
                            : p.part[0];
      out.emplace_back(p.graft, zeros({n}, c.dtype));
      continue;
    }
    Tensors parts;
    for (const std::string& h : p.hf) parts.push_back(to_dtype(file.at(h).t, c.dtype));
    out.emplace_back(p.graft, parts.size() == 1 ? parts[0] : concat(parts, 0));
  }
  return out;
}

}  // namespace

HfCausalLM load_hf_causal_lm(const std::string& dir) {
  const std::string cfg_path = dir + "/config.json";
  HfLMConfig c = hf_lm_config(train::load_json(cfg_path), cfg_path);
  check_config_memory(c.lm, cfg_path, /*copies=*/2);  // float32: the files' tensors and the model
  const HfTensors file = read_hf_tensors(dir, c.lm.tied_output);
  const std::vector<HfParam> params = hf_params(c);
  check_hf_tensors(file, params, c.lm, dir);
  c.lm.dtype = common_dtype(file);
  HfCausalLM out;
  {
    const nn::SkipInit skip;
    out.model = std::make_unique<DecoderOnlyLM>(c.lm);
  }
  out.model->adopt_state_dict(map_hf_params(file, params, c.lm));
  out.model->eval();
  out.hf = c.hf;
  return out;
}

}  // namespace graft::models
