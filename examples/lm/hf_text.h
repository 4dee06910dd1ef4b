// lm generate --hf's text side: the tokenizer of a Hugging Face directory, whichever of the two
// kinds it ships (docs/hub-models.md#tokenizers), behind one encode, decode and stream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graft/nn/text/bpe.h"
#include "graft/nn/text/llama_tokenizer.h"

namespace graft::lm {

// DIR/tokenizer.json when it is a byte-level BPE (GPT-2, Llama 3, Qwen2), else DIR/tokenizer.model
// (SentencePiece: Llama 2, TinyLlama, Mistral v0.1).
class HfText {
 public:
  // Throws naming both files, with each one's cause, when neither loads.
  static HfText load(const std::string& dir);

  // The prompt's ids with the tokenizer's BOS (a byte-level BPE's template).
  std::vector<int64_t> encode(const std::string& text) const;
  // Which file was read.
  const std::string& source() const { return source_; }

  // Prints a continuation as ids come: the prompt's ids are taken first (their text is already
  // printed), so that the continuation's first space is right; push() then gives the text each
  // new id makes final, finish() the rest.
  class Stream {
   public:
    Stream(const HfText& text, const std::vector<int64_t>& prompt);
    std::string push(int64_t id);
    std::string finish();

   private:
    std::optional<text::BPEStreamDecoder> bpe_;
    std::optional<text::LlamaStreamDecoder> spm_;
  };

 private:
  std::optional<text::ByteLevelBPE> bpe_;
  std::optional<text::LlamaTokenizer> spm_;
  std::string source_;
};

}  // namespace graft::lm
