#include "graft/models/decoder_only_lm.h"

#include <cmath>

#include "graft/autograd/tape.h"
#include "graft/models/config_json.h"
#include "graft/ops/ops.h"

namespace graft::models {


nlohmann::json LMConfig::to_json() const {
  nlohmann::json j = stack_json();
  j["scale_embedding"] = scale_embedding;
  return j;
}

LMConfig LMConfig::from_json(const nlohmann::json& j, const std::string& where) {
  LMConfig c;
  const ConfigReader r(j, where);
  c.read_stack(r);
  r.get_or_keep("scale_embedding", c.scale_embedding);
  c.validate(where);
  return c;
}

DecoderOnlyLM::DecoderOnlyLM(const LMConfig& c) : cfg(c), dropout_gen(c.seed * 31 + 7) {
  c.validate("DecoderOnlyLM");
  Generator gen(c.seed);
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.pad_id, c.dtype, gen, 0.02));
  pos = register_module("pos", std::make_shared<nn::EmbeddingPositions>(c.positions.kind, c.max_len, c.d_model, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  blocks = register_module("blocks", std::make_shared<nn::CausalStack>(c.layer(), c.layers, gen, &dropout_gen, c.positions));
}

Tensor DecoderOnlyLM::embed(const Tensor& ids, int64_t start) const {
  check_token_ids("DecoderOnlyLM", ids);
  Tensor x = embedding->forward(ids);
  if (cfg.scale_embedding) x = affine(x, std::sqrt((double)cfg.d_model), 0.0);
  return dropout->forward(pos->forward(x, start));
}

Tensor DecoderOnlyLM::logits(const Tensor& h) const { return linear(h, embedding->weight); }

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

Sequences generate(DecoderOnlyLM& lm, const std::vector<std::vector<int64_t>>& prompts,
                   int64_t eos, const DecodeOptions& o) {
  check_decode_options(o);
  if (prompts.empty() || prompts[0].empty()) fail("generate: needs at least one non-empty prompt");
  const int64_t len = (int64_t)prompts[0].size();
  for (auto& p : prompts) {
    if ((int64_t)p.size() != len) fail("generate: prompts must have equal lengths (no padding)");
    for (int64_t id : p)
      if (id < 0 || id >= lm.cfg.vocab)
        fail("generate: token id " + std::to_string(id) + " outside the vocabulary [0, " + std::to_string(lm.cfg.vocab) + ")");
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
