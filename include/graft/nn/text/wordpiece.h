/// @file
/// BERT's WordPiece tokenizer, as Hugging Face `tokenizers` runs it for a BERT tokenizer.json
/// (BertNormalizer, BertPreTokenizer, the WordPiece model, the [CLS] ... [SEP] template), so that a
/// pretrained BERT encoder sees the ids it was trained on. The character classes come from ICU;
/// its headers stay out of this one (a static graft links libicuuc into the program).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace graft::text {

/// What BertNormalizer does to the text and which tokens are special (tokenizer.json's
/// `normalizer`, `model` and `added_tokens`; a vocab.txt's tokenizer_config.json).
struct WordPieceOptions {
  bool clean_text = true;            ///< drop NUL, U+FFFD and control chars; whitespace -> ' '
  bool handle_chinese_chars = true;  ///< spaces around CJK ideographs
  std::optional<bool>
      strip_accents;      ///< NFD, then drop nonspacing marks; unset: follows lowercase (as BERT)
  bool lowercase = true;  ///< full Unicode lowercasing, one character at a time
  std::string unk_token = "[UNK]";         ///< a word with no pieces, or too long
  std::string cls_token = "[CLS]";         ///< first of a sequence (encode_with_specials)
  std::string sep_token = "[SEP]";         ///< last of a sequence (encode_with_specials)
  std::string pad_token = "[PAD]";         ///< padding, for the model's batches
  std::string continuing_prefix = "##";    ///< marks a piece that continues a word
  int64_t max_input_chars_per_word = 100;  ///< a longer word (code points) is one unk_token
  /// The tokens matched whole in the raw text before normalisation (tokenizers' added tokens,
  /// transformers' never-split tokens): "a [SEP]b" has the separator's id in its middle. Unset:
  /// pad, unk, cls and sep, and "[MASK]" when the vocabulary has it. Each must be in the
  /// vocabulary.
  std::optional<std::vector<std::string>> added_tokens;
};

/// A WordPiece vocabulary (id = index) with BERT's normalisation and pre-tokenization. Gives the
/// same ids as `tokenizers` 0.23 on a BERT tokenizer.json, character classes included: like
/// `tokenizers`, control characters, punctuation and nonspacing marks are those of Unicode 8.0.
class WordPiece {
 public:
  /// The largest tokenizer.json, vocab.txt or tokenizer_config.json read: 64 MiB.
  static constexpr uintmax_t kMaxFileBytes = uintmax_t(64) << 20;

  /// A tokenizer over `vocab`, each token's id its index.
  /// @throws graft::Error "WordPiece: ..." for a vocabulary without the unknown, classifier,
  ///         separator or padding token (naming it), a repeated or empty token (naming its ids),
  ///         an added token not in the vocabulary, or max_input_chars_per_word < 1.
  WordPiece(std::vector<std::string> vocab, WordPieceOptions options);

  /// Reads a Hugging Face tokenizer.json: the WordPiece model and its vocabulary, the
  /// BertNormalizer (or none), the BertPreTokenizer, the [CLS]/[SEP] of its post-processor, the pad
  /// token of its padding and its added tokens.
  /// @throws graft::Error "WordPiece: '<path>': ..." for a missing or unreadable file, bad JSON, a
  ///         model, normalizer, pre-tokenizer or post-processor of another type (naming it), an
  ///         added token that strips spaces, matches single words or is normalised, or a
  ///         vocabulary the constructor refuses.
  static WordPiece from_tokenizer_json(const std::string& path);
  /// Reads a vocab.txt: one token a line, the id its line's index (from 0); a carriage return
  /// ending a line is dropped.
  /// @throws graft::Error "WordPiece: '<path>': ..." for a missing or unreadable file, a line that
  ///         is not UTF-8 or a vocabulary the constructor refuses (naming the lines).
  static WordPiece from_vocab_txt(const std::string& path, WordPieceOptions options);
  /// dir/tokenizer.json when present, else dir/vocab.txt with tokenizer_config.json's
  /// do_lower_case, strip_accents, tokenize_chinese_chars and special tokens when that is there.
  /// @throws graft::Error "WordPiece: '<dir>': ..." when neither file is there; the errors of the
  ///         reader it calls.
  static WordPiece from_directory(const std::string& dir);

  /// The text as BertNormalizer leaves it (no added-token matching).
  /// @throws graft::Error naming the byte offset of invalid UTF-8.
  std::string normalize(const std::string& utf8) const;
  /// The words WordPiece sees: the added tokens found whole, the rest normalised and split at
  /// whitespace, each punctuation character a word of its own.
  /// @throws graft::Error naming the byte offset of invalid UTF-8.
  std::vector<std::string> basic_tokenize(const std::string& utf8) const;
  /// The ids of the word pieces, no specials added.
  /// @throws graft::Error naming the byte offset of invalid UTF-8.
  std::vector<int64_t> encode(const std::string& utf8) const;
  /// encode(), adding to `steps` the steps of its matching loops: one per automaton transition
  /// while finding the added tokens (at most 2 per byte of the text) and while finding the
  /// pieces of a word (at most 3 per byte of the normalised word), so at most 5 per byte where
  /// normalisation does not lengthen the text (NFD lengthens UTF-8 at most 3 times), whatever
  /// the number of added tokens, the longest token or max_input_chars_per_word. Tests bound the
  /// work with it.
  /// @throws graft::Error naming the byte offset of invalid UTF-8.
  std::vector<int64_t> encode(const std::string& utf8, int64_t& steps) const;
  /// [CLS] pieces [SEP], the pieces truncated so that the whole is at most max_len ids (max_len >=
  /// 2)
  /// @throws graft::Error for max_len < 2, or naming the byte offset of invalid UTF-8.
  std::vector<int64_t> encode_with_specials(const std::string& utf8, int64_t max_len) const;

  /// The id of a token.
  /// @throws graft::Error naming the token when it is not in the vocabulary.
  int64_t id(const std::string& token) const;
  /// The token of an id.
  /// @throws graft::Error for an id outside [0, size()).
  const std::string& token(int64_t id) const;
  /// The number of tokens.
  int64_t size() const { return (int64_t)vocab_.size(); }
  int64_t unk_id() const { return unk_; }  ///< the unknown token's id
  int64_t cls_id() const { return cls_; }  ///< the classifier token's id, first of a sequence
  int64_t sep_id() const { return sep_; }  ///< the separator token's id, last of a sequence
  int64_t pad_id() const { return pad_; }  ///< the padding token's id
  /// The options it was made with.
  const WordPieceOptions& options() const { return options_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  /// A trie over byte strings; node 0 is the root.
  struct ByteTrie {
    std::unordered_map<uint64_t, int32_t> edges;  ///< node * 256 + byte -> child
    std::vector<int64_t> value{-1};               ///< the id of the key ending at a node, or -1
    std::vector<int32_t> parent{-1}, depth{0};    ///< for building an automaton over it
    std::vector<unsigned char> byte{0};           ///< the byte of the edge into a node
    /// The child of node along byte b, or -1.
    int32_t child(int32_t node, unsigned char b) const {
      const auto it = edges.find(uint64_t(node) * 256 + b);
      return it == edges.end() ? -1 : it->second;
    }
    void insert(std::string_view key, int64_t id);
  };
  /// Aho-Corasick over keys reversed: run over a text backwards, it gives at each byte the
  /// longest key that starts there, in one pass of at most 2 steps a byte.
  struct LongestMatcher {
    ByteTrie trie;                 ///< the keys reversed
    std::vector<int32_t> fail;     ///< the longest proper suffix of a node's string in the trie
    std::vector<int32_t> longest;  ///< the node of the longest key that is a suffix, or -1
    void insert(std::string_view key, int64_t id);
    void build();
    /// out[i]: the trie node of the longest key starting at text[i], or -1.
    void longest_at(std::string_view text, std::vector<int32_t>& out, int64_t& steps) const;
    /// The key's bytes and id of a node longest_at() gave.
    size_t length(int32_t node) const { return (size_t)trie.depth[(size_t)node]; }
    int64_t id(int32_t node) const { return trie.value[(size_t)node]; }
  };
  int64_t find_required(const std::string& token, const char* what) const;
  void append_normalized(std::u32string_view text, std::u32string& out) const;
  void split_words(std::u32string_view text, std::vector<std::string>& words) const;
  void append_pieces(std::string_view word, std::vector<int64_t>& ids, int64_t& steps,
                     std::vector<int32_t>& scratch) const;
  /// Calls on_word for each word of text, in order, and on_added for each added token's id.
  template <class OnWord, class OnAdded>
  void for_each_word(const std::string& utf8, OnWord&& on_word, OnAdded&& on_added,
                     int64_t& steps) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> ids_;
  WordPieceOptions options_;
  bool strip_accents_ = true;
  int64_t unk_ = 0, cls_ = 0, sep_ = 0, pad_ = 0;
  ByteTrie word_start_;               ///< every token, for a word's first piece
  LongestMatcher word_continuation_;  ///< the tokens with the continuing prefix, without it
  LongestMatcher added_;              ///< the added tokens
  bool has_added_ = false;            ///< whether there are any
};

}  // namespace graft::text
