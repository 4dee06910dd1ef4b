#include "graft/models/decoder_only_lm.h"

#include <cmath>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/config_json.h"
#include "graft/ops/ops.h"

namespace graft::models {

nlohmann::json LMConfig::to_json() const {
  nlohmann::json j = stack_json();
  j["scale_embedding"] = scale_embedding;
  j["norm"] = rms_norm ? "rmsnorm" : "layernorm";
  j["ffn"] = nn::activation_name(ffn);
  j["kv_heads"] = kv_heads;
  j["bias"] = bias;
  j["tied_output"] = tied_output;
  return j;
}

LMConfig LMConfig::from_json(const nlohmann::json& j, const std::string& where) {
  LMConfig c;
  const ConfigReader r(j, where);
  c.read_stack(r);
  r.get_or_keep("scale_embedding", c.scale_embedding);
  std::string norm = "layernorm", ffn = "relu";
  r.get_or_keep("norm", norm);
  if (norm != "layernorm" && norm != "rmsnorm")
    r.bad("norm", "must be layernorm or rmsnorm, got '" + text::printable(norm) + "'");
  c.rms_norm = norm == "rmsnorm";
  r.get_or_keep("ffn", ffn);
  if (!nn::activation_from_name(ffn, c.ffn))
    r.bad("ffn", "must be relu, gelu, gelu_tanh or swiglu, got '" + text::printable(ffn) + "'");
  r.get_or_keep("kv_heads", c.kv_heads);
  r.get_or_keep("bias", c.bias);
  r.get_or_keep("tied_output", c.tied_output);
  c.validate(where);
  return c;
}

void LMConfig::validate(const std::string& where) const {
  validate_stack(where);
  if (kv_heads < 0 || kv_heads > heads || (kv_heads > 0 && heads % kv_heads != 0))
    ConfigCheck(where).bad("kv_heads", "must be 0 (= heads) or divide heads " +
                                           std::to_string(heads) + ", got " +
                                           std::to_string(kv_heads));
}

nn::LayerConfig LMConfig::layer() const {
  nn::LayerConfig l = StackConfig::layer();
  l.activation = ffn;
  l.rms_norm = rms_norm;
  l.kv_heads = kv_heads;
  l.bias = bias;
  return l;
}

int64_t LMConfig::parameter_count() const {
  int64_t n = checked_add(embedding_parameters(vocab, d_model, max_len, positions.kind),
                          nn::encoder_parameters(layer(), layers, /*final_norm=*/true, positions),
                          "parameter count");
  if (!tied_output)
    n = checked_add(n, checked_mul(vocab, d_model, "parameter count"), "parameter count");
  return n;
}

DecoderOnlyLM::DecoderOnlyLM(const LMConfig& c) : cfg(c), dropout_gen(c.seed * 31 + 7) {
  c.validate("DecoderOnlyLM");
  Generator gen(c.seed);
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(
                                               c.vocab, c.d_model, c.pad_id, c.dtype, gen, 0.02));
  pos = register_module("pos", std::make_shared<nn::EmbeddingPositions>(c.positions.kind, c.max_len,
                                                                        c.d_model, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  blocks = register_module("blocks", std::make_shared<nn::CausalStack>(c.layer(), c.layers, gen,
                                                                       &dropout_gen, c.positions));
  if (!c.tied_output)
    output = register_module("output",
                             std::make_shared<nn::Linear>(c.d_model, c.vocab, false, c.dtype, gen));
}

Tensor DecoderOnlyLM::embed(const Tensor& ids, int64_t start) const {
  check_token_ids("DecoderOnlyLM", ids);
  Tensor x = embedding->forward(ids);
  if (cfg.scale_embedding) x = affine(x, std::sqrt((double)cfg.d_model), 0.0);
  return dropout->forward(pos->forward(x, start));
}

Tensor DecoderOnlyLM::logits(const Tensor& h) const {
  return linear(h, output ? output->weight : embedding->weight);
}

Tensor DecoderOnlyLM::forward(const Tensor& ids) const {
  const auto named = scope();
  return logits(blocks->forward(embed(ids), eq(ids, (double)cfg.pad_id)));
}

namespace {

// Next-token logits of each row: the first call runs the prompts through the stack (filling the
// caches), each later call feeds the newest token only; without the cache, the whole prefix.
class LMStep : public DecodeStep {
 public:
  LMStep(const DecoderOnlyLM& lm, int64_t capacity, bool use_cache)
      : lm_(lm), capacity_(capacity), use_cache_(use_cache) {}

  Tensor next_logits(const std::vector<std::vector<int64_t>>& prefix) override {
    const int64_t rows = (int64_t)prefix.size(), t = (int64_t)prefix[0].size();
    const int64_t from = use_cache_ ? fed_ : 0;
    std::vector<int64_t> ids;
    for (auto& p : prefix) ids.insert(ids.end(), p.begin() + from, p.end());
    const Tensor x = lm_.embed(from_vector(ids, {rows, t - from}, DType::i64), from);
    const Tensor h = use_cache_ ? lm_.blocks->forward_step(x, caches_, capacity_)
                                : lm_.blocks->forward(x, Tensor());
    fed_ = t;
    return reshape(lm_.logits(slice(h, 1, t - from - 1, t - from)), {rows, lm_.cfg.vocab});
  }

  void select(const std::vector<int64_t>& rows) override {
    const Tensor r = from_vector(rows, {(int64_t)rows.size()}, DType::i64);
    for (auto& c : caches_) c.select_rows(r);
  }

 private:
  const DecoderOnlyLM& lm_;
  int64_t capacity_;
  bool use_cache_;
  int64_t fed_ = 0;
  std::vector<nn::KVCache> caches_;
};

}  // namespace

Sequences generate(DecoderOnlyLM& lm, const std::vector<std::vector<int64_t>>& prompts, int64_t eos,
                   const DecodeOptions& o) {
  check_decode_options(o);
  if (prompts.empty() || prompts[0].empty()) fail("generate: needs at least one non-empty prompt");
  const int64_t len = (int64_t)prompts[0].size();
  for (auto& p : prompts) {
    if ((int64_t)p.size() != len) fail("generate: prompts must have equal lengths (no padding)");
    for (int64_t id : p)
      if (id < 0 || id >= lm.cfg.vocab)
        fail("generate: token id " + std::to_string(id) + " outside the vocabulary [0, " +
             std::to_string(lm.cfg.vocab) + ")");
  }
  if (lm.cfg.positions.kind == nn::Positions::learned && len + o.max_len > lm.cfg.max_len)
    fail("generate: prompt " + std::to_string(len) + " + max_len " + std::to_string(o.max_len) +
         " tokens exceed the learned positions' max_len " + std::to_string(lm.cfg.max_len));
  autograd::NoGrad ng;
  nn::EvalScope es(lm);
  LMStep step(lm, len + o.max_len, o.use_cache);
  return decode(step, prompts, eos, o);
}

}  // namespace graft::models
