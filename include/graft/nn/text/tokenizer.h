/// @file
/// A subword tokenizer: a thin wrapper over SentencePiece with graft's fixed special-token ids.
/// SentencePiece's headers stay out of this one (pimpl): a program using a shared graft needs
/// nothing more; a static graft links libsentencepiece and libsentencepiece_train into it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace graft::text {

/// A SentencePiece model (unigram or BPE) trained or loaded, with PAD, UNK, BOS and EOS at the
/// fixed ids 0..3.
class Tokenizer {
 public:
  // The special-token ids, fixed so that embedding and padding code can rely on them without a
  // model.
  static constexpr int PAD = 0;  ///< padding, "<pad>"
  static constexpr int UNK = 1;  ///< an unknown piece, "<unk>"
  static constexpr int BOS = 2;  ///< beginning of a sequence, "<s>"
  static constexpr int EOS = 3;  ///< end of a sequence, "</s>"

  /// The SentencePiece model kind.
  enum class ModelType { Unigram, Bpe };

  /// Trains one model (pass source and target sentences together for a shared vocabulary) in
  /// memory and writes `model_prefix + ".model"` and `model_prefix + ".vocab"`, each atomically.
  /// Deterministic: the same sentences give the same bytes, whatever the prefix (directory).
  /// vocab_size is a soft limit, so that tiny corpora that cannot reach it still train.
  /// @throws graft::Error for an empty sentence list or vocab_size <= 4,
  ///         when SentencePiece fails, or when a file cannot be
  /// written.
  static void train(const std::vector<std::string>& sentences, const std::string& model_prefix,
                    int vocab_size, ModelType type = ModelType::Unigram);

  /// The largest model file the constructor reads: 64 MiB.
  static constexpr uintmax_t kMaxModelBytes = uintmax_t(64) << 20;
  /// Loads a SentencePiece model file (a regular file of at most kMaxModelBytes).
  /// @throws graft::Error "Tokenizer: '<path>' ..." for a device, a pipe or an oversized file;
  ///         std::runtime_error naming the path when the model cannot be loaded.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  /// Moves the loaded model; the source is left empty.
  Tokenizer(Tokenizer&&) noexcept;
  /// Moves the loaded model; the source is left empty.
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// The ids of text's pieces, no BOS/EOS added.
  /// @throws graft::Error when SentencePiece fails.
  std::vector<int> encode(const std::string& text) const;
  /// The text of ids; PAD, BOS and EOS are dropped, so raw decoder output can be passed as is.
  /// @throws graft::Error for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int>& ids) const;
  /// The number of pieces, special tokens included.
  int vocab_size() const;
  /// The piece of one id, e.g. "<pad>" for PAD.
  /// @throws graft::Error for an id outside [0, vocab_size()).
  std::string piece(int id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace graft::text
