/// @file
/// The byte-level BPE tokenizer of GPT-2, Llama 3 and Qwen2, read from a Hugging Face
/// tokenizer.json and run as `tokenizers` runs it: added tokens split out first, the NFC
/// normaliser, the Split and ByteLevel pre-tokenizers (their regular expressions read from the
/// file and run by ICU), the BPE merges, a TemplateProcessing BOS, and the ByteLevel decoder. ICU's
/// headers stay out of this one (graft_text links ICU privately).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace graft::text {

/// A token of tokenizer.json's `added_tokens`: matched whole in the text before the model sees it.
struct BPEAddedToken {
  int64_t id = 0;            ///< its id
  std::string content;       ///< the text it matches
  bool special = false;      ///< dropped by decode(..., skip_special_tokens = true)
  bool lstrip = false;       ///< swallows the whitespace before it
  bool rstrip = false;       ///< swallows the whitespace after it
  bool single_word = false;  ///< matches only between word boundaries
  bool normalized = false;   ///< matched in the normalised text, else in the raw text
};

/// A byte-level BPE tokenizer (tokenizer.json's model "BPE" behind a ByteLevel pre-tokenizer).
/// Gives the same ids as `tokenizers` 0.23 on the tokenizer.json files of GPT-2, Llama 3 and Qwen2
/// style (tests/bpe_reference.sh). Immutable once loaded: encode and decode may run on several
/// threads at once.
class ByteLevelBPE {
 public:
  /// The largest tokenizer.json read: 128 MiB (Llama 3's is 9 MB).
  static constexpr uintmax_t kMaxFileBytes = uintmax_t(128) << 20;

  /// Reads a Hugging Face tokenizer.json.
  /// @throws graft::Error "ByteLevelBPE: '<path>': ..." for a missing, unreadable or oversized
  ///         file, bad JSON, and each field it does not support, naming the field's JSON path and
  ///         value: a model other than BPE, dropout, a continuing-subword prefix, an end-of-word
  ///         suffix, byte fallback, a merge whose parts or result are not in the vocabulary, a
  ///         vocabulary without the 256 byte tokens, a normalizer, pre-tokenizer, post-processor
  ///         or decoder of another type, an added token whose id disagrees with the vocabulary.
  static ByteLevelBPE from_tokenizer_json(const std::string& path);

  ~ByteLevelBPE();                                   ///< frees the compiled expressions
  ByteLevelBPE(ByteLevelBPE&&) noexcept;             ///< moves
  ByteLevelBPE& operator=(ByteLevelBPE&&) noexcept;  ///< moves
  ByteLevelBPE(const ByteLevelBPE&) = delete;  ///< not copyable: it owns compiled ICU expressions
  ByteLevelBPE& operator=(const ByteLevelBPE&) = delete;  ///< not copyable

  /// The ids of `utf8`; with `add_special_tokens`, the post-processor's template around them
  /// (Llama 3's BOS first).
  /// @throws graft::Error "ByteLevelBPE: the text is not valid UTF-8 at byte N (...)".
  std::vector<int64_t> encode(const std::string& utf8, bool add_special_tokens = true) const;
  /// The text of `ids`: each token's characters mapped back to their bytes, those read as UTF-8
  /// with each invalid sequence one U+FFFD (as `tokenizers` does); the special added tokens left
  /// out with `skip_special_tokens`.
  /// @throws graft::Error naming an id that has no token.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  /// The id of a token (of the model or an added one), or nothing.
  std::optional<int64_t> token_to_id(const std::string& token) const;
  /// The token of an id, as the vocabulary spells it (byte-level characters: "Ġthe").
  /// @throws graft::Error naming an id that has no token.
  const std::string& id_to_token(int64_t id) const;
  /// One more than the largest id, added tokens included.
  int64_t vocab_size() const { return vocab_size_; }
  /// The added tokens, in the file's order.
  const std::vector<BPEAddedToken>& added_tokens() const { return added_; }
  /// The ids of the special added tokens, ascending.
  std::vector<int64_t> special_ids() const;
  /// Whether `id` is a special added token's.
  bool is_special(int64_t id) const;
  /// The post-processor's ids before the text (Llama 3: BOS), added by encode(text, true).
  const std::vector<int64_t>& prefix_ids() const { return prefix_; }
  /// The post-processor's ids after the text, added by encode(text, true).
  const std::vector<int64_t>& suffix_ids() const { return suffix_; }
  /// The BOS id: the single id the template puts first, else nothing.
  std::optional<int64_t> bos_id() const;

  /// The bytes a token stands for (its characters through the byte table; a token with a
  /// character outside the table, such as an added token with a space, is its own UTF-8).
  /// @throws graft::Error naming an id that has no token.
  std::string token_bytes(int64_t id) const;

  /// The loaded model, normaliser and pre-tokenizer (defined in nn/text/bpe.cpp; opaque here).
  struct Impl;

 private:
  explicit ByteLevelBPE(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::vector<BPEAddedToken> added_;
  std::vector<int64_t> prefix_, suffix_;
  int64_t vocab_size_ = 0;
};

/// Decodes ids one at a time, for streaming a model's output: push() gives the text completed by
/// each id, holding back the bytes of a UTF-8 character that a later token may finish. The texts
/// of all push() calls and finish() together equal ByteLevelBPE::decode of all the ids.
class BPEStreamDecoder {
 public:
  /// A decoder over `tokenizer`, which must outlive it.
  explicit BPEStreamDecoder(const ByteLevelBPE& tokenizer, bool skip_special_tokens = false);
  /// The text that `id` completes (maybe empty).
  /// @throws graft::Error naming an id that has no token.
  std::string push(int64_t id);
  /// The text of the bytes still held back (each incomplete sequence one U+FFFD); the decoder is
  /// then empty again.
  std::string finish();
  /// The bytes held back: the start of a UTF-8 character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const ByteLevelBPE* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

/// `bytes` as UTF-8 with each maximal invalid subsequence replaced by U+FFFD (Unicode's
/// "substitution of maximal subparts", as Rust's String::from_utf8_lossy and Python's
/// errors="replace" do).
std::string utf8_lossy(const std::string& bytes);

}  // namespace graft::text
