// The baseline a user would try first for language identification: a multinomial Naive Bayes
// over byte 1- to 4-grams (the method of langid.py and TextCat). `classify train` draws its
// validation scores into the learning curves and `classify evaluate` prints its test scores
// beside the model's, both trained on the same train.tsv.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "examples/classify/classify.h"

namespace graft::classify {

class NaiveBayes {
 public:
  static constexpr int kMaxN = 4;  // byte n-grams of 1..kMaxN bytes

  // Counts the n-grams of every text of `data` per label (each label must be among `labels`);
  // P(gram | label) is additively smoothed by `alpha` over the n-grams seen in training.
  // Throws when data is empty, a label is unknown, or alpha is not a finite number > 0.
  NaiveBayes(const std::vector<Example>& data, const std::vector<std::string>& labels,
             double alpha = 1.0);

  // The label id of the highest log P(label) + sum over the text's n-grams of log P(gram | label)
  // (n-grams never seen in training are skipped).
  int64_t predict(const std::string& text) const;

 private:
  std::vector<double> log_prior_;             // [label]
  std::unordered_map<uint64_t, size_t> row_;  // n-gram key -> row of log_p_
  std::vector<double> log_p_;                 // [row * labels + label]
};

// The baseline's accuracy, macro-F1 and confusion on `data`, as evaluate() gives the model's.
Metrics evaluate(const NaiveBayes& nb, const std::vector<std::string>& labels,
                 const std::vector<Example>& data);

}  // namespace graft::classify
