#include "examples/lm/hf_text.h"

#include <filesystem>
#include <stdexcept>

namespace graft::lm {

namespace {

// The message of what `load` throws, or "" when it loads.
template <class F>
std::string error_of(F&& load) {
  try {
    load();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

HfText HfText::load(const std::string& dir) {
  HfText t;
  const std::string json = dir + "/tokenizer.json", model = dir + "/tokenizer.model";
  const std::string bpe_error = error_of([&] {
    t.bpe_.emplace(text::ByteLevelBPE::from_tokenizer_json(json));
    t.source_ = json;
  });
  if (bpe_error.empty()) return t;
  const std::string spm_error = error_of([&] {
    t.spm_.emplace(text::LlamaTokenizer::from_hf_dir(dir));
    t.source_ = model;
  });
  if (spm_error.empty()) return t;
  throw std::runtime_error("--hf: no tokenizer for --prompt in '" + dir +
                           "': neither tokenizer.json (a byte-level BPE) nor tokenizer.model "
                           "(SentencePiece) loads: " +
                           bpe_error + "; " + spm_error);
}

std::vector<int64_t> HfText::encode(const std::string& text) const {
  return bpe_ ? bpe_->encode(text, /*add_special_tokens=*/true) : spm_->encode(text);
}

HfText::Stream::Stream(const HfText& text, const std::vector<int64_t>& prompt) {
  if (text.bpe_) {
    bpe_.emplace(*text.bpe_, /*skip_special_tokens=*/true);
    return;  // a byte-level token's text does not depend on the tokens before it
  }
  spm_.emplace(*text.spm_);
  for (const int64_t id : prompt) spm_->push(id);
}

std::string HfText::Stream::push(int64_t id) { return bpe_ ? bpe_->push(id) : spm_->push(id); }

std::string HfText::Stream::finish() { return bpe_ ? bpe_->finish() : spm_->finish(); }

}  // namespace graft::lm
