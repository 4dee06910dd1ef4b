#include "examples/classify/naive_bayes.h"

#include <cmath>
#include <limits>

namespace graft::classify {

namespace {

// Calls f(key) for every n-gram of 1..kMaxN bytes of `text`; a key holds the n bytes and n, so
// two different n-grams never share one.
template <class F>
void for_each_gram(const std::string& text, F&& f) {
  const size_t len = text.size();
  for (size_t i = 0; i < len; ++i) {
    uint64_t bytes = 0;
    for (size_t n = 1; n <= (size_t)NaiveBayes::kMaxN && i + n <= len; ++n) {
      bytes = bytes << 8 | (unsigned char)text[i + n - 1];
      f(bytes | (uint64_t)n << 32);
    }
  }
}

}  // namespace

NaiveBayes::NaiveBayes(const std::vector<Example>& data, const std::vector<std::string>& labels,
                       double alpha) {
  if (data.empty()) fail("naive bayes: no training examples");
  if (!(alpha > 0) || !std::isfinite(alpha)) fail("naive bayes: alpha must be a finite number > 0");
  const size_t C = labels.size();
  std::vector<double> counts, totals(C, 0.0), docs(C, 0.0);
  const LabelIndex label_index(labels);
  for (const Example& e : data) {
    const size_t c = (size_t)label_index(e.label);
    docs[c] += 1;
    for_each_gram(e.text, [&](uint64_t key) {
      auto [it, added] = row_.emplace(key, row_.size());
      if (added) counts.resize(counts.size() + C, 0.0);
      counts[it->second * C + c] += 1;
      totals[c] += 1;
    });
  }
  const double V = (double)row_.size();
  log_prior_.resize(C);
  for (size_t c = 0; c < C; ++c)
    log_prior_[c] = docs[c] > 0 ? std::log(docs[c] / (double)data.size())
                                : -std::numeric_limits<double>::infinity();
  log_p_.resize(counts.size());
  for (size_t r = 0; r < row_.size(); ++r)
    for (size_t c = 0; c < C; ++c)
      log_p_[r * C + c] = std::log((counts[r * C + c] + alpha) / (totals[c] + alpha * V));
}

int64_t NaiveBayes::predict(const std::string& text) const {
  const size_t C = log_prior_.size();
  std::vector<double> score = log_prior_;
  for_each_gram(text, [&](uint64_t key) {
    auto it = row_.find(key);
    if (it == row_.end()) return;
    for (size_t c = 0; c < C; ++c) score[c] += log_p_[it->second * C + c];
  });
  size_t best = 0;
  for (size_t c = 1; c < C; ++c)
    if (score[c] > score[best]) best = c;
  return (int64_t)best;
}

Metrics evaluate(const NaiveBayes& nb, const std::vector<std::string>& labels,
                 const std::vector<Example>& data) {
  std::vector<std::vector<int64_t>> confusion(labels.size(),
                                              std::vector<int64_t>(labels.size(), 0));
  const LabelIndex label_index(labels);
  for (const Example& e : data)
    ++confusion[(size_t)label_index(e.label)][(size_t)nb.predict(e.text)];
  return metrics_of(std::move(confusion));
}

}  // namespace graft::classify
