// Subword tokenizer for the translation example: a thin wrapper over
// SentencePiece with graft's fixed special-token ids. SentencePiece headers
// stay out of this header (pimpl) so users need only -lsentencepiece at link.
#pragma once

#include <memory>
#include <cstdint>
#include <string>
#include <vector>

namespace graft::text {

class Tokenizer {
 public:
  // Fixed so that embedding/padding code can rely on them without a model.
  static constexpr int PAD = 0, UNK = 1, BOS = 2, EOS = 3;

  enum class ModelType { Unigram, Bpe };

  // Trains one model shared by source and target (pass both sides' sentences)
  // and writes <model_prefix>.model and <model_prefix>.vocab. Deterministic:
  // the same sentences give the same bytes, whatever the prefix (directory). vocab_size is a soft limit so that tiny corpora that
  // cannot reach it still train. Throws std::runtime_error on failure and
  // std::invalid_argument for an empty sentence list or vocab_size <= 4.
  static void train(const std::vector<std::string>& sentences, const std::string& model_prefix,
                    int vocab_size, ModelType type = ModelType::Unigram);

  // Throws std::runtime_error naming the path if the model cannot be loaded.
  static constexpr uintmax_t kMaxModelBytes = uintmax_t(64) << 20;
  // Loads a SentencePiece model (at most kMaxModelBytes); errors name the file.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int> encode(const std::string& text) const;  // no BOS/EOS added
  // PAD, BOS and EOS are dropped so raw decoder output can be passed as is.
  // Throws std::out_of_range for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int>& ids) const;
  int vocab_size() const;
  std::string piece(int id) const;  // throws std::out_of_range

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace graft::text
