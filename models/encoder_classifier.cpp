#include "graft/models/encoder_classifier.h"

#include <cmath>

#include "graft/models/config_json.h"
#include "graft/ops/ops.h"

namespace graft::models {

namespace {

constexpr int64_t kMaxNgramBuckets = int64_t(1) << 24, kMaxNgram = 8;

// The bucket of the n tokens ending at t[end]: an FNV-1a walk over n and the tokens, then
// splitmix64's finaliser (mix64), so that neighbouring n-grams land far apart.
int64_t ngram_bucket(const int64_t* t, int64_t end, int64_t n, int64_t buckets) {
  uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
  for (int64_t k = end - n + 1; k <= end; ++k) h = (h ^ (uint64_t)t[k]) * 0x100000001b3ULL;
  return (int64_t)(mix64(h) % (uint64_t)buckets);
}

}  // namespace

const ConfigFields<ClassifierConfig>& ClassifierConfig::fields() {
  using C = ClassifierConfig;
  static const ConfigFields<C> table = [] {
    ConfigFields<C> f = stack_fields<C>();
    const ConfigFields<C> more = {
        size_field<C>("classes", member(&C::classes), "output classes"),
        range_field<C>("ngram_buckets", member(&C::ngram_buckets), 0, kMaxNgramBuckets,
                       "hashed n-gram rows (0: tokens alone)")
            .optional(),
        range_field<C>("ngram_max", member(&C::ngram_max), 2, kMaxNgram, "the longest n-gram")
            .optional(),
    };
    f.insert(f.end(), more.begin(), more.end());
    return f;
  }();
  return table;
}

nlohmann::json ClassifierConfig::to_json() const { return write_fields(*this, fields()); }

ClassifierConfig ClassifierConfig::from_json(const nlohmann::json& j, const std::string& where) {
  ClassifierConfig c;
  read_fields(c, j, where, fields());
  c.validate(where);
  return c;
}

void ClassifierConfig::validate(const std::string& where) const {
  check_fields(*this, where, fields());
}

int64_t ClassifierConfig::parameter_count() const {
  const int64_t head =
      checked_add(checked_mul(d_model, classes, "parameter count"), classes, "parameter count");
  const int64_t ngram_rows = ngram_buckets > 0 ? ngram_buckets + 1 : 0;
  const int64_t inputs =
      checked_add(stack_parameters(/*final_norm=*/norm_first),
                  checked_mul(ngram_rows, d_model, "parameter count"), "parameter count");
  return checked_add(inputs, head, "parameter count");
}

EncoderClassifier::EncoderClassifier(const ClassifierConfig& c)
    : cfg(c), dropout_gen(c.seed * 31 + 9) {
  c.validate("EncoderClassifier");
  Generator gen(c.seed);
  embedding = register_module(
      "embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, c.pad_id, c.dtype, gen,
                                                   1.0 / std::sqrt((double)c.d_model)));
  if (c.ngram_buckets > 0)  // row ngram_buckets: "no n-gram here", learned like the others
    ngrams = register_module(
        "ngrams", std::make_shared<nn::Embedding>(c.ngram_buckets + 1, c.d_model, -1, c.dtype, gen,
                                                  1.0 / std::sqrt((double)c.d_model)));
  pos = register_module("pos", std::make_shared<nn::EmbeddingPositions>(c.positions.kind, c.max_len,
                                                                        c.d_model, c.dtype, gen));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, &dropout_gen));
  encoder =
      register_module("encoder", std::make_shared<nn::Encoder>(c.layer(), c.layers, c.norm_first,
                                                               gen, &dropout_gen, c.positions));
  head = register_module("head",
                         std::make_shared<nn::Linear>(c.d_model, c.classes, true, c.dtype, gen));
}

Tensor EncoderClassifier::ngram_ids(const Tensor& ids) const {
  check_token_ids("EncoderClassifier", ids);
  if (!ngrams) fail("EncoderClassifier: the config has no n-gram table (ngram_buckets 0)");
  const int64_t B = ids.size(0), T = ids.size(1), K = cfg.ngram_max - 1;
  const std::vector<int64_t> t = ids.to_vector<int64_t>();  // row-major
  std::vector<int64_t> out((size_t)(B * T * K), cfg.ngram_buckets);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* row = t.data() + b * T;
    int64_t run = 0;  // tokens since the last pad, up to and including position i
    for (int64_t i = 0; i < T; ++i) {
      run = row[i] == cfg.pad_id ? 0 : run + 1;
      for (int64_t n = 2; n <= cfg.ngram_max && n <= run; ++n)
        out[(size_t)((b * T + i) * K + n - 2)] = ngram_bucket(row, i, n, cfg.ngram_buckets);
    }
  }
  return from_vector(out, {B, T, K}, DType::i64);
}

Tensor EncoderClassifier::forward(const Tensor& ids) const {
  const auto named = scope();
  check_token_ids("EncoderClassifier", ids);
  Tensor pad = eq(ids, (double)cfg.pad_id);
  Tensor tokens = embedding->forward(ids);
  if (ngrams) tokens = add(tokens, sum(ngrams->forward(ngram_ids(ids)), {2}));
  Tensor x = affine(tokens, std::sqrt((double)cfg.d_model), 0.0);
  Tensor h = encoder->forward(dropout->forward(pos->forward(x)), pad);
  // Mean over non-pad positions: weights (B, T, 1) = keep / count.
  Tensor keep = to_dtype(eq(pad, 0.0), h.dtype());
  Tensor count = sum(keep, {1}, true);
  Tensor w = div(keep, add(count, eq(count, 0.0)));  // an all-padding row pools to zeros, not NaN
  Tensor pooled = sum(mul(h, unsqueeze(w, 2)), {1});
  return head->forward(pooled);
}

}  // namespace graft::models
