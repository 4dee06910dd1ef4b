// The baseline a user would try first for a byte-level language model: an interpolated
// Kneser–Ney n-gram model over the same tokens (bytes, BOS, EOS), with one discount per order
// D = n1 / (n1 + 2 n2) (Chen & Goodman's estimate) and continuation counts below the top order.
// `lm train` draws its validation bits per character into the learning curves and `lm evaluate`
// prints them beside the model's, trained on the same training documents.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "examples/lm/lm.h"

namespace graft::lm {

// The order the programs use: the highest a key holds, and the best measured on the English
// fortunes (docs/lm.md).
constexpr int kBaselineOrder = 7;
// How the programs name it.
constexpr const char* kBaselineName = "interpolated Kneser-Ney byte 7-gram";

class KneserNey {
 public:
  static constexpr int kMaxOrder = 7;  // 9 bits per token in a 64-bit key

  // Counts the n-grams of `stream` (tokens in [0, kVocab)) up to `order`.
  // Throws when order is outside [1, kMaxOrder], a token is outside the vocabulary, or the
  // stream is shorter than `order` tokens.
  KneserNey(const std::vector<int64_t>& stream, int order = 5);

  // P(token | the up to order-1 tokens before position i of `stream`), for i >= 1.
  double prob(const std::vector<int64_t>& stream, size_t i) const;
  int order() const { return (int)levels_.size(); }

 private:
  struct Context {
    double total = 0;  // the counts of the n-grams that extend it, summed
    double types = 0;  // how many distinct tokens follow it
  };
  struct Level {
    std::unordered_map<uint64_t, double> count;  // raw counts (top order) or continuation counts
    std::unordered_map<uint64_t, Context> context;
    double discount = 0.5;
  };
  std::vector<Level> levels_;  // levels_[k - 1]: n-grams of k tokens
};

// Bits per character of the baseline on the tokens evaluate() scores for a model with windows of
// `context` tokens (each given the stream's previous order-1 tokens).
Metrics evaluate(const KneserNey& kn, const std::vector<int64_t>& stream, int64_t context);

}  // namespace graft::lm
