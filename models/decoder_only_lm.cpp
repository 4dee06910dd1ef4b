#include "graft/models/decoder_only_lm.h"

#include <cmath>

#include "graft/autograd/tape.h"
#include "graft/autograd/text.h"
#include "graft/models/config_json.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

// "norm": "layernorm" | "rmsnorm", the key of rms_norm in configs before graft 0.7.
void read_old_norm(LMConfig& c, const ConfigReader& r, const char* key) {
  std::string norm;
  r.get(key, norm);
  if (norm != "layernorm" && norm != "rmsnorm")
    r.bad(key, "must be layernorm or rmsnorm, got '" + text::printable(norm) + "'");
  c.rms_norm = norm == "rmsnorm";
}

void check_kv_heads(const LMConfig& c, const ConfigCheck& k) {
  if (c.kv_heads < 0 || c.kv_heads > c.heads || (c.kv_heads > 0 && c.heads % c.kv_heads != 0))
    k.bad("kv_heads", "must be 0 (= heads) or divide heads " + std::to_string(c.heads) + ", got " +
                          std::to_string(c.kv_heads));
}

}  // namespace

const ConfigFields<LMConfig>& LMConfig::fields() {
  using C = LMConfig;
  using A = nn::Activation;
  static const ConfigFields<C> table = [] {
    ConfigFields<C> f = stack_fields<C>();
    const ConfigFields<C> more = {
        value_field<C>("scale_embedding", member(&C::scale_embedding),
                       "token embeddings times sqrt(d_model)")
            .optional(),
        value_field<C>("rms_norm", member(&C::rms_norm), "RMSNorm instead of LayerNorm")
            .optional()
            .or_old("norm", read_old_norm),
        activation_field<C>(member(&C::activation), {A::relu, A::gelu, A::gelu_tanh, A::swiglu})
            .optional()
            .or_old("ffn"),
        value_field<C>("kv_heads", member(&C::kv_heads), "key/value heads (0: heads)")
            .optional()
            .and_check(check_kv_heads),
        value_field<C>("bias", member(&C::bias), "biases in every linear and norm").optional(),
        value_field<C>("tied_output", member(&C::tied_output), "logits through the embedding")
            .optional(),
        value_field<C>("eps", member(&C::eps), "the norms' epsilon")
            .optional()
            .and_check([](const C& c, const ConfigCheck& k) {
              if (!(c.eps > 0 && c.eps < 1)) k.bad("eps", "must be in (0, 1)");
            }),
        value_field<C>("mask_pad", member(&C::mask_pad), "mask the keys holding pad_id").optional(),
    };
    f.insert(f.end(), more.begin(), more.end());
    return f;
  }();
  return table;
}

nlohmann::json LMConfig::to_json() const { return write_fields(*this, fields()); }

LMConfig LMConfig::from_json(const nlohmann::json& j, const std::string& where) {
  LMConfig c;
  read_fields(c, j, where, fields());
  c.validate(where);
  return c;
}

void LMConfig::validate(const std::string& where) const { check_fields(*this, where, fields()); }

nn::LayerConfig LMConfig::layer() const {
  nn::LayerConfig l = StackConfig::layer();
  l.activation = activation;
  l.rms_norm = rms_norm;
  l.kv_heads = kv_heads;
  l.bias = bias;
  l.eps = eps;
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
  // Without pad masking (imported decoders) no id is special: every row trains.
  embedding = register_module(
      "embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.mask_pad ? c.pad_id : -1,
                                                   c.dtype, gen, 0.02));
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
  const Tensor mask = cfg.mask_pad ? eq(ids, (double)cfg.pad_id) : Tensor();
  return logits(blocks->forward(embed(ids), mask));
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
  check_stop_ids(eos, o, lm.cfg.vocab);  // before the prompt's forward, not at the first step
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
