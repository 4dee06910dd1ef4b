// Hugging Face Marian checkpoints (models/hf_marian.h): config.json, generation_config.json and
// the tensors, mapped onto the Transformer.
#include "graft/models/hf_marian.h"

#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/nn/module.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

bool present(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

void check_model_type(const ConfigReader& r) {
  std::string type;
  r.get("model_type", type);
  if (type != "marian") r.bad("model_type", "\"" + text::printable(type) + "\" is not marian");
}

// activation_function through transformers' ACT2FN names; the others are refused.
nn::Activation marian_activation(const ConfigReader& r) {
  std::string name = "gelu";
  r.get_or_keep("activation_function", name);
  if (name == "swish" || name == "silu") return nn::Activation::silu;
  if (name == "gelu") return nn::Activation::gelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return nn::Activation::gelu_tanh;
  if (name == "relu") return nn::Activation::relu;
  r.bad("activation_function", "\"" + text::printable(name) +
                                   "\" is not supported (graft reads swish, silu, gelu, gelu_new, "
                                   "gelu_pytorch_tanh and relu)");
}

// A decoder size must equal the encoder's: graft's Transformer has one of each.
void same_size(const ConfigReader& r, const char* dec_key, int64_t enc, const char* enc_key) {
  int64_t dec = enc;
  r.get_or_keep(dec_key, dec);
  if (dec != enc)
    r.bad(dec_key, std::to_string(dec) + " differs from " + enc_key + " " + std::to_string(enc) +
                       " (graft's Transformer has one size for both stacks)");
}

// The shared vocabulary and the tied output projection are the only layout graft has.
void check_sharing(const nlohmann::json& j, const ConfigReader& r, int64_t vocab) {
  for (const char* key : {"share_encoder_decoder_embeddings", "tie_word_embeddings"}) {
    bool on = true;
    r.get_or_keep(key, on);
    if (!on)
      r.bad(key,
            "is false: graft reads one embedding shared by the encoder, the decoder and "
            "the output projection");
  }
  if (!present(j, "decoder_vocab_size")) return;
  int64_t dv = 0;
  r.get("decoder_vocab_size", dv);
  if (dv != vocab)
    r.bad("decoder_vocab_size", std::to_string(dv) + " differs from vocab_size " +
                                    std::to_string(vocab) +
                                    " (a separate decoder vocabulary is not supported)");
}

// The sizes, with MarianConfig's defaults for absent fields.
void read_sizes(const ConfigReader& r, TransformerConfig& c) {
  c.vocab = 58101, c.d_model = 1024, c.enc_layers = c.dec_layers = 12;
  c.d_ff = 4096, c.heads = 16, c.max_len = 1024;
  r.get_or_keep("vocab_size", c.vocab), r.get_or_keep("d_model", c.d_model);
  r.get_or_keep("encoder_layers", c.enc_layers), r.get_or_keep("decoder_layers", c.dec_layers);
  r.get_or_keep("encoder_ffn_dim", c.d_ff);
  same_size(r, "decoder_ffn_dim", c.d_ff, "encoder_ffn_dim");
  r.get_or_keep("encoder_attention_heads", c.heads);
  same_size(r, "decoder_attention_heads", c.heads, "encoder_attention_heads");
  r.get_or_keep("max_position_embeddings", c.max_len);
}

// A token id field: one id or a list of one (transformers allows lists for eos); absent or null
// keeps `id`.
void read_id(const nlohmann::json& j, const ConfigReader& r, const char* key, int64_t& id) {
  if (!present(j, key)) return;
  if (!j[key].is_array()) return r.get(key, id);
  std::vector<int64_t> ids;
  r.get(key, ids);
  if (ids.size() != 1) r.bad(key, "holds " + std::to_string(ids.size()) + " ids: graft reads one");
  id = ids[0];
}

// pad, decoder start (graft's bos) and eos; null ids keep MarianConfig's defaults.
void read_tokens(const nlohmann::json& j, const ConfigReader& r, TransformerConfig& c) {
  c.pad_id = 58100, c.bos_id = 58100, c.eos_id = 0;
  read_id(j, r, "pad_token_id", c.pad_id);
  read_id(j, r, "decoder_start_token_id", c.bos_id);
  read_id(j, r, "eos_token_id", c.eos_id);
}

// HF Marian: post-LN, no embedding or final LayerNorm, sinusoids in halves, no dropout at
// inference, the decoder start (pad) attended to.
TransformerConfig marian_transformer(const nlohmann::json& j, const ConfigReader& r) {
  TransformerConfig c;
  read_sizes(r, c);
  read_tokens(j, r, c);
  c.activation = marian_activation(r);
  c.scale_embedding = false;
  r.get_or_keep("scale_embedding", c.scale_embedding);
  c.positions.kind = nn::Positions::sinusoidal;
  c.sinusoid_layout = SinusoidLayout::halves;
  c.norm_first = false, c.final_norm = false, c.dropout = 0, c.attention_dropout = 0;
  c.logits_bias = true, c.mask_target_pad = false;
  return c;
}

// bad_words_ids: a list of token sequences; graft bans single tokens only.
std::vector<int64_t> bad_words(const ConfigReader& r) {
  std::vector<std::vector<int64_t>> seqs;
  r.get("bad_words_ids", seqs);
  std::vector<int64_t> out;
  for (const std::vector<int64_t>& s : seqs) {
    if (s.size() != 1)
      r.bad("bad_words_ids", "holds a sequence of " + std::to_string(s.size()) +
                                 " tokens: only single banned tokens are supported");
    out.push_back(s[0]);
  }
  return out;
}

// The sizes and ids in range, named by their config.json fields (before validate(), whose
// errors would name graft's fields).
void check_ranges(const ConfigReader& r, const TransformerConfig& c) {
  const struct {
    const char* key;
    int64_t v, lo, hi;
  } ranges[] = {{"vocab_size", c.vocab, 1, kMaxSize},
                {"d_model", c.d_model, 1, kMaxSize},
                {"encoder_layers", c.enc_layers, 1, kMaxLayers},
                {"decoder_layers", c.dec_layers, 1, kMaxLayers},
                {"encoder_ffn_dim", c.d_ff, 1, kMaxSize},
                {"encoder_attention_heads", c.heads, 1, c.d_model},
                {"max_position_embeddings", c.max_len, 1, kMaxLen},
                {"pad_token_id", c.pad_id, 0, c.vocab - 1},
                {"decoder_start_token_id", c.bos_id, 0, c.vocab - 1},
                {"eos_token_id", c.eos_id, 0, c.vocab - 1}};
  for (const auto& x : ranges)
    if (x.v < x.lo || x.v > x.hi)
      r.bad(x.key, "must be in [" + std::to_string(x.lo) + ", " + std::to_string(x.hi) + "], got " +
                       std::to_string(x.v));
  if (c.d_model % c.heads != 0)
    r.bad("encoder_attention_heads",
          std::to_string(c.heads) + " does not divide d_model " + std::to_string(c.d_model));
}

// The generation ids are tokens of the vocabulary; beams and lengths are positive.
void check_generation(const ConfigReader& r, const HfMarianFacts& f, int64_t vocab) {
  const std::string range = " is outside [0, vocab_size " + std::to_string(vocab) + ")";
  if (f.forced_eos_id < -1 || f.forced_eos_id >= vocab)
    r.bad("forced_eos_token_id", std::to_string(f.forced_eos_id) + range);
  for (int64_t id : f.bad_words)
    if (id < 0 || id >= vocab) r.bad("bad_words_ids", "token " + std::to_string(id) + range);
  if (f.num_beams < 1) r.bad("num_beams", "must be >= 1, got " + std::to_string(f.num_beams));
  if (f.max_length < 2) r.bad("max_length", "must be >= 2, got " + std::to_string(f.max_length));
}

}  // namespace

void read_marian_generation(const nlohmann::json& j, HfMarianFacts& f, int64_t vocab,
                            const std::string& where) {
  const ConfigReader r(j, where);
  if (!j.is_object()) fail(where + ": not a JSON object");
  if (j.contains("forced_eos_token_id") && j["forced_eos_token_id"].is_null()) f.forced_eos_id = -1;
  read_id(j, r, "forced_eos_token_id", f.forced_eos_id);
  if (present(j, "bad_words_ids")) f.bad_words = bad_words(r);
  r.get_or_keep("num_beams", f.num_beams);
  r.get_or_keep("max_length", f.max_length);
  r.get_or_keep("length_penalty", f.length_penalty);
  check_generation(r, f, vocab);
}

HfMarianConfig hf_marian_config(const nlohmann::json& j, const std::string& where) {
  const ConfigReader r(j, where);
  check_model_type(r);
  HfMarianConfig out;
  out.t = marian_transformer(j, r);
  check_sharing(j, r, out.t.vocab);
  out.hf.forced_eos_id = 0;  // MarianConfig's forced_eos_token_id
  check_ranges(r, out.t);
  read_marian_generation(j, out.hf, out.t.vocab, where);
  out.t.validate(where);
  return out;
}

}  // namespace graft::models

// ---------------------------------------------------------------------------------------------
// The tensors: Hugging Face names (without the `model.` prefix) -> the Transformer's.

namespace graft::models {

namespace {

// TODO-MERGE: from models/hf_files.h
struct HfParam {
  std::vector<std::string> hf;
  Shape part;
  std::string graft;
};
struct HfTensor {
  Tensor t;
  std::string file;
};
using HfTensors = std::map<std::string, HfTensor>;
void check_hf_shape(const HfTensor& t, const std::string& name, const Shape& want) {
  if (t.t.shape() != want)
    fail("load_hf_marian: '" + t.file + "': tensor '" + name + "' has shape " +
         shape_str(t.t.shape()) + ", the config needs " + shape_str(want));
}
DType common_dtype(const HfTensors& file) {
  std::set<DType> seen;
  for (const auto& [n, t] : file) seen.insert(t.t.dtype());
  return seen.size() == 1 ? *seen.begin() : DType::f32;
}
HfTensors read_marian_tensors(const std::string& dir) {
  const std::string path = dir + "/model.safetensors";
  HfTensors out;
  for (const auto& [name, t] : train::load_safetensors(path).tensors) {
    const std::string n = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
    if (n == "encoder.embed_positions.weight" || n == "decoder.embed_positions.weight" ||
        n == "encoder.version" || n == "decoder.version")
      continue;
    out.emplace(n, HfTensor{t, path});
  }
  return out;
}
// END TODO-MERGE

// Whether a and b hold the same values (compared in float32, exact for every float dtype here).
bool equal_values(const Tensor& a, const Tensor& b) {
  return to_dtype(a, DType::f32).to_vector<float>() == to_dtype(b, DType::f32).to_vector<float>();
}

// One attention block: q/k/v concatenated into in_proj, out_proj as it is.
void add_attention(std::vector<HfParam>& m, const std::string& hf, const std::string& g,
                   int64_t d) {
  m.push_back({{hf + "q_proj.weight", hf + "k_proj.weight", hf + "v_proj.weight"},
               {d, d},
               g + "in_proj_weight"});
  m.push_back(
      {{hf + "q_proj.bias", hf + "k_proj.bias", hf + "v_proj.bias"}, {d}, g + "in_proj_bias"});
  m.push_back({{hf + "out_proj.weight"}, {d, d}, g + "out_proj.weight"});
  m.push_back({{hf + "out_proj.bias"}, {d}, g + "out_proj.bias"});
}

void add_linear(std::vector<HfParam>& m, const std::string& hf, const std::string& g, int64_t out,
                int64_t in) {
  m.push_back({{hf + ".weight"}, {out, in}, g + ".weight"});
  m.push_back({{hf + ".bias"}, {out}, g + ".bias"});
}

void add_norm(std::vector<HfParam>& m, const std::string& hf, const std::string& g, int64_t d) {
  m.push_back({{hf + ".weight"}, {d}, g + ".weight"});
  m.push_back({{hf + ".bias"}, {d}, g + ".bias"});
}

// Layer i of the encoder (decoder false) or the decoder: HF's names onto nn.Transformer's.
void add_layer(std::vector<HfParam>& m, const TransformerConfig& c, bool decoder, int64_t i) {
  const std::string stack = decoder ? "decoder" : "encoder";
  const std::string h = stack + ".layers." + std::to_string(i) + ".", g = h;
  const int64_t d = c.d_model;
  add_attention(m, h + "self_attn.", g + "self_attn.", d);
  add_norm(m, h + "self_attn_layer_norm", g + "norm1", d);
  if (decoder) {
    add_attention(m, h + "encoder_attn.", g + "multihead_attn.", d);
    add_norm(m, h + "encoder_attn_layer_norm", g + "norm2", d);
  }
  add_linear(m, h + "fc1", g + "linear1", c.d_ff, d);
  add_linear(m, h + "fc2", g + "linear2", d, c.d_ff);
  add_norm(m, h + "final_layer_norm", g + (decoder ? "norm3" : "norm2"), d);
}

// Every parameter of the stacks (the embedding and the logits bias are handled apart).
std::vector<HfParam> marian_layer_params(const TransformerConfig& c) {
  std::vector<HfParam> m;
  for (int64_t i = 0; i < c.enc_layers; ++i) add_layer(m, c, false, i);
  for (int64_t i = 0; i < c.dec_layers; ++i) add_layer(m, c, true, i);
  return m;
}

// The sinusoid tables (recomputed) and fairseq's version buffers carry no weights.
bool ignorable(const std::string& name) {
  return name == "encoder.embed_positions.weight" || name == "decoder.embed_positions.weight" ||
         name == "encoder.version" || name == "decoder.version";
}

const char* const kEmbeddingCopies[] = {"shared.weight", "encoder.embed_tokens.weight",
                                        "decoder.embed_tokens.weight", "lm_head.weight"};

// The shared embedding from whichever copies the file holds: at least one, each (V, d), all
// equal. Each copy found is erased from `unused`.
Tensor shared_embedding(const HfTensors& file, const TransformerConfig& c, const std::string& dir,
                        std::set<std::string>& unused) {
  const HfTensor* first = nullptr;
  std::string first_name;
  for (const char* name : kEmbeddingCopies) {
    auto it = file.find(name);
    if (it == file.end()) continue;
    check_hf_shape(it->second, name, {c.vocab, c.d_model});
    unused.erase(name);
    if (!first) {
      first = &it->second, first_name = name;
      continue;
    }
    if (!equal_values(first->t, it->second.t))
      fail("load_hf_marian: '" + it->second.file + "': tensor '" + name + "' differs from '" +
           first_name + "': graft ties the encoder, decoder and output embeddings");
  }
  if (!first)
    fail("load_hf_marian: '" + dir + "': tensor 'shared.weight' is missing (nor is any copy: " +
         "encoder.embed_tokens.weight, decoder.embed_tokens.weight, lm_head.weight)");
  return first->t;
}

// final_logits_bias (1, V) as (V); zeros when the file has none (as transformers).
Tensor logits_bias(const HfTensors& file, const TransformerConfig& c, std::set<std::string>& unused,
                   DType dt) {
  auto it = file.find("final_logits_bias");
  if (it == file.end()) return zeros({c.vocab}, dt);
  check_hf_shape(it->second, "final_logits_bias", {1, c.vocab});
  unused.erase("final_logits_bias");
  return reshape(to_dtype(it->second.t, dt), {c.vocab});
}

// Every layer tensor there with its shape (q/k/v parts each (d, d) or (d)).
void check_layer_tensors(const HfTensors& file, const std::vector<HfParam>& params,
                         const std::string& dir, std::set<std::string>& unused) {
  for (const HfParam& p : params)
    for (const std::string& n : p.hf) {
      auto it = file.find(n);
      if (it == file.end()) fail("load_hf_marian: '" + dir + "': tensor '" + n + "' is missing");
      check_hf_shape(it->second, n, p.part);
      unused.erase(n);
    }
}

nn::NamedTensors marian_state(const HfTensors& file, const HfMarianConfig& c,
                              const std::string& dir) {
  std::set<std::string> unused;
  for (const auto& [n, t] : file) unused.insert(n);
  const std::vector<HfParam> params = marian_layer_params(c.t);
  const Tensor emb = shared_embedding(file, c.t, dir, unused);
  check_layer_tensors(file, params, dir, unused);
  nn::NamedTensors out = {{"embedding.weight", to_dtype(emb, c.t.dtype)},
                          {"final_logits_bias", logits_bias(file, c.t, unused, c.t.dtype)}};
  if (!unused.empty())
    fail("load_hf_marian: '" + file.at(*unused.begin()).file + "': unexpected tensor '" +
         *unused.begin() + "'");
  for (const HfParam& p : params) {
    Tensors parts;
    for (const std::string& h : p.hf) parts.push_back(to_dtype(file.at(h).t, c.t.dtype));
    out.emplace_back(p.graft, parts.size() == 1 ? parts[0] : concat(parts, 0));
  }
  return out;
}

}  // namespace

HfMarian load_hf_marian(const std::string& dir, std::optional<DType> dtype) {
  const std::string cfg_path = dir + "/config.json", gen_path = dir + "/generation_config.json";
  HfMarianConfig c = hf_marian_config(train::load_json(cfg_path), cfg_path);
  std::error_code ec;
  if (std::filesystem::exists(gen_path, ec))
    read_marian_generation(train::load_json(gen_path), c.hf, c.t.vocab, gen_path);
  check_config_memory(c.t, cfg_path, /*copies=*/2);  // float32: the files' tensors and the model
  const HfTensors file = read_marian_tensors(dir);
  c.t.dtype = dtype ? *dtype : common_dtype(file);
  if (!is_floating(c.t.dtype))
    fail("load_hf_marian: the model's dtype must be a float dtype, got " +
         std::string(dtype_name(c.t.dtype)));
  const nn::NamedTensors state = marian_state(file, c, dir);
  HfMarian out;
  {
    const nn::SkipInit skip;
    out.model = std::make_unique<Transformer>(c.t);
  }
  out.model->adopt_state_dict(state);
  out.model->eval();
  out.hf = c.hf;
  return out;
}

}  // namespace graft::models
