// Corpus-level BLEU that reproduces sacreBLEU 2.x defaults, so scores printed
// by graft's translation example are directly comparable with published
// WMT-style numbers: 13a tokenisation, n-gram order 4, brevity penalty,
// "exp" smoothing, case-sensitive, one reference per hypothesis.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace graft::text {

struct BleuResult {
  double score = 0.0;                  // 0..100
  std::array<double, 4> precisions{};  // modified n-gram precisions, 0..100
  double bp = 0.0;                     // brevity penalty
  double ratio = 0.0;                  // sys_len / ref_len (0 if ref_len == 0)
  size_t sys_len = 0, ref_len = 0;     // token counts after 13a tokenisation
  std::string signature;               // sacreBLEU-style reproducibility string

  // "BLEU = 34.21 70.1/45.2/30.3/20.1 (BP = 1.000 ratio = 1.002 hyp_len = 123 ref_len = 122)"
  std::string str() const;
};

// hyps[i] is scored against refs[i]. Throws std::invalid_argument (naming both
// sizes) when the vectors differ in length.
BleuResult corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs);

// The mteval-v13a tokenisation used by sacreBLEU's default "13a" tokenizer.
// Input is UTF-8; tokens are returned joined by single spaces.
std::string tokenize_13a(const std::string& line);

}  // namespace graft::text
