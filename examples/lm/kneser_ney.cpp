#include "examples/lm/kneser_ney.h"

#include <algorithm>
#include <cmath>

namespace graft::lm {

namespace {

constexpr int kBits = 9;  // a token + 1 in 9 bits: 0 is no token
constexpr uint64_t kTokenMask = (uint64_t(1) << kBits) - 1;
constexpr double kSymbols = (double)(kVocab - 1);  // every token but PAD, which never occurs

// The key of the k tokens of `stream` ending at position i (inclusive).
uint64_t gram_key(const std::vector<int64_t>& stream, size_t i, int k) {
  uint64_t key = 0;
  for (size_t j = i + 1 - (size_t)k; j <= i; ++j) key = key << kBits | (uint64_t)(stream[j] + 1);
  return key;
}

// Chen & Goodman's discount from how many n-grams have count 1 and 2.
double discount_of(const std::unordered_map<uint64_t, double>& count) {
  double n1 = 0, n2 = 0;
  for (auto& [key, c] : count) n1 += c == 1, n2 += c == 2;
  return n1 + 2 * n2 > 0 && n1 > 0 ? n1 / (n1 + 2 * n2) : 0.5;
}

}  // namespace

KneserNey::KneserNey(const std::vector<int64_t>& stream, int order) {
  if (order < 1 || order > kMaxOrder)
    fail("kneser-ney: the order must be in [1, " + std::to_string(kMaxOrder) + "], got " +
         std::to_string(order));
  if (stream.size() < (size_t)order)
    fail("kneser-ney: a stream of " + std::to_string(stream.size()) + " tokens");
  for (int64_t t : stream)
    if (t < 0 || t >= kVocab - 1)
      fail("kneser-ney: token " + std::to_string(t) + " is outside the vocabulary");
  levels_.resize((size_t)order);
  // The top order counts its n-grams; each lower order counts, for each of its n-grams, the
  // distinct tokens seen before it (its continuation count).
  for (size_t i = (size_t)order - 1; i < stream.size(); ++i)
    levels_.back().count[gram_key(stream, i, order)] += 1;
  for (int k = order - 1; k >= 1; --k) {
    const uint64_t suffix = (uint64_t(1) << (kBits * k)) - 1;
    for (auto& [key, c] : levels_[(size_t)k].count) levels_[(size_t)k - 1].count[key & suffix] += 1;
  }
  for (Level& l : levels_) {
    for (auto& [key, c] : l.count) {
      Context& h = l.context[key >> kBits];
      h.total += c;
      h.types += 1;
    }
    l.discount = discount_of(l.count);
  }
}

double KneserNey::prob(const std::vector<int64_t>& stream, size_t i) const {
  const int k_max = (int)std::min<size_t>(levels_.size(), i + 1);
  double p = 1.0 / kSymbols;
  for (int k = 1; k <= k_max; ++k) {
    const Level& l = levels_[(size_t)k - 1];
    const uint64_t key = gram_key(stream, i, k);
    const auto h = l.context.find(key >> kBits);
    if (h == l.context.end()) continue;  // an unseen context: the lower order's estimate stands
    const auto c = l.count.find(key);
    const double seen = c == l.count.end() ? 0.0 : std::max(c->second - l.discount, 0.0);
    p = seen / h->second.total + l.discount * h->second.types / h->second.total * p;
  }
  return p;
}

Metrics evaluate(const KneserNey& kn, const std::vector<int64_t>& stream, int64_t context) {
  if (context < 1) fail("evaluate: the context must be >= 1");
  const int64_t windows = ((int64_t)stream.size() - 1) / context;
  if (windows < 1)
    fail("evaluate: the text is shorter than one window of " + std::to_string(context) + " tokens");
  double nll = 0;
  int64_t chars = 0;
  for (int64_t i = 1; i <= windows * context; ++i) {
    nll -= std::log(kn.prob(stream, (size_t)i));
    chars += chars_of(stream[(size_t)i]);
  }
  return metrics_of(nll, windows * context, chars);
}

}  // namespace graft::lm
