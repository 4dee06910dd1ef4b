// Fuzz target: any bytes as a parallel corpus (translate) and as a labelled TSV (classify).
// Every line lands in exactly one bucket; kept pairs are UTF-8 with no tab and no outer space.
#include <cstdint>
#include <string>

#include "examples/classify/classify.h"
#include "examples/translation/corpus.h"
#include "fuzz/fuzz_util.h"
#include "graft/autograd/text.h"

using namespace graft;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_temp("tsv", data, size);
  text::CorpusStats st;
  const auto pairs = text::read_tsv(path, st, 1000, 200);
  if (st.read != st.kept + st.empty + st.malformed + st.bad_utf8 + st.too_long ||
      pairs.size() != st.kept)
    __builtin_trap();
  for (auto& p : pairs)
    if (p.src.empty() || p.tgt.empty() || !text::valid_utf8(p.src) ||
        p.src.find('\t') != std::string::npos)
      __builtin_trap();
  try {
    for (auto& e : classify::read_tsv(path))
      if (e.label.empty() || e.text.empty() || (int64_t)e.text.size() > classify::kMaxBytes)
        __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
