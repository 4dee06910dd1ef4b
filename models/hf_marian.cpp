// Hugging Face Marian checkpoints (models/hf_marian.h): config.json, generation_config.json and
// the tensors, mapped onto the Transformer.
#include "graft/models/hf_marian.h"

#include <filesystem>
#include <optional>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/nn/module.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"
#include "hf_files.h"

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

// One attention block: q/k/v concatenated into in_proj, out_proj as it is.
void add_attention(std::vector<hf::Param>& m, const std::string& h, const std::string& g,
                   int64_t d) {
  m.push_back({{h + "q_proj.weight", h + "k_proj.weight", h + "v_proj.weight"},
               {{d, d}, {d, d}, {d, d}},
               g + "in_proj_weight"});
  m.push_back({{h + "q_proj.bias", h + "k_proj.bias", h + "v_proj.bias"},
               {{d}, {d}, {d}},
               g + "in_proj_bias"});
  m.push_back({{h + "out_proj.weight"}, {{d, d}}, g + "out_proj.weight"});
  m.push_back({{h + "out_proj.bias"}, {{d}}, g + "out_proj.bias"});
}

// A Linear (out, in) or a LayerNorm (out = 0: weight and bias of size d).
void add_affine(std::vector<hf::Param>& m, const std::string& h, const std::string& g, int64_t out,
                int64_t in) {
  m.push_back({{h + ".weight"}, {in ? Shape{out, in} : Shape{out}}, g + ".weight"});
  m.push_back({{h + ".bias"}, {{out}}, g + ".bias"});
}

// Layer i of the encoder (decoder false) or the decoder: HF's names onto nn.Transformer's.
void add_layer(std::vector<hf::Param>& m, const TransformerConfig& c, bool decoder, int64_t i) {
  const std::string h =
      std::string(decoder ? "decoder" : "encoder") + ".layers." + std::to_string(i) + ".";
  const int64_t d = c.d_model;
  add_attention(m, h + "self_attn.", h + "self_attn.", d);
  add_affine(m, h + "self_attn_layer_norm", h + "norm1", d, 0);
  if (decoder) {
    add_attention(m, h + "encoder_attn.", h + "multihead_attn.", d);
    add_affine(m, h + "encoder_attn_layer_norm", h + "norm2", d, 0);
  }
  add_affine(m, h + "fc1", h + "linear1", c.d_ff, d);
  add_affine(m, h + "fc2", h + "linear2", d, c.d_ff);
  add_affine(m, h + "final_layer_norm", h + (decoder ? "norm3" : "norm2"), d, 0);
}

const char* const kEmbeddingCopies[] = {"shared.weight", "encoder.embed_tokens.weight",
                                        "decoder.embed_tokens.weight", "lm_head.weight"};
const char* const kCopy = "copy:";  // the graft name of a further embedding copy, compared

// The embedding from the first copy the file holds, each further one loaded as "copy:<name>";
// no copy at all is refused naming them.
void add_embedding(std::vector<hf::Param>& m, const hf::FileTensors& file,
                   const TransformerConfig& c, const std::string& dir) {
  bool first = true;
  for (const char* name : kEmbeddingCopies) {
    if (!file.count(name)) continue;
    m.push_back(
        {{name}, {{c.vocab, c.d_model}}, first ? "embedding.weight" : kCopy + std::string(name)});
    first = false;
  }
  if (first)
    fail("load_hf_marian: '" + dir + "': tensor 'shared.weight' is missing (nor is any copy: " +
         "encoder.embed_tokens.weight, decoder.embed_tokens.weight, lm_head.weight)");
}

// Every parameter with its sources: final_logits_bias (1, V) optional (zeros, as transformers).
std::vector<hf::Param> marian_params(const hf::FileTensors& file, const TransformerConfig& c,
                                     const std::string& dir) {
  std::vector<hf::Param> m;
  add_embedding(m, file, c, dir);
  m.push_back(file.count("final_logits_bias")
                  ? hf::Param{{"final_logits_bias"}, {{1, c.vocab}}, "final_logits_bias"}
                  : hf::Param{{}, {{c.vocab}}, "final_logits_bias"});
  for (int64_t i = 0; i < c.enc_layers; ++i) add_layer(m, c, false, i);
  for (int64_t i = 0; i < c.dec_layers; ++i) add_layer(m, c, true, i);
  return m;
}

// The sinusoid tables (recomputed) and fairseq's version buffers carry no weights.
hf::Reading marian_reading() {
  return {"load_hf_marian", {"model."}, [](const std::string& n) {
            return n == "encoder.embed_positions.weight" || n == "decoder.embed_positions.weight" ||
                   n == "encoder.version" || n == "decoder.version";
          }};
}

// Whether a and b hold the same values (compared in float32, exact for every float dtype here).
bool equal_values(const Tensor& a, const Tensor& b) {
  return to_dtype(a, DType::f32).to_vector<float>() == to_dtype(b, DType::f32).to_vector<float>();
}

// The loaded tensors as the Transformer's state: each embedding copy checked equal to the first
// (params[0]'s source) and dropped, final_logits_bias (1, V) as (V).
nn::NamedTensors marian_state(nn::NamedTensors loaded, const std::vector<hf::Param>& params,
                              const std::string& dir, int64_t vocab) {
  nn::NamedTensors out;
  for (auto& [name, t] : loaded) {
    if (!name.starts_with(kCopy)) {
      out.emplace_back(name, name == "final_logits_bias" ? reshape(t, {vocab}) : t);
      continue;
    }
    if (!equal_values(loaded[0].second, t))
      fail("load_hf_marian: '" + dir + "': tensor '" + name.substr(std::string(kCopy).size()) +
           "' differs from '" + params[0].hf[0] +
           "': graft ties the encoder, decoder and output embeddings");
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
  const hf::Reading reading = marian_reading();
  const hf::FileTensors file = hf::inspect_hf_tensors(dir, reading);
  const std::vector<hf::Param> params = marian_params(file, c.t, dir);
  hf::check_params(file, params, reading, dir);
  c.t.dtype = dtype ? *dtype : hf::common_dtype(file);
  if (!is_floating(c.t.dtype))
    fail("load_hf_marian: the model's dtype must be a float dtype, got " +
         std::string(dtype_name(c.t.dtype)));
  check_config_memory(c.t, cfg_path, /*copies=*/2);  // the files' tensors and the model
  const nn::NamedTensors state =
      marian_state(hf::load_params(file, params, c.t.dtype), params, dir, c.t.vocab);
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
