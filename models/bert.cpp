#include "graft/models/bert.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

/// Hugging Face's hidden_act names and the activation each is.
bool hf_activation(const std::string& name, nn::Activation& out) {
  if (name == "gelu") return out = nn::Activation::gelu, true;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
    return out = nn::Activation::gelu_tanh, true;
  if (name == "relu") return out = nn::Activation::relu, true;
  return false;
}

nn::LayerConfig bert_layer(const BertConfig& c) {
  nn::LayerConfig l = c.layer();
  l.eps = c.eps;
  l.activation = c.activation;
  l.attention_dropout = c.attention_dropout;
  return l;
}

}  // namespace

BertConfig::BertConfig() {
  positions.kind = nn::Positions::learned;
  max_len = 512;
}

BertConfig BertConfig::from_hf_json(const nlohmann::json& j, const std::string& where) {
  const ConfigReader r(j, where);
  std::string type;
  r.get("model_type", type);
  if (type != "bert")
    fail(where + ": the architecture (model_type \"" + text::printable(type) +
         "\") is not supported: graft reads BERT-family encoders (model_type \"bert\")");
  std::string pos = "absolute";
  r.get_or_keep("position_embedding_type", pos);
  if (pos != "absolute")
    r.bad("position_embedding_type", "must be \"absolute\", got \"" + text::printable(pos) + "\"");
  BertConfig c;
  r.get("vocab_size", c.vocab), r.get("hidden_size", c.d_model),
      r.get("num_attention_heads", c.heads);
  r.get("intermediate_size", c.d_ff), r.get("num_hidden_layers", c.layers);
  r.get("max_position_embeddings", c.max_len), r.get("type_vocab_size", c.type_vocab);
  r.get("layer_norm_eps", c.eps);
  std::string act;
  r.get("hidden_act", act);
  if (!hf_activation(act, c.activation))
    r.bad("hidden_act", "must be gelu, gelu_new, gelu_pytorch_tanh, gelu_fast or relu, got \"" +
                            text::printable(act) + "\"");
  r.get_or_keep("hidden_dropout_prob", c.dropout);
  r.get_or_keep("attention_probs_dropout_prob", c.attention_dropout);
  r.get_or_keep("pad_token_id", c.pad_id);
  c.validate(where);
  return c;
}

const ConfigFields<BertConfig>& BertConfig::fields() {
  static const ConfigFields<BertConfig> table = bert_fields<BertConfig>();
  return table;
}

nlohmann::json BertConfig::to_json() const { return write_fields(*this, fields()); }

BertConfig BertConfig::from_json(const nlohmann::json& j, const std::string& where) {
  BertConfig c;
  read_fields(c, j, where, fields());
  c.validate(where);
  return c;
}

void BertConfig::validate(const std::string& where) const { check_fields(*this, where, fields()); }

int64_t BertConfig::parameter_count() const {
  const int64_t types = checked_mul(type_vocab, d_model, "parameter count");
  return checked_add(checked_add(stack_parameters(/*final_norm=*/false), types, "parameter count"),
                     2 * d_model, "parameter count");  // + the embeddings' LayerNorm
}

BertEncoder::BertEncoder(const BertConfig& c) : cfg(c), dropout_gen(c.seed * 31 + 7) {
  c.validate("BertEncoder");
  Generator gen(c.seed);
  word = register_module(
      "word", std::make_shared<nn::Embedding>(c.vocab, c.d_model, -1, c.dtype, gen, 0.02));
  position =
      register_module("position", std::make_shared<nn::EmbeddingPositions>(
                                      nn::Positions::learned, c.max_len, c.d_model, c.dtype, gen));
  token_type = register_module("token_type", std::make_shared<nn::Embedding>(
                                                 c.type_vocab, c.d_model, -1, c.dtype, gen, 0.02));
  embed_norm =
      register_module("embed_norm", std::make_shared<nn::LayerNorm>(c.d_model, c.eps, c.dtype));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  encoder = register_module(
      "encoder", std::make_shared<nn::Encoder>(bert_layer(c), c.layers, /*final_norm=*/false, gen,
                                               &dropout_gen, c.positions));
}

Tensor BertEncoder::forward(const Tensor& ids, const Tensor& pad, const Tensor& types) const {
  const auto named = scope();
  check_token_ids("BertEncoder", ids);
  for (const Tensor* t : {&pad, &types})
    if (t->defined() && t->shape() != ids.shape())
      fail("BertEncoder: the padding mask and token types must have the ids' shape " +
           shape_str(ids.shape()) + ", got " + shape_str(t->shape()));
  const Tensor mask = pad.defined() ? pad : eq(ids, (double)cfg.pad_id);
  const Tensor tt = types.defined() ? types : zeros(ids.shape(), DType::i64);
  Tensor x = position->forward(add(word->forward(ids), token_type->forward(tt)));
  x = dropout->forward(embed_norm->forward(x));
  return hooked(encoder->forward(x, mask));
}

Tensor mean_pool(const Tensor& h, const Tensor& pad) {
  if (!h.defined() || !pad.defined()) fail("mean_pool: h and pad must be defined tensors");
  if (h.dim() != 3 || pad.dim() != 2 || pad.size(0) != h.size(0) || pad.size(1) != h.size(1))
    fail("mean_pool: needs h (B, T, d) and pad (B, T), got " + shape_str(h.shape()) + " and " +
         shape_str(pad.shape()));
  Tensor keep = to_dtype(eq(pad, 0.0), h.dtype());
  Tensor count = sum(keep, {1}, true);
  Tensor w = div(keep, add(count, eq(count, 0.0)));  // an all-padding row pools to zeros, not NaN
  return sum(mul(h, unsqueeze(w, 2)), {1});
}

Tensor l2_normalize(const Tensor& x, double eps) {
  if (!x.defined()) fail("l2_normalize: x is undefined");
  Tensor norm = sqrt(sum(mul(x, x), {x.dim() - 1}, true));
  return div(x, clamp(norm, eps, std::numeric_limits<double>::infinity()));
}

std::vector<HfNameMap> bert_hf_names(int64_t layers) {
  if (layers < 0 || layers > kMaxLayers)
    fail("bert_hf_names: layers must be in [0, " + std::to_string(kMaxLayers) + "], got " +
         std::to_string(layers));
  std::vector<HfNameMap> m = {{{"embeddings.word_embeddings.weight"}, "word.weight"},
                              {{"embeddings.position_embeddings.weight"}, "position.weight"},
                              {{"embeddings.token_type_embeddings.weight"}, "token_type.weight"},
                              {{"embeddings.LayerNorm.weight"}, "embed_norm.weight"},
                              {{"embeddings.LayerNorm.bias"}, "embed_norm.bias"}};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string h = "encoder.layer." + std::to_string(i) + ".",
                      g = "encoder.layers." + std::to_string(i) + ".";
    for (const char* p : {"weight", "bias"}) {
      const std::string s = p;
      m.push_back({{h + "attention.self.query." + s, h + "attention.self.key." + s,
                    h + "attention.self.value." + s},
                   g + "self_attn.in_proj_" + s});
      m.push_back({{h + "attention.output.dense." + s}, g + "self_attn.out_proj." + s});
      m.push_back({{h + "attention.output.LayerNorm." + s}, g + "norm1." + s});
      m.push_back({{h + "intermediate.dense." + s}, g + "linear1." + s});
      m.push_back({{h + "output.dense." + s}, g + "linear2." + s});
      m.push_back({{h + "output.LayerNorm." + s}, g + "norm2." + s});
    }
  }
  return m;
}

namespace {

/// The tensors of a checkpoint file the encoder does not use: the position-id buffer, the pooler
/// (BertModel's [CLS] head) and, in a pre-training checkpoint, its heads.
bool unused_hf_tensor(const std::string& name) {
  return name == "embeddings.position_ids" || name.rfind("pooler.", 0) == 0 ||
         name.rfind("cls.", 0) == 0;
}

/// The file's tensors by their BertModel names ("bert." stripped when every encoder tensor has it).
/// A name given both with and without the prefix is an error: either copy could be the one meant.
std::map<std::string, Tensor> hf_tensors(const train::SafetensorsFile& f) {
  const bool prefixed = f.contains("bert.embeddings.word_embeddings.weight");
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : f.tensors) {
    std::string n = name;
    if (prefixed && n.rfind("bert.", 0) == 0) n = n.substr(5);
    if (unused_hf_tensor(n)) continue;
    if (!is_floating(t.dtype()))  // any float dtype converts into the model's (map_hf_weights)
      fail("load_hf_bert: '" + f.path + "': tensor '" + name + "' is " + dtype_name(t.dtype()) +
           ", not a float weight (float32, float64, bfloat16 or float16)");
    if (!out.emplace(n, t).second)
      fail("load_hf_bert: '" + f.path + "': the file holds both 'bert." + n + "' and '" + n +
           "'; keep one of them");
  }
  return out;
}

/// The shape BertEncoder gives its parameter `graft` (a bert_hf_names() name) under config c,
/// computed without building the model, so a file that does not fit is refused before any
/// weight of the config's size is allocated.
Shape graft_parameter_shape(const BertConfig& c, const std::string& graft) {
  const auto ends = [&](const char* s) { return graft.ends_with(s); };
  const int64_t d = c.d_model;
  if (graft == "word.weight") return {c.vocab, d};
  if (graft == "position.weight") return {c.max_len, d};
  if (graft == "token_type.weight") return {c.type_vocab, d};
  if (ends("in_proj_weight")) return {3 * d, d};
  if (ends("in_proj_bias")) return {3 * d};
  if (ends("linear1.weight")) return {c.d_ff, d};
  if (ends("linear1.bias")) return {c.d_ff};
  if (ends("linear2.weight")) return {d, c.d_ff};
  if (ends("out_proj.weight")) return {d, d};
  return {d};  // the LayerNorms' weights and biases, out_proj's and linear2's biases
}

/// Every tensor the config needs is in the file with its shape, and nothing else is: checked on
/// the file's shapes and the config alone, before the model is built.
void check_hf_shapes(const std::map<std::string, Tensor>& file, const BertConfig& c,
                     const std::string& path) {
  std::set<std::string> unused;
  for (const auto& [n, t] : file) unused.insert(n);
  for (const HfNameMap& m : bert_hf_names(c.layers)) {
    Shape part = graft_parameter_shape(c, m.graft);
    part[0] /= (int64_t)m.hf.size();  // query, key and value: a third of in_proj's rows each
    for (const std::string& h : m.hf) {
      auto it = file.find(h);
      if (it == file.end()) fail("load_hf_bert: '" + path + "': tensor '" + h + "' is missing");
      if (it->second.shape() != part)
        fail("load_hf_bert: '" + path + "': tensor '" + h + "' has shape " +
             shape_str(it->second.shape()) + ", the config needs " + shape_str(part));
      unused.erase(h);
    }
  }
  if (!unused.empty())
    fail("load_hf_bert: '" + path + "': unexpected tensor '" + *unused.begin() + "'");
}

/// The graft parameters of the model from the file's tensors (check_hf_shapes() passed).
nn::NamedTensors map_hf_weights(const std::map<std::string, Tensor>& file, const BertConfig& c) {
  nn::NamedTensors out;
  for (const HfNameMap& m : bert_hf_names(c.layers)) {
    Tensors parts;
    for (const std::string& h : m.hf) parts.push_back(to_dtype(file.at(h), c.dtype));
    out.emplace_back(m.graft, parts.size() == 1 ? parts[0] : concat(parts, 0));
  }
  return out;
}

/// The encoder with its parameters allocated but not initialised: the file supplies every one
/// (check_hf_shapes() refuses a file without them), so drawing them would be wasted work.
std::unique_ptr<BertEncoder> uninitialised_bert(const BertConfig& c) {
  const nn::SkipInit skip;
  return std::make_unique<BertEncoder>(c);
}

}  // namespace

std::unique_ptr<BertEncoder> load_hf_bert(const std::string& dir) {
  const std::string cfg_path = dir + "/config.json", weights_path = dir + "/model.safetensors";
  const BertConfig c = BertConfig::from_hf_json(train::load_json(cfg_path), cfg_path);
  check_config_memory(c, cfg_path, /*copies=*/3);  // the file, the mapped tensors, the model
  std::error_code ec;
  if (!std::filesystem::exists(weights_path, ec))
    fail("load_hf_bert: '" + weights_path +
         "' is missing (a PyTorch .bin converts with examples/embed/bin_to_safetensors.py)");
  const train::SafetensorsFile f = train::load_safetensors(weights_path);
  const std::map<std::string, Tensor> file = hf_tensors(f);
  check_hf_shapes(file, c, weights_path);
  auto model = uninitialised_bert(c);
  model->adopt_state_dict(map_hf_weights(file, c));
  model->eval();
  return model;
}

namespace {

const char* hf_activation_name(nn::Activation a) {
  return a == nn::Activation::gelu_tanh ? "gelu_new" : a == nn::Activation::relu ? "relu" : "gelu";
}

}  // namespace

void save_hf_bert(const BertEncoder& model, const std::string& dir) {
  const BertConfig& c = model.cfg;
  const nlohmann::json cfg = {{"architectures", {"BertModel"}},
                              {"model_type", "bert"},
                              {"vocab_size", c.vocab},
                              {"hidden_size", c.d_model},
                              {"num_attention_heads", c.heads},
                              {"intermediate_size", c.d_ff},
                              {"num_hidden_layers", c.layers},
                              {"max_position_embeddings", c.max_len},
                              {"type_vocab_size", c.type_vocab},
                              {"layer_norm_eps", c.eps},
                              {"hidden_act", hf_activation_name(c.activation)},
                              {"hidden_dropout_prob", c.dropout},
                              {"attention_probs_dropout_prob", c.attention_dropout},
                              {"pad_token_id", c.pad_id},
                              {"position_embedding_type", "absolute"}};
  std::map<std::string, Tensor> params;
  for (const auto& [n, t] : model.named_parameters()) params[n] = t;
  nn::NamedTensors out;
  for (const HfNameMap& m : bert_hf_names(c.layers)) {
    const Tensor& t = params.at(m.graft);
    const int64_t rows = t.size(0) / (int64_t)m.hf.size();
    for (size_t i = 0; i < m.hf.size(); ++i)
      out.emplace_back(m.hf[i],
                       contiguous(slice(t, 0, (int64_t)i * rows, (int64_t)(i + 1) * rows)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("save_hf_bert: cannot create '" + dir + "': " + ec.message());
  train::save_json(dir + "/config.json", cfg);
  train::save_safetensors(dir + "/model.safetensors", out, {{"format", "pt"}});
}

std::pair<Tensor, Tensor> pad_batch(const std::vector<std::vector<int64_t>>& rows, int64_t pad_id) {
  if (rows.empty()) fail("pad_batch: no rows");
  size_t T = 0;
  for (const auto& r : rows) {
    if (r.empty()) fail("pad_batch: an empty row");
    T = std::max(T, r.size());
  }
  const int64_t B = (int64_t)rows.size();
  std::vector<int64_t> ids((size_t)B * T, pad_id);
  std::vector<float> pad((size_t)B * T, 1.0f);
  for (size_t b = 0; b < rows.size(); ++b)
    for (size_t t = 0; t < rows[b].size(); ++t) ids[b * T + t] = rows[b][t], pad[b * T + t] = 0.0f;
  return {from_vector(ids, {B, (int64_t)T}), from_vector(pad, {B, (int64_t)T})};
}

}  // namespace graft::models
