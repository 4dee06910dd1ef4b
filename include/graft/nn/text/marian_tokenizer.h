/// @file
/// The tokenizer of Hugging Face Marian (Opus-MT) directories, as transformers' MarianTokenizer:
/// SentencePiece models source.spm and target.spm whose pieces are mapped to the model's ids by
/// vocab.json (the SentencePiece ids are not the model's). SentencePiece's headers stay out of
/// this one (pimpl), as in text::Tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace graft::text {

/// A Marian tokenizer: encode() = an optional leading language code (">>fr<<", kept as its own
/// token), the source.spm pieces of the rest, each piece's vocab.json id (`<unk>`'s when it has
/// none), then `</s>`; decode() = the pieces of the ids that are not special (`</s>`, `<unk>`,
/// `<pad>`) joined by target.spm, "▁" read as a space, trimmed. Moses punctuation
/// normalisation (sacremoses, optional in transformers too) is not applied.
class MarianTokenizer {
 public:
  /// Loads DIR/source.spm, DIR/target.spm (regular files of at most Tokenizer::kMaxModelBytes)
  /// and DIR/vocab.json; DIR/tokenizer_config.json, when present, must not ask for separate
  /// vocabularies.
  /// @throws graft::Error naming the file: a model SentencePiece cannot load, a vocab.json that
  ///         is not an object of piece -> id in [0, 2^31) with each id once, without `</s>`,
  ///         `<unk>` or `<pad>`, or `separate_vocabs` true.
  explicit MarianTokenizer(const std::string& dir);
  ~MarianTokenizer();
  /// Moves the loaded models; the source is left empty.
  MarianTokenizer(MarianTokenizer&&) noexcept;
  /// Moves the loaded models; the source is left empty.
  MarianTokenizer& operator=(MarianTokenizer&&) noexcept;

  /// The model ids of text, `</s>` last.
  /// @throws graft::Error when SentencePiece fails.
  std::vector<int64_t> encode(const std::string& text) const;
  /// The text of ids, the special tokens dropped.
  /// @throws graft::Error for an id vocab.json does not hold.
  std::string decode(const std::vector<int64_t>& ids) const;
  /// The special tokens' ids in vocab.json.
  ///@{
  int64_t eos_id() const;
  int64_t unk_id() const;
  int64_t pad_id() const;
  ///@}
  /// One more than the largest id of vocab.json.
  int64_t vocab_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace graft::text
