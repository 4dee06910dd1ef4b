#include "graft/nn/text/llama_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "graft/autograd/tensor.h"
#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint.h"
#include "spm_file.h"

namespace graft::text {

namespace {

const std::string kSpace = "\xe2\x96\x81";        // U+2581, SentencePiece's space
const std::string kReplacement = "\xef\xbf\xbd";  // U+FFFD

std::string quoted(const std::string& path) {
  std::string q(1, '\'');
  q += printable(path);
  q += '\'';
  return q;
}

// The piece with "▁" read as a space.
std::string spaced(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size(); ++i) {
    const bool mark = piece.compare(i, kSpace.size(), kSpace) == 0;
    out += mark ? ' ' : piece[i];
    if (mark) i += kSpace.size() - 1;
  }
  return out;
}

// Whether `bytes` from `i` on could still become one well-formed UTF-8 character: a lead byte of
// a 2-, 3- or 4-byte form followed by fewer continuation bytes than it needs.
bool incomplete_character(const std::string& bytes, size_t i) {
  const auto b = (unsigned char)bytes[i];
  const size_t need = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
  if (bytes.size() - i >= need) return false;
  for (size_t k = i + 1; k < bytes.size(); ++k)
    if (((unsigned char)bytes[k] & 0xC0) != 0x80) return false;
  return true;
}

// The text of the bytes of a run of byte pieces, SentencePiece's way: each well-formed character
// as it is, each other byte one U+FFFD. With `hold`, an incomplete character at the end stays in
// `bytes` (a later byte piece may finish it); the rest is consumed.
std::string take_bytes(std::string& bytes, bool hold) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t len = utf8_sequence_length(bytes, i);
    if (len == 0 && hold && incomplete_character(bytes, i)) break;
    out += len == 0 ? kReplacement : bytes.substr(i, len);
    i += len == 0 ? 1 : len;
  }
  bytes.erase(0, i);
  return out;
}

bool config_flag(const nlohmann::json& j, const char* key, bool fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean())
    fail("LlamaTokenizer: " + quoted(path) + ": '" + key + "' is " + j[key].dump() +
         ", not true or false");
  return j[key].get<bool>();
}

nlohmann::json json_object(const std::string& path) {
  nlohmann::json j = train::load_json(path);
  if (!j.is_object()) fail("LlamaTokenizer: " + quoted(path) + " is not a JSON object");
  return j;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace

struct LlamaTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  bool remove_extra_spaces = false;  // every piece's leading "▁" dropped until some text

  void check_id(int64_t id, const char* where) const {
    if (id < 0 || id >= sp.GetPieceSize())
      fail(std::string("LlamaTokenizer::") + where + ": id " + std::to_string(id) +
           " is outside the vocabulary of " + std::to_string(sp.GetPieceSize()));
  }
  std::string decode_alone(std::vector<int> ids) const {
    std::string text;
    const auto status = sp.Decode(ids, &text);
    if (!status.ok()) fail("LlamaTokenizer::decode: " + status.ToString());
    return text;
  }
};

namespace {

// How SentencePiece's decoding treats a leading "▁" (the model file's add_dummy_prefix and
// remove_extra_whitespaces, which its API does not show), read off the decoding of "▁" pieces.
void read_space_rules(const LlamaTokenizer::Impl& m, const std::string& path, bool& strip_first,
                      bool& remove_extra) {
  const int space = m.sp.PieceToId(kSpace);
  if (space == m.sp.unk_id() || m.sp.IsByte(space) || m.sp.IsControl(space))
    fail("LlamaTokenizer: " + quoted(path) + " has no \"\xe2\x96\x81\" piece (SentencePiece's " +
         "space): not a SentencePiece model that escapes spaces, as Llama's does");
  strip_first = m.decode_alone({space}).empty();
  remove_extra = strip_first && m.decode_alone({space, space}).empty();
}

// Every piece decoded alone must be what LlamaStreamDecoder makes of it: refuses a model whose
// decoding rewrites pieces (a denormaliser), which the streaming decoder would not follow.
void check_pieces_decode(const LlamaTokenizer::Impl& m, const std::string& path, bool strip_first) {
  for (int id = 0; id < m.sp.GetPieceSize(); ++id) {
    if (m.sp.IsControl(id) || m.sp.IsUnknown(id) || m.sp.IsByte(id)) continue;
    std::string piece = m.sp.IdToPiece(id);
    if (strip_first && piece.rfind(kSpace, 0) == 0) piece.erase(0, kSpace.size());
    if (m.decode_alone({id}) != spaced(piece))
      fail("LlamaTokenizer: " + quoted(path) + ": piece " + std::to_string(id) + " ('" +
           printable(m.sp.IdToPiece(id)) + "') decodes as '" + printable(m.decode_alone({id})) +
           "' (a denormaliser): not supported");
  }
}

}  // namespace

LlamaTokenizer::LlamaTokenizer(const std::string& model_path, bool add_bos, bool add_eos)
    : impl_(std::make_unique<Impl>()), add_bos_(add_bos), add_eos_(add_eos) {
  if (!exists(model_path)) fail("LlamaTokenizer: " + quoted(model_path) + " does not exist");
  detail::check_model_file(model_path);
  const auto status = impl_->sp.Load(model_path);
  if (!status.ok())
    fail("LlamaTokenizer: " + quoted(model_path) + " is not a SentencePiece model (" +
         status.ToString() + ")");
  if (add_bos && bos_id() < 0)
    fail("LlamaTokenizer: " + quoted(model_path) + " has no BOS piece, and the BOS is to be added");
  if (add_eos && eos_id() < 0)
    fail("LlamaTokenizer: " + quoted(model_path) + " has no EOS piece, and the EOS is to be added");
  read_space_rules(*impl_, model_path, strip_first_space_, impl_->remove_extra_spaces);
  check_pieces_decode(*impl_, model_path, strip_first_space_);
}

LlamaTokenizer LlamaTokenizer::from_hf_dir(const std::string& dir) {
  const std::string config = dir + "/tokenizer_config.json", model = dir + "/config.json";
  bool bos = true, eos = false;
  if (exists(config)) {
    const nlohmann::json j = json_object(config);
    bos = config_flag(j, "add_bos_token", bos, config);
    eos = config_flag(j, "add_eos_token", eos, config);
  }
  LlamaTokenizer t(dir + "/tokenizer.model", bos, eos);
  if (!exists(model)) return t;
  const nlohmann::json j = json_object(model);
  if (!j.contains("vocab_size")) return t;
  const nlohmann::json& v = j["vocab_size"];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    fail("LlamaTokenizer: " + quoted(model) + ": 'vocab_size' is " + v.dump() +
         ", not a positive integer");
  if (v.get<int64_t>() < t.vocab_size())
    fail("LlamaTokenizer: " + quoted(dir + "/tokenizer.model") + " has " +
         std::to_string(t.vocab_size()) + " pieces, more than the vocab_size " + v.dump() + " of " +
         quoted(model) + ": its ids would fall outside the model's embedding");
  return t;
}

LlamaTokenizer::~LlamaTokenizer() = default;
LlamaTokenizer::LlamaTokenizer(LlamaTokenizer&&) noexcept = default;
LlamaTokenizer& LlamaTokenizer::operator=(LlamaTokenizer&&) noexcept = default;

std::vector<int64_t> LlamaTokenizer::encode(const std::string& text) const {
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_sequence_length(text, i);
    if (len == 0)
      fail("LlamaTokenizer::encode: the text is not valid UTF-8 at byte " + std::to_string(i) +
           " (" + printable(text.substr(i, 4)) + ")");
    i += len;
  }
  std::vector<int> sp_ids;
  const auto status = impl_->sp.Encode(text, &sp_ids);
  if (!status.ok()) fail("LlamaTokenizer::encode: " + status.ToString());
  std::vector<int64_t> ids;
  ids.reserve(sp_ids.size() + 2);
  if (add_bos_) ids.push_back(bos_id());
  ids.insert(ids.end(), sp_ids.begin(), sp_ids.end());
  if (add_eos_) ids.push_back(eos_id());
  return ids;
}

std::string LlamaTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (const int64_t id : ids) {
    impl_->check_id(id, "decode");
    if (!is_special(id)) kept.push_back((int)id);
  }
  return impl_->decode_alone(kept);
}

int64_t LlamaTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

std::string LlamaTokenizer::piece(int64_t id) const {
  impl_->check_id(id, "piece");
  return impl_->sp.IdToPiece((int)id);
}

bool LlamaTokenizer::is_special(int64_t id) const {
  impl_->check_id(id, "is_special");
  return impl_->sp.IsControl((int)id) || impl_->sp.IsUnknown((int)id);
}

bool LlamaTokenizer::is_byte(int64_t id) const {
  impl_->check_id(id, "is_byte");
  return impl_->sp.IsByte((int)id);
}

int64_t LlamaTokenizer::bos_id() const { return impl_->sp.bos_id(); }
int64_t LlamaTokenizer::eos_id() const { return impl_->sp.eos_id(); }
int64_t LlamaTokenizer::unk_id() const { return impl_->sp.unk_id(); }

// ---- LlamaStreamDecoder
// -----------------------------------------------------------------------------

LlamaStreamDecoder::LlamaStreamDecoder(const LlamaTokenizer& tokenizer) : tokenizer_(&tokenizer) {}

// SentencePiece's decoding piece by piece: a byte piece's byte waits in pending_ until it ends
// a character; another piece first ends the run of bytes, then drops its leading "▁" while
// nothing has been given out and no "▁" dropped yet (with remove_extra_whitespaces, every
// piece's until some text).
std::string LlamaStreamDecoder::push(int64_t id) {
  if (tokenizer_->is_special(id)) return {};
  const auto& sp = tokenizer_->impl_->sp;
  if (sp.IsByte((int)id)) {
    pending_.push_back((char)std::stoi(sp.IdToPiece((int)id).substr(3, 2), nullptr, 16));
    any_text_ = true;
    return take_bytes(pending_, /*hold=*/true);
  }
  std::string out = flush_bytes();
  std::string piece = sp.IdToPiece((int)id);
  if (!any_text_ && !bos_ws_seen_ && tokenizer_->strips_first_space() &&
      piece.rfind(kSpace, 0) == 0) {
    piece.erase(0, kSpace.size());
    bos_ws_seen_ = !tokenizer_->impl_->remove_extra_spaces;
  }
  const std::string text = spaced(piece);
  any_text_ = any_text_ || !text.empty();
  return out + text;
}

std::string LlamaStreamDecoder::flush_bytes() { return take_bytes(pending_, /*hold=*/false); }

std::string LlamaStreamDecoder::finish() { return flush_bytes(); }

}  // namespace graft::text
