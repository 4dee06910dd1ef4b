#include "graft/nn/text/tokenizer.h"

#include "graft/autograd/tensor.h"
#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint.h"
#include "spm_file.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <stdexcept>
#include <unordered_map>

namespace graft::text {
namespace {

// Feeds training sentences straight from memory, which avoids a temporary
// file and any question of where it may be written or who deletes it.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

// <prefix>.model (the serialized model) and <prefix>.vocab (piece<TAB>score per line, as
// SentencePiece writes it), each written atomically.
void write_model(const std::string& proto, const std::string& prefix) {
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.LoadFromSerializedProto(proto);
  if (!status.ok()) fail("Tokenizer::train: '" + prefix + "': " + status.ToString());
  train::atomic_write(prefix + ".model", [&](std::ostream& os) {
    os.write(proto.data(), (std::streamsize)proto.size());
  });
  train::atomic_write(prefix + ".vocab", [&](std::ostream& os) {
    for (int i = 0; i < sp.GetPieceSize(); ++i)
      os << sp.IdToPiece(i) << '\t' << sp.GetScore(i) << '\n';
  });
}

}  // namespace

// SentencePiece reads the whole file: refuse a device or a pipe (whose reading may never end), or
// a file far larger than any model, before it does. A missing path is left to SentencePiece.
void detail::check_model_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st) || fs::is_directory(st)) return;
  const std::string file = "Tokenizer: '" + printable(path) + "'";
  if (!fs::is_regular_file(st)) fail(file + " is not a regular file (a device or a pipe)");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail(file + ": cannot read its size: " + ec.message());
  if (size > Tokenizer::kMaxModelBytes)
    fail(file + " is " + std::to_string(size) + " bytes, over the limit of " +
         std::to_string(Tokenizer::kMaxModelBytes) + " bytes for a tokenizer model");
}

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

void Tokenizer::train(const std::vector<std::string>& sentences, const std::string& model_prefix,
                      int vocab_size, ModelType type) {
  if (sentences.empty()) fail("Tokenizer::train: no sentences");
  if (vocab_size <= 4) {
    fail("Tokenizer::train: vocab_size " + std::to_string(vocab_size) +
         " leaves no room beyond the 4 special tokens");
  }
  // The model is trained into memory (no model_prefix) and written here, so the file does not
  // depend on where it goes: SentencePiece stores its trainer options in the model, model_prefix
  // included, and two runs into different directories would write different bytes. With all the
  // sentences (no sampling: input_sentence_size 0), in their order, and a fixed thread count (the
  // E-step's per-thread sums are added in thread order), the bytes are the same on every run.
  const std::unordered_map<std::string, std::string> args = {
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", type == ModelType::Bpe ? "bpe" : "unigram"},
      {"pad_id", std::to_string(PAD)},
      {"unk_id", std::to_string(UNK)},
      {"bos_id", std::to_string(BOS)},
      {"eos_id", std::to_string(EOS)},
      // Every character seen in training gets a piece, so umlauts etc. never
      // decode to <unk> -- the corpora here are small enough to afford it.
      {"character_coverage", "1.0"},
      // Without this, a small corpus whose pieces cannot reach vocab_size
      // makes training fail instead of producing a smaller vocabulary.
      {"hard_vocab_limit", "false"},
      {"num_threads", "2"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"minloglevel", "2"},
  };
  VectorIterator it(sentences);
  std::string proto;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  if (!status.ok()) {
    fail("Tokenizer::train: failed for '" + model_prefix + "': " + status.ToString());
  }
  write_model(proto, model_prefix);
}

Tokenizer::Tokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()) {
  detail::check_model_file(model_path);
  const auto status = impl_->sp.Load(model_path);
  if (!status.ok()) {
    fail("Tokenizer: cannot load model '" + model_path + "': " + status.ToString());
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) fail("Tokenizer::encode: " + status.ToString());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  const int n = vocab_size();
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (int id : ids) {
    if (id < 0 || id >= n) {
      fail("Tokenizer::decode: id " + std::to_string(id) + " outside vocabulary of " +
           std::to_string(n));
    }
    if (id != PAD && id != BOS && id != EOS) kept.push_back(id);
  }
  std::string text;
  const auto status = impl_->sp.Decode(kept, &text);
  if (!status.ok()) fail("Tokenizer::decode: " + status.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

std::string Tokenizer::piece(int id) const {
  if (id < 0 || id >= vocab_size()) {
    fail("Tokenizer::piece: id " + std::to_string(id) + " outside vocabulary of " +
         std::to_string(vocab_size()));
  }
  return impl_->sp.IdToPiece(id);
}

}  // namespace graft::text
