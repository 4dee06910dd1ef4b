// Fuzz target: the BLEU tokenizer and scorer on arbitrary bytes (hypothesis and reference lines
// separated by a NUL byte). Scores stay within [0, 100] and never crash on invalid UTF-8.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "examples/translation/bleu.h"

using namespace graft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\0');
  const std::string hyp_text = in.substr(0, cut),
                    ref_text = cut == std::string::npos ? in : in.substr(cut + 1);
  auto lines = [](const std::string& s) {
    std::vector<std::string> out(1);
    for (char c : s)
      if (c == '\n') out.emplace_back();
      else out.back().push_back(c);
    return out;
  };
  std::vector<std::string> hyps = lines(hyp_text), refs = lines(ref_text);
  refs.resize(hyps.size());
  for (auto& h : hyps) (void)text::tokenize_13a(h);
  const auto r = text::corpus_bleu(hyps, refs);
  if (!(r.score >= 0 && r.score <= 100.0 + 1e-9)) __builtin_trap();
  return 0;
}
