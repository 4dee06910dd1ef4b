/// @file
/// The SentencePiece tokenizer of Llama 2, TinyLlama and Mistral v0.1 checkpoints (their
/// `tokenizer.model`), run by libsentencepiece as transformers' LlamaTokenizer runs it: the
/// SentencePiece ids of the text with the BOS the checkpoint asks for, and decoding that drops the
/// special tokens and turns byte-fallback pieces back into bytes. SentencePiece's headers stay out
/// of this one (pimpl), as in text::Tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace graft::text {

/// A SentencePiece model with the Llama conventions: the model's own ids (`<unk>` 0, `<s>` 1,
/// `</s>` 2 in Llama's files, read from the model, not assumed), a BOS before the text unless
/// tokenizer_config.json's `add_bos_token` is false, an EOS after it when `add_eos_token` is true.
/// Any SentencePiece model loads (BPE as Llama's, unigram too); what SentencePiece does to the text
/// (Llama's: a "▁" before it, each space a "▁", digits split, characters outside the vocabulary
/// as `<0xNN>` byte pieces) comes from the model file. The text is taken as it is: `<s>` written
/// in the text is not the BOS token (SentencePiece's rule; transformers' fast tokenizer splits it
/// out). Immutable once loaded: encode and decode may run on several threads at once.
class LlamaTokenizer {
 public:
  /// Loads the SentencePiece model at `model_path` (a regular file of at most
  /// Tokenizer::kMaxModelBytes).
  /// @param model_path the tokenizer.model file
  /// @param add_bos encode() puts the BOS first
  /// @param add_eos encode() puts the EOS last
  /// @throws graft::Error "LlamaTokenizer: '<path>' ..." for a missing file, a device or a pipe, an
  ///         oversized file, a file SentencePiece cannot read as a model, a model without a BOS or
  ///         EOS piece (when asked to add it), and a model whose decoding this class cannot
  ///         follow piece by piece (a denormaliser that rewrites a piece).
  explicit LlamaTokenizer(const std::string& model_path, bool add_bos = true, bool add_eos = false);
  /// The tokenizer of a Hugging Face directory: DIR/tokenizer.model, with `add_bos_token` and
  /// `add_eos_token` from DIR/tokenizer_config.json when it has them (else true and false, as
  /// transformers' LlamaTokenizer), checked against DIR/config.json's `vocab_size` when present.
  /// @throws graft::Error naming the file: as the constructor; tokenizer_config.json or
  ///         config.json not JSON objects, `add_bos_token`/`add_eos_token` not booleans,
  ///         `vocab_size` not a positive integer or smaller than the tokenizer's vocabulary (its
  ///         ids would fall outside the model's embedding).
  static LlamaTokenizer from_hf_dir(const std::string& dir);

  ~LlamaTokenizer();
  /// Moves the loaded model; the source is left empty.
  LlamaTokenizer(LlamaTokenizer&&) noexcept;
  /// Moves the loaded model; the source is left empty.
  LlamaTokenizer& operator=(LlamaTokenizer&&) noexcept;

  /// The ids of `text` (SentencePiece's), the BOS first and the EOS last as configured.
  /// @throws graft::Error "LlamaTokenizer::encode: ..." when SentencePiece fails.
  std::vector<int64_t> encode(const std::string& text) const;
  /// The text of `ids` with the special tokens (`<s>`, `</s>`, `<unk>`: SentencePiece's control
  /// and unknown pieces) left out, then SentencePiece's decoding of the rest: "▁" read as a space,
  /// the first piece's leading "▁" dropped (the prefix encode adds), each run of `<0xNN>` pieces
  /// read as UTF-8 with each byte that does not start a well-formed character one U+FFFD (as
  /// transformers' LlamaTokenizer, which calls SentencePiece, gives it).
  /// @throws graft::Error naming an id outside [0, vocab_size()).
  std::string decode(const std::vector<int64_t>& ids) const;

  /// The number of pieces: ids are in [0, vocab_size()).
  int64_t vocab_size() const;
  /// The piece of an id as the model spells it ("▁the", "<0x0A>", "<s>").
  /// @throws graft::Error naming an id outside [0, vocab_size()).
  std::string piece(int64_t id) const;
  /// Whether `id` is a special token (control or unknown), which decode() leaves out.
  /// @throws graft::Error naming an id outside [0, vocab_size()).
  bool is_special(int64_t id) const;
  /// Whether `id` is a byte-fallback piece `<0xNN>`.
  /// @throws graft::Error naming an id outside [0, vocab_size()).
  bool is_byte(int64_t id) const;
  /// The ids of `<s>`, `</s>` and `<unk>` (-1 when the model has none).
  ///@{
  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t unk_id() const;
  ///@}
  /// Whether encode() adds the BOS and the EOS.
  ///@{
  bool adds_bos() const { return add_bos_; }
  bool adds_eos() const { return add_eos_; }
  ///@}
  /// Whether decode() drops the leading "▁" of the first piece (the model's add_dummy_prefix).
  bool strips_first_space() const { return strip_first_space_; }

  /// The loaded SentencePiece model (defined in nn/text/llama_tokenizer.cpp; opaque here).
  struct Impl;

 private:
  friend class LlamaStreamDecoder;
  std::unique_ptr<Impl> impl_;
  bool add_bos_ = true, add_eos_ = false, strip_first_space_ = true;
};

/// Decodes ids one at a time, for streaming a model's output: push() gives the text each id makes
/// final, holding back the bytes of a byte-fallback character that later `<0xNN>` pieces may
/// finish. After ids[0..n) the texts given so far are decode(ids[0..n)) less at most the held-back
/// bytes' text, and with finish() they are exactly decode(ids[0..n)); the first piece's leading
/// space is dropped as decode() drops it. To print a continuation of a prompt, push the prompt's
/// ids first and leave their text out: the continuation's first space is then kept.
class LlamaStreamDecoder {
 public:
  /// A decoder over `tokenizer`, which must outlive it.
  explicit LlamaStreamDecoder(const LlamaTokenizer& tokenizer);
  /// The text that `id` completes (maybe empty); a special token gives nothing.
  /// @throws graft::Error naming an id outside [0, vocab_size()).
  std::string push(int64_t id);
  /// The text of the bytes still held back (each one U+FFFD); the decoder then goes on as if the
  /// run of byte pieces had ended.
  std::string finish();
  /// The bytes held back: the start of a UTF-8 character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string flush_bytes();
  const LlamaTokenizer* tokenizer_;
  std::string pending_;       // bytes of byte pieces not yet given out
  bool any_text_ = false;     // some text has been given out (or is held back)
  bool bos_ws_seen_ = false;  // the first piece's "▁" has been dropped
};

}  // namespace graft::text
