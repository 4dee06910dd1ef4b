#include "graft/nn/text/wordpiece.h"
#include "utf8.h"

#include "graft/autograd/tensor.h"
#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/uniset.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

namespace graft::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- character classes ---------------------------------------------------------------------

// `tokenizers` takes control characters, punctuation and nonspacing marks from the
// unicode_categories crate, whose tables are those of Unicode 8.0: a character assigned later is
// unassigned (Cn) there, so not removed, not split off and not stripped. A sweep of every code
// point against tokenizers 0.23.3 found these, and six characters whose category has changed
// since 8.0 (their 8.0 category below); ICU knows only the current ones.
int8_t category_as_of_8_0(UChar32 c) {
  UVersionInfo age;
  u_charAge(c, age);
  if (age[0] > 8) return U_UNASSIGNED;
  switch (c) {
    case 0x166D:
    case 0x111C9:
      return U_OTHER_PUNCTUATION;  // now So, Mn
    case 0x1734:
      return U_NON_SPACING_MARK;  // now Mc
    case 0x1885:
    case 0x1886:
      return U_OTHER_LETTER;  // now Mn
    case 0xA9BD:
      return U_COMBINING_SPACING_MARK;  // now Mn
    default:
      return (int8_t)u_charType(c);
  }
}

bool is_ascii_punctuation(UChar32 c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
         (c >= 123 && c <= 126);
}

// Tab, newline and carriage return are control characters that count as whitespace.
bool is_control(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  if (c < 128) return c < 32 || c == 127;
  const int8_t cat = category_as_of_8_0(c);
  return cat == U_CONTROL_CHAR || cat == U_FORMAT_CHAR || cat == U_PRIVATE_USE_CHAR ||
         cat == U_SURROGATE;
}

bool is_whitespace(UChar32 c) {
  if (c < 128) return c == ' ' || (c >= '\t' && c <= '\r');
  return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE);
}

bool is_punctuation(UChar32 c) {
  if (c < 128) return is_ascii_punctuation(c);
  return (U_MASK(category_as_of_8_0(c)) & U_GC_P_MASK) != 0;
}

bool is_nonspacing_mark(UChar32 c) {
  return c >= 128 && category_as_of_8_0(c) == U_NON_SPACING_MARK;
}

// The CJK ideograph blocks BERT puts spaces around. `tokenizers` starts Extension E at U+2B920,
// 256 code points into the block (BERT's own code starts it at U+2B820), and stops before
// Extension F; both followed here.
bool is_cjk_ideograph(UChar32 c) {
  if (c < 0x3400) return false;
  switch (ublock_getCode(c)) {
    case UBLOCK_CJK_UNIFIED_IDEOGRAPHS:
    case UBLOCK_CJK_UNIFIED_IDEOGRAPHS_EXTENSION_A:
    case UBLOCK_CJK_UNIFIED_IDEOGRAPHS_EXTENSION_B:
    case UBLOCK_CJK_UNIFIED_IDEOGRAPHS_EXTENSION_C:
    case UBLOCK_CJK_UNIFIED_IDEOGRAPHS_EXTENSION_D:
    case UBLOCK_CJK_COMPATIBILITY_IDEOGRAPHS:
    case UBLOCK_CJK_COMPATIBILITY_IDEOGRAPHS_SUPPLEMENT:
      return true;
    case UBLOCK_CJK_UNIFIED_IDEOGRAPHS_EXTENSION_E:
      return c >= 0x2B920;
    default:
      return false;
  }
}

// ---- UTF-8 ---------------------------------------------------------------------------------

// Throws naming the first byte that does not start a well-formed sequence.
void check_utf8(std::string_view s, const char* what) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      fail(std::string("WordPiece: ") + what + " is not valid UTF-8 at byte " + std::to_string(i) +
           " (" + printable(s.substr(i, std::min<size_t>(4, s.size() - i))) + ")");
    }
    i += len;
  }
}

// s must be valid UTF-8.
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = (unsigned char)s[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    char32_t c = b & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) c = (c << 6) | ((unsigned char)s[i + k] & 0x3F);
    out.push_back(c);
    i += len;
  }
  return out;
}

using detail::append_utf8;

size_t code_points(std::string_view s) {
  return (size_t)std::count_if(s.begin(), s.end(),
                               [](char b) { return ((unsigned char)b & 0xC0) != 0x80; });
}

// ---- the normaliser's steps (BertNormalizer's order: clean, CJK, strip accents, lowercase) ----

void clean(std::u32string& s) {
  size_t n = 0;
  for (const char32_t c : s) {
    if (c == 0 || c == 0xFFFD || is_control((UChar32)c)) continue;
    s[n++] = is_whitespace((UChar32)c) ? U' ' : c;
  }
  s.resize(n);
}

void space_cjk(std::u32string& s) {
  if (std::none_of(s.begin(), s.end(), [](char32_t c) { return is_cjk_ideograph((UChar32)c); }))
    return;
  std::u32string out;
  out.reserve(s.size() + 16);
  for (const char32_t c : s) {
    if (is_cjk_ideograph((UChar32)c)) {
      out += U' ';
      out += c;
      out += U' ';
    } else {
      out += c;
    }
  }
  s = std::move(out);
}

bool all_ascii(const std::u32string& s) {
  return std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x80; });
}

// ICU's NFD for the characters of Unicode 8.0, the others left as they are: `tokenizers`' NFD
// leaves U+11938 (Unicode 13) whole, ICU's splits it.
const icu::Normalizer2& nfd_as_of_8_0() {
  static const icu::Normalizer2* nfd = [] {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* full = icu::Normalizer2::getNFDInstance(status);
    auto* unicode_8_0 = new icu::UnicodeSet(UNICODE_STRING_SIMPLE("[:Age=8.0:]"), status);
    if (U_FAILURE(status))
      fail(std::string("WordPiece: ICU's NFD normaliser: ") + u_errorName(status));
    unicode_8_0->freeze();
    return new icu::FilteredNormalizer2(*full, *unicode_8_0);
  }();
  return *nfd;
}

// NFD, then without the nonspacing marks.
void strip_accents(std::u32string& s) {
  if (all_ascii(s)) return;
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString in =
      icu::UnicodeString::fromUTF32((const UChar32*)s.data(), (int32_t)s.size());
  const icu::UnicodeString decomposed = nfd_as_of_8_0().normalize(in, status);
  if (U_FAILURE(status))
    fail(std::string("WordPiece: ICU's NFD normalisation: ") + u_errorName(status));
  s.clear();
  for (int32_t i = 0; i < decomposed.length(); i = decomposed.moveIndex32(i, 1)) {
    const UChar32 c = decomposed.char32At(i);
    if (!is_nonspacing_mark(c)) s.push_back((char32_t)c);
  }
}

// Each character on its own (no final-sigma context), with its full mapping: U+0130 gives "i"
// and U+0307, as Rust's char::to_lowercase does in `tokenizers`.
void lowercase(std::u32string& s) {
  if (all_ascii(s)) {
    for (char32_t& c : s) c = (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return;
  }
  std::u32string out;
  out.reserve(s.size());
  for (const char32_t c : s) {
    if (c < 0x80) {
      out.push_back((c >= 'A' && c <= 'Z') ? c + 32 : c);
      continue;
    }
    UChar src[2], dest[8];
    int32_t src_len = 0;
    U16_APPEND_UNSAFE(src, src_len, (UChar32)c);
    UErrorCode status = U_ZERO_ERROR;
    const int32_t len = u_strToLower(dest, 8, src, src_len, "", &status);
    if (U_FAILURE(status))
      fail(std::string("WordPiece: ICU's lowercasing: ") + u_errorName(status));
    for (int32_t i = 0; i < len;) {
      UChar32 l;
      U16_NEXT_UNSAFE(dest, i, l);
      out.push_back((char32_t)l);
    }
  }
  s = std::move(out);
}

// ---- files -----------------------------------------------------------------------------------

std::string quoted(const std::string& path) {
  std::string out = "'";
  out.append(printable(path)).push_back('\'');
  return out;
}

// A regular file of at most kMaxFileBytes, whole.
std::string read_file(const std::string& path) {
  const std::string file = "WordPiece: " + quoted(path);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(file + ": no such file");
  if (!fs::is_regular_file(st)) fail(file + " is not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail(file + ": cannot read its size: " + ec.message());
  if (size > WordPiece::kMaxFileBytes) {
    fail(file + " is " + std::to_string(size) + " bytes, over the limit of " +
         std::to_string(WordPiece::kMaxFileBytes) + " bytes for a tokenizer file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(file + ": cannot open it");
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) fail(file + ": read error");
  return bytes;
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail("WordPiece: " + quoted(path) + ": not valid JSON: " + e.what());
  }
}

// The constructor's error again with the file it came from: "WordPiece: '<path>': ...".
WordPiece make_named(const std::string& path, std::vector<std::string> vocab,
                     WordPieceOptions options) {
  try {
    return WordPiece(std::move(vocab), std::move(options));
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string head = "WordPiece: ";
    fail(head + quoted(path) + ": " + (what.rfind(head, 0) == 0 ? what.substr(head.size()) : what));
  }
}

// ---- tokenizer.json --------------------------------------------------------------------------

// The value at `key` of `obj` as a T; `fallback` when absent or null; an error naming the key
// when it is of another type, or a number that is not an integer in T's range for an integer T
// (nlohmann would truncate 2.5 and convert 1e300 with undefined behaviour).
template <class T>
T field(const json& obj, const char* key, T fallback, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return fallback;
  if (const std::string c = train::json_complaint<T>(obj[key]); !c.empty())
    fail(where + ": \"" + key + "\" " + c);
  return obj[key].get<T>();
}

std::string type_of(const json& section) {
  if (section.is_null()) return "null";
  if (!section.is_object() || !section.contains("type") || !section["type"].is_string())
    return "(no type)";
  return section["type"].get<std::string>();
}

// The vocabulary of a WordPiece model: {"token": id, ...} with ids 0..n-1, each once.
std::vector<std::string> read_model_vocab(const json& model, const std::string& where) {
  if (!model.contains("vocab") || !model["vocab"].is_object())
    fail(where + ": the model has no \"vocab\" object");
  const json& vocab = model["vocab"];
  std::vector<std::string> tokens(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (const std::string c = train::json_complaint<int64_t>(it.value()); !c.empty())
      fail(where + ": the id of \"" + printable(it.key()) + "\" " + c);
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (int64_t)tokens.size()) {
      fail(where + ": the id " + std::to_string(id) + " of \"" + printable(it.key()) +
           "\" is outside [0, " + std::to_string(tokens.size()) + ")");
    }
    if (seen[(size_t)id]) {
      fail(where + ": the id " + std::to_string(id) + " is given to both \"" +
           printable(tokens[(size_t)id]) + "\" and \"" + printable(it.key()) + "\"");
    }
    seen[(size_t)id] = true;
    tokens[(size_t)id] = it.key();
  }
  return tokens;
}

void read_normalizer(const json& normalizer, WordPieceOptions& o, const std::string& where) {
  if (normalizer.is_null()) {
    o.clean_text = o.handle_chinese_chars = o.lowercase = false;
    o.strip_accents = false;
    return;
  }
  const std::string type = type_of(normalizer);
  if (type != "BertNormalizer")
    fail(where + ": normalizer type \"" + printable(type) + "\" is not BertNormalizer");
  o.clean_text = field(normalizer, "clean_text", true, where);
  o.handle_chinese_chars = field(normalizer, "handle_chinese_chars", true, where);
  o.lowercase = field(normalizer, "lowercase", true, where);
  if (normalizer.contains("strip_accents") && !normalizer["strip_accents"].is_null())
    o.strip_accents = field(normalizer, "strip_accents", false, where);
}

// [CLS] and [SEP] from BertProcessing or a TemplateProcessing of the shape [CLS] $A [SEP].
void read_post_processor(const json& post, WordPieceOptions& o, const std::string& where) {
  const std::string type = type_of(post);
  if (type == "null") return;
  if (type == "BertProcessing") {
    auto token_of = [&](const char* key) {
      if (!post.contains(key) || !post[key].is_array() || post[key].empty() ||
          !post[key][0].is_string())
        fail(where + ": BertProcessing has no [token, id] \"" + key + "\"");
      return post[key][0].get<std::string>();
    };
    o.cls_token = token_of("cls");
    o.sep_token = token_of("sep");
    return;
  }
  if (type != "TemplateProcessing")
    fail(where + ": post_processor type \"" + printable(type) +
         "\" is neither BertProcessing nor TemplateProcessing");
  const json single = post.value("single", json());
  auto special = [&](size_t i) -> std::string {
    const json& item = single[i];
    if (!item.is_object() || !item.contains("SpecialToken") ||
        !item["SpecialToken"].contains("id") || !item["SpecialToken"]["id"].is_string())
      return "";
    return item["SpecialToken"]["id"].get<std::string>();
  };
  if (!single.is_array() || single.size() != 3 || special(0).empty() || special(2).empty() ||
      !single[1].is_object() || !single[1].contains("Sequence"))
    fail(where +
         ": the post_processor's \"single\" template is not [CLS] $A [SEP] (special, sequence, "
         "special)");
  o.cls_token = special(0);
  o.sep_token = special(2);
}

// The added tokens, each matched in the raw text: ones that strip the spaces beside them, match
// single words only or are matched after normalisation are refused.
std::vector<std::string> read_added_tokens(const json& added, const std::vector<std::string>& vocab,
                                           const std::string& where) {
  std::vector<std::string> tokens;
  if (added.is_null()) return tokens;
  if (!added.is_array()) fail(where + ": \"added_tokens\" is not an array");
  for (const json& t : added) {
    const std::string content = field(t, "content", std::string(), where);
    const std::string name = "added token \"" + printable(content) + "\"";
    if (content.empty()) fail(where + ": an added token has no \"content\"");
    for (const char* flag : {"lstrip", "rstrip", "single_word", "normalized"}) {
      if (field(t, flag, false, where))
        fail(where + ": " + name + " has \"" + flag + "\": true, which is not supported");
    }
    const int64_t id = field(t, "id", int64_t(-1), where);
    if (id < 0 || id >= (int64_t)vocab.size() || vocab[(size_t)id] != content)
      fail(where + ": " + name + " has the id " + std::to_string(id) +
           ", not its id in the model's vocabulary");
    tokens.push_back(content);
  }
  return tokens;
}

// tokenizer_config.json's token, "[X]" or {"content": "[X]", ...}.
std::string config_token(const json& config, const char* key, const std::string& fallback,
                         const std::string& where) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  fail(where + ": \"" + key + "\" is neither a string nor {\"content\": ...}");
}

// vocab.txt's tokens: one a line, a trailing '\r' dropped; empty, repeated or non-UTF-8 lines
// refused.
std::vector<std::string> read_vocab_lines(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<std::string> vocab;
  std::unordered_map<std::string_view, size_t> line_of;
  for (size_t begin = 0; begin < bytes.size();) {
    size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();
    std::string_view line(bytes.data() + begin, end - begin);
    if (line.ends_with('\r')) line.remove_suffix(1);
    const size_t number = vocab.size() + 1;
    const std::string at = "WordPiece: " + quoted(path) + ": line " + std::to_string(number);
    if (line.empty()) fail(at + " is empty (one token a line)");
    if (!valid_utf8(line)) fail(at + " is not valid UTF-8");
    const auto [it, inserted] = line_of.emplace(line, number);
    if (!inserted) {
      fail(at + ": the token \"" + printable(line) + "\" is repeated (first on line " +
           std::to_string(it->second) + ")");
    }
    vocab.emplace_back(line);
    begin = end + 1;
  }
  return vocab;
}

}  // namespace

// ---- WordPiece -------------------------------------------------------------------------------

WordPiece::WordPiece(std::vector<std::string> vocab, WordPieceOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  if (options_.max_input_chars_per_word < 1) {
    fail("WordPiece: max_input_chars_per_word is " +
         std::to_string(options_.max_input_chars_per_word) + ", not at least 1");
  }
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& t = vocab_[i];
    if (t.empty()) fail("WordPiece: the token of id " + std::to_string(i) + " is empty");
    const auto [it, inserted] = ids_.emplace(t, (int64_t)i);
    if (!inserted) {
      fail("WordPiece: the token \"" + printable(t) + "\" is repeated (ids " +
           std::to_string(it->second) + " and " + std::to_string(i) + ")");
    }
    word_start_.insert(t, (int64_t)i);
    // A piece ends at a character boundary: a key that is not UTF-8 could only match inside one.
    if (!t.starts_with(options_.continuing_prefix)) continue;
    const std::string_view rest = std::string_view(t).substr(options_.continuing_prefix.size());
    if (!rest.empty() && valid_utf8(rest)) word_continuation_.insert(rest, (int64_t)i);
  }
  word_continuation_.build();
  unk_ = find_required(options_.unk_token, "unknown");
  cls_ = find_required(options_.cls_token, "classifier");
  sep_ = find_required(options_.sep_token, "separator");
  pad_ = find_required(options_.pad_token, "padding");
  strip_accents_ = options_.strip_accents.value_or(options_.lowercase);
  std::vector<std::string> added;
  if (options_.added_tokens) {
    added = *options_.added_tokens;
  } else {
    added = {options_.pad_token, options_.unk_token, options_.cls_token, options_.sep_token};
    if (ids_.count("[MASK]")) added.push_back("[MASK]");
  }
  for (const std::string& t : added) added_.insert(t, find_required(t, "added"));
  added_.build();
  has_added_ = !added.empty();
}

int64_t WordPiece::find_required(const std::string& token, const char* what) const {
  const auto it = ids_.find(token);
  if (it == ids_.end())
    fail(std::string("WordPiece: the vocabulary has no ") + what + " token \"" + printable(token) +
         "\"");
  return it->second;
}

WordPiece WordPiece::from_tokenizer_json(const std::string& path) {
  const std::string where = "WordPiece: " + quoted(path);
  const json doc = parse_json(path);
  if (!doc.is_object()) fail(where + ": not a JSON object");
  const json model = doc.value("model", json());
  const std::string model_type = type_of(model);
  if (model_type != "WordPiece")
    fail(where + ": model type \"" + printable(model_type) + "\" is not WordPiece");
  std::vector<std::string> vocab = read_model_vocab(model, where);

  WordPieceOptions o;
  read_normalizer(doc.value("normalizer", json()), o, where);
  const std::string pre = type_of(doc.value("pre_tokenizer", json()));
  if (pre != "BertPreTokenizer")
    fail(where + ": pre_tokenizer type \"" + printable(pre) + "\" is not BertPreTokenizer");
  read_post_processor(doc.value("post_processor", json()), o, where);
  o.unk_token = field(model, "unk_token", o.unk_token, where);
  o.continuing_prefix = field(model, "continuing_subword_prefix", o.continuing_prefix, where);
  o.max_input_chars_per_word =
      field(model, "max_input_chars_per_word", o.max_input_chars_per_word, where);
  o.pad_token = field(doc.value("padding", json()), "pad_token", o.pad_token, where);
  o.added_tokens = read_added_tokens(doc.value("added_tokens", json()), vocab, where);
  return make_named(path, std::move(vocab), std::move(o));
}

WordPiece WordPiece::from_vocab_txt(const std::string& path, WordPieceOptions options) {
  return make_named(path, read_vocab_lines(path), std::move(options));
}

WordPiece WordPiece::from_directory(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d / "tokenizer.json", ec))
    return from_tokenizer_json((d / "tokenizer.json").string());
  const std::string vocab_path = (d / "vocab.txt").string();
  if (!fs::exists(vocab_path, ec))
    fail("WordPiece: " + quoted(dir) + ": neither tokenizer.json nor vocab.txt is there");
  std::vector<std::string> vocab = read_vocab_lines(vocab_path);
  WordPieceOptions o;
  const fs::path config_path = d / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    const std::string where = "WordPiece: " + quoted(config_path.string());
    const json config = parse_json(config_path.string());
    if (!config.is_object()) fail(where + ": not a JSON object");
    o.lowercase = field(config, "do_lower_case", true, where);
    o.handle_chinese_chars = field(config, "tokenize_chinese_chars", true, where);
    if (config.contains("strip_accents") && !config["strip_accents"].is_null())
      o.strip_accents = field(config, "strip_accents", false, where);
    o.unk_token = config_token(config, "unk_token", o.unk_token, where);
    o.cls_token = config_token(config, "cls_token", o.cls_token, where);
    o.sep_token = config_token(config, "sep_token", o.sep_token, where);
    o.pad_token = config_token(config, "pad_token", o.pad_token, where);
    // transformers' BertTokenizer never splits its special tokens; the mask token only where the
    // vocabulary has it.
    o.added_tokens = std::vector<std::string>{o.pad_token, o.unk_token, o.cls_token, o.sep_token};
    const std::string mask = config_token(config, "mask_token", "[MASK]", where);
    if (std::find(vocab.begin(), vocab.end(), mask) != vocab.end()) o.added_tokens->push_back(mask);
  }
  return make_named(vocab_path, std::move(vocab), std::move(o));
}

void WordPiece::append_normalized(std::u32string_view text, std::u32string& out) const {
  std::u32string s(text);
  if (options_.clean_text) clean(s);
  if (options_.handle_chinese_chars) space_cjk(s);
  if (strip_accents_) strip_accents(s);
  if (options_.lowercase) lowercase(s);
  out += s;
}

// BertPreTokenizer: split at whitespace (dropped), then each punctuation character on its own.
void WordPiece::split_words(std::u32string_view text, std::vector<std::string>& words) const {
  std::string word;
  auto flush = [&] {
    if (!word.empty()) words.push_back(std::move(word));
    word.clear();
  };
  for (const char32_t c : text) {
    if (is_whitespace((UChar32)c)) {
      flush();
    } else if (is_punctuation((UChar32)c)) {
      flush();
      append_utf8(c, word);
      flush();
    } else {
      append_utf8(c, word);
    }
  }
  flush();
}

void WordPiece::ByteTrie::insert(std::string_view key, int64_t id) {
  int32_t node = 0;
  for (const char c : key) {
    const auto b = (unsigned char)c;
    const auto [it, added] = edges.emplace(uint64_t(node) * 256 + b, (int32_t)value.size());
    if (added) {
      value.push_back(-1), parent.push_back(node), depth.push_back(depth[(size_t)node] + 1);
      byte.push_back(b);
    }
    node = it->second;
  }
  value[(size_t)node] = id;
}

void WordPiece::LongestMatcher::insert(std::string_view key, int64_t id) {
  trie.insert(std::string(key.rbegin(), key.rend()), id);
}

// The failure links in order of depth (a node's link is shallower than it), and with them the
// longest token that is a suffix of each node's string.
void WordPiece::LongestMatcher::build() {
  const size_t n = trie.value.size();
  std::vector<int32_t> order((size_t)n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return trie.depth[(size_t)a] < trie.depth[(size_t)b];
  });
  fail.assign(n, 0);
  longest.assign(n, -1);
  for (const int32_t v : order) {
    if (v == 0) continue;
    if (const int32_t u = trie.parent[(size_t)v]; u != 0) {
      int32_t z = fail[(size_t)u], next = -1;
      while ((next = trie.child(z, trie.byte[(size_t)v])) < 0 && z != 0) z = fail[(size_t)z];
      fail[(size_t)v] = next < 0 ? 0 : next;
    }
    longest[(size_t)v] = trie.value[(size_t)v] >= 0 ? v : longest[(size_t)fail[(size_t)v]];
  }
}

// Backwards over the text: after byte i the automaton's state is the longest suffix of the
// reversed text read so far, i.e. the longest prefix of text[i..] that starts an added token;
// its longest token is the longest added token starting at i. Each byte makes one forward
// transition and the failure transitions, which only shorten the state, never outnumber them.
void WordPiece::LongestMatcher::longest_at(std::string_view text, std::vector<int32_t>& out,
                                           int64_t& steps) const {
  out.assign(text.size(), -1);
  int32_t state = 0;
  for (size_t i = text.size(); i-- > 0;) {
    const auto b = (unsigned char)text[i];
    int32_t next;
    while ((next = trie.child(state, b)) < 0 && state != 0) state = fail[(size_t)state], ++steps;
    state = next < 0 ? 0 : next;
    ++steps;
    out[i] = longest[(size_t)state];
  }
}

// Greedy longest match first from the left; pieces after the first carry the continuing prefix.
// A word with no match at some position, or longer than max_input_chars_per_word, is one unk.
// The first piece is the last token met walking the trie from the word's start (at most the
// word's bytes in steps); the longest continuing piece at every later byte comes from one
// backward pass of word_continuation_ (at most 2 steps a byte), so a word costs at most 3 steps
// a byte, whatever its length and the vocabulary's longest token.
void WordPiece::append_pieces(std::string_view word, std::vector<int64_t>& ids, int64_t& steps,
                              std::vector<int32_t>& scratch) const {
  if ((int64_t)code_points(word) > options_.max_input_chars_per_word) {
    ids.push_back(unk_);
    return;
  }
  int64_t first = -1;
  size_t start = 0;
  for (size_t k = 0, node = 0; k < word.size(); ++k) {
    ++steps;
    const int32_t next = word_start_.child((int32_t)node, (unsigned char)word[k]);
    if (next < 0) break;
    node = (size_t)next;
    const bool boundary = k + 1 == word.size() || ((unsigned char)word[k + 1] & 0xC0) != 0x80;
    if (word_start_.value[node] >= 0 && boundary) first = word_start_.value[node], start = k + 1;
  }
  if (first < 0) {
    ids.push_back(unk_);
    return;
  }
  const std::string_view rest = word.substr(start);
  word_continuation_.longest_at(rest, scratch, steps);
  const size_t mark = ids.size();
  ids.push_back(first);
  for (size_t i = 0; i < rest.size(); i += word_continuation_.length(scratch[i])) {
    if (scratch[i] < 0) {
      ids.resize(mark);
      ids.push_back(unk_);
      return;
    }
    ids.push_back(word_continuation_.id(scratch[i]));
  }
}

// The added tokens are found first, leftmost and then longest, in the raw bytes (valid UTF-8,
// so a match starts and ends at character boundaries); the text between them is normalised and
// split into words.
template <class OnWord, class OnAdded>
void WordPiece::for_each_word(const std::string& utf8, OnWord&& on_word, OnAdded&& on_added,
                              int64_t& steps) const {
  check_utf8(utf8, "the text");
  std::vector<std::string> words;
  std::u32string normalized;
  auto words_of = [&](size_t begin, size_t end) {
    if (begin == end) return;
    normalized.clear();
    append_normalized(decode_utf8(std::string_view(utf8).substr(begin, end - begin)), normalized);
    words.clear();
    split_words(normalized, words);
    for (const std::string& w : words) on_word(w);
  };
  size_t done = 0;
  if (has_added_) {
    std::vector<int32_t> longest;
    added_.longest_at(utf8, longest, steps);
    for (size_t i = 0; i < utf8.size();) {
      const int32_t node = longest[i];
      if (node < 0) {
        ++i;
        continue;
      }
      words_of(done, i);
      const size_t length = added_.length(node);
      on_added(std::string_view(utf8).substr(i, length), added_.id(node));
      done = i += length;
    }
  }
  words_of(done, utf8.size());
}

std::string WordPiece::normalize(const std::string& utf8) const {
  check_utf8(utf8, "the text");
  std::u32string normalized;
  append_normalized(decode_utf8(utf8), normalized);
  std::string out;
  out.reserve(normalized.size());
  for (const char32_t c : normalized) append_utf8(c, out);
  return out;
}

std::vector<std::string> WordPiece::basic_tokenize(const std::string& utf8) const {
  std::vector<std::string> words;
  int64_t steps = 0;
  for_each_word(
      utf8, [&](const std::string& w) { words.push_back(w); },
      [&](std::string_view t, int64_t) { words.emplace_back(t); }, steps);
  return words;
}

std::vector<int64_t> WordPiece::encode(const std::string& utf8) const {
  int64_t steps = 0;
  return encode(utf8, steps);
}

std::vector<int64_t> WordPiece::encode(const std::string& utf8, int64_t& steps) const {
  std::vector<int64_t> ids;
  std::vector<int32_t> scratch;  // append_pieces' matches, reused from word to word
  for_each_word(
      utf8, [&](const std::string& w) { append_pieces(w, ids, steps, scratch); },
      [&](std::string_view, int64_t id) { ids.push_back(id); }, steps);
  return ids;
}

std::vector<int64_t> WordPiece::encode_with_specials(const std::string& utf8,
                                                     int64_t max_len) const {
  if (max_len < 2) {
    fail("WordPiece::encode_with_specials: max_len " + std::to_string(max_len) +
         " leaves no room for the classifier and separator tokens");
  }
  std::vector<int64_t> pieces = encode(utf8);
  if ((int64_t)pieces.size() > max_len - 2) pieces.resize((size_t)(max_len - 2));
  std::vector<int64_t> ids;
  ids.reserve(pieces.size() + 2);
  ids.push_back(cls_);
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  ids.push_back(sep_);
  return ids;
}

int64_t WordPiece::id(const std::string& token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end())
    fail("WordPiece: the token \"" + printable(token) + "\" is not in the vocabulary");
  return it->second;
}

const std::string& WordPiece::token(int64_t id) const {
  if (id < 0 || id >= size())
    fail("WordPiece: the id " + std::to_string(id) + " is outside [0, " + std::to_string(size()) +
         ")");
  return vocab_[(size_t)id];
}

}  // namespace graft::text
