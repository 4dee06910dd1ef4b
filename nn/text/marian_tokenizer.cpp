#include "graft/nn/text/marian_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <map>

#include "graft/autograd/tensor.h"
#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint.h"
#include "spm_file.h"

namespace graft::text {

namespace {

// vocab.json both ways, and the special tokens.
struct MarianVocab {
  std::map<std::string, int64_t> ids;  // piece -> id
  std::vector<std::string> pieces;     // id -> piece ("" for an id vocab.json lacks)
  std::vector<bool> special;           // id -> </s>, <unk> or <pad>
  int64_t eos = 0, unk = 0, pad = 0;
};

void load_spm(sentencepiece::SentencePieceProcessor& sp, const std::string& path) {
  detail::check_model_file(path);
  const auto status = sp.Load(path);
  if (!status.ok()) fail("MarianTokenizer: cannot load model '" + path + "': " + status.ToString());
}

int64_t special_id(const std::map<std::string, int64_t>& ids, const std::string& piece,
                   const std::string& path) {
  auto it = ids.find(piece);
  if (it == ids.end()) fail("MarianTokenizer: '" + path + "' has no " + piece + " token");
  return it->second;
}

// vocab.json: piece -> id, each id once, in [0, 2^31).
MarianVocab load_vocab(const std::string& path) {
  MarianVocab m;
  const nlohmann::json j = train::load_json(path);
  if (!j.is_object()) fail("MarianTokenizer: '" + path + "' is not a JSON object (piece -> id)");
  for (const auto& [piece, v] : j.items()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (int64_t(1) << 31))
      fail("MarianTokenizer: '" + path + "': the id of piece '" + printable(piece) +
           "' is not an integer in [0, 2^31)");
    const int64_t id = v.get<int64_t>();
    if (id >= (int64_t)m.pieces.size()) m.pieces.resize(id + 1);
    if (!m.pieces[id].empty())
      fail("MarianTokenizer: '" + path + "': id " + std::to_string(id) + " is given to '" +
           printable(m.pieces[id]) + "' and to '" + printable(piece) + "'");
    m.pieces[id] = piece;
    m.ids[piece] = id;
  }
  m.eos = special_id(m.ids, "</s>", path);
  m.unk = special_id(m.ids, "<unk>", path);
  m.pad = special_id(m.ids, "<pad>", path);
  m.special.assign(m.pieces.size(), false);
  m.special[m.eos] = m.special[m.unk] = m.special[m.pad] = true;
  return m;
}

void check_shared_vocab(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  const nlohmann::json j = train::load_json(path);
  if (j.is_object() && j.contains("separate_vocabs") && j["separate_vocabs"] == true)
    fail("MarianTokenizer: '" + path +
         "': separate_vocabs is true (target_vocab.json): not supported");
}

}  // namespace

struct MarianTokenizer::Impl {
  sentencepiece::SentencePieceProcessor source, target;
  MarianVocab v;
};

MarianTokenizer::MarianTokenizer(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  check_shared_vocab(dir + "/tokenizer_config.json");
  load_spm(impl_->source, dir + "/source.spm");
  load_spm(impl_->target, dir + "/target.spm");
  impl_->v = load_vocab(dir + "/vocab.json");
}

MarianTokenizer::~MarianTokenizer() = default;
MarianTokenizer::MarianTokenizer(MarianTokenizer&&) noexcept = default;
MarianTokenizer& MarianTokenizer::operator=(MarianTokenizer&&) noexcept = default;

// transformers' remove_language_code: a text starting with ">>" up to the first "<<" is a code.
std::vector<int64_t> MarianTokenizer::encode(const std::string& text) const {
  std::vector<std::string> pieces;
  std::string rest = text;
  const size_t end = text.rfind(">>", 0) == 0 ? text.find("<<") : std::string::npos;
  if (end != std::string::npos) {
    pieces.push_back(text.substr(0, end + 2));
    rest = text.substr(end + 2);
  }
  std::vector<std::string> sp;
  const auto status = impl_->source.Encode(rest, &sp);
  if (!status.ok()) fail("MarianTokenizer::encode: " + status.ToString());
  pieces.insert(pieces.end(), sp.begin(), sp.end());
  std::vector<int64_t> ids;
  for (const std::string& p : pieces) {
    auto it = impl_->v.ids.find(p);
    ids.push_back(it == impl_->v.ids.end() ? impl_->v.unk : it->second);
  }
  ids.push_back(impl_->v.eos);
  return ids;
}

std::string MarianTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> pieces;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || impl_->v.pieces[id].empty())
      fail("MarianTokenizer::decode: id " + std::to_string(id) + " is not in vocab.json");
    if (!impl_->v.special[id]) pieces.push_back(impl_->v.pieces[id]);
  }
  std::string text;
  const auto status = impl_->target.Decode(pieces, &text);
  if (!status.ok()) fail("MarianTokenizer::decode: " + status.ToString());
  std::string spaced;  // "\xe2\x96\x81" (U+2581, SentencePiece's space) read as a space
  for (size_t i = 0; i < text.size(); ++i) {
    const bool mark = text.compare(i, 3, "\xe2\x96\x81") == 0;
    spaced += mark ? ' ' : text[i];
    if (mark) i += 2;
  }
  text = spaced;
  const size_t b = text.find_first_not_of(" \t\n\r\f\v"), e = text.find_last_not_of(" \t\n\r\f\v");
  return b == std::string::npos ? "" : text.substr(b, e - b + 1);
}

int64_t MarianTokenizer::eos_id() const { return impl_->v.eos; }
int64_t MarianTokenizer::unk_id() const { return impl_->v.unk; }
int64_t MarianTokenizer::pad_id() const { return impl_->v.pad; }
int64_t MarianTokenizer::vocab_size() const { return (int64_t)impl_->v.pieces.size(); }

}  // namespace graft::text
