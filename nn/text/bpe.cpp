#include "graft/nn/text/bpe.h"
#include "utf8.h"

#include "graft/autograd/tensor.h"
#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <queue>
#include <unordered_set>

namespace graft::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- the byte table (tokenizers' bytes_char, GPT-2's bytes_to_unicode) --------------------------

// Bytes that are printable Latin-1 stand for themselves; the other 68 (controls, space, DEL, NBSP,
// soft hyphen), in byte order, for U+0100 onwards, so that no token holds whitespace or controls.
std::array<char32_t, 256> make_byte_chars() {
  std::array<char32_t, 256> chars{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool itself = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    chars[(size_t)b] = itself ? (char32_t)b : next++;
  }
  return chars;
}

const std::array<char32_t, 256>& byte_chars() {
  static const std::array<char32_t, 256> chars = make_byte_chars();
  return chars;
}

// The byte a character stands for, or -1 (every such character is below U+0144).
int char_byte(char32_t c) {
  static const std::array<int16_t, 0x144> bytes = [] {
    std::array<int16_t, 0x144> b;
    b.fill(-1);
    for (int i = 0; i < 256; ++i) b[(size_t)byte_chars()[(size_t)i]] = (int16_t)i;
    return b;
  }();
  return c < bytes.size() ? bytes[c] : -1;
}

using detail::append_utf8;

// The code point of the well-formed sequence of `len` bytes at s[i].
char32_t code_point_at(std::string_view s, size_t i, size_t len) {
  const auto b = (unsigned char)s[i];
  if (len == 1) return b;
  char32_t c = b & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) c = (c << 6) | ((unsigned char)s[i + k] & 0x3F);
  return c;
}

// The token's characters mapped to their bytes, or nothing when one is outside the table.
std::optional<std::string> bytes_of_chars(std::string_view token) {
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const size_t len = std::max<size_t>(1, utf8_sequence_length(token, i));
    const int b = char_byte(code_point_at(token, i, len));
    if (b < 0) return std::nullopt;
    out.push_back((char)b);
    i += len;
  }
  return out;
}

// ---- lossy UTF-8
// ---------------------------------------------------------------------------------

// The length of the longest start of a well-formed sequence at s[i] (Unicode's "maximal
// subpart"): 0 for a byte that starts none.
size_t subpart_length(std::string_view s, size_t i) {
  const auto b = (unsigned char)s[i];
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) need = 1;
  else if (b >= 0xE0 && b <= 0xEF)
    need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
  else if (b >= 0xF0 && b <= 0xF4)
    need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
  else return 0;
  size_t n = 1;
  for (; n <= need && i + n < s.size(); ++n) {
    const auto c = (unsigned char)s[i + n];
    if (c < (n == 1 ? lo : 0x80) || c > (n == 1 ? hi : 0xBF)) break;
  }
  return n;
}

// Appends the text of `bytes` up to an incomplete sequence at its end (returned: where that
// starts), each maximal invalid subsequence before it one U+FFFD.
size_t append_lossy(std::string_view bytes, std::string& out) {
  for (size_t i = 0; i < bytes.size();) {
    if (const size_t len = utf8_sequence_length(bytes, i); len > 0) {
      out.append(bytes.substr(i, len));
      i += len;
      continue;
    }
    const size_t part = subpart_length(bytes, i);
    if (part > 0 && i + part == bytes.size()) return i;  // a later byte may complete it
    out.append("\xEF\xBF\xBD");
    i += std::max<size_t>(1, part);
  }
  return bytes.size();
}

// ---- files and JSON
// ------------------------------------------------------------------------------

std::string quoted(const std::string& path) { return "'" + printable(path) + "'"; }

std::string read_file(const std::string& path, const std::string& where) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(where + ": no such file");
  if (!fs::is_regular_file(st)) fail(where + ": not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail(where + ": cannot read its size: " + ec.message());
  if (size > ByteLevelBPE::kMaxFileBytes)
    fail(where + ": " + std::to_string(size) + " bytes, over the limit of " +
         std::to_string(ByteLevelBPE::kMaxFileBytes) + " for a tokenizer.json");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(where + ": cannot open it");
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) fail(where + ": read error");
  return bytes;
}

// The messages of the reader: "ByteLevelBPE: '<file>': <json path> ...".
struct Where {
  std::string file;
  [[noreturn]] void bad(const std::string& path, const std::string& what) const {
    fail(file + ": " + path + " " + what);
  }
  [[noreturn]] void unsupported(const std::string& path, const json& value,
                                const std::string& supported) const {
    bad(path, train::json_excerpt(value) + " is not supported (" + supported + ")");
  }
};

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}
std::string index(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

// obj[key] as T, `fallback` when absent or null.
template <class T>
T field(const json& obj, const char* key, T fallback, const std::string& path, const Where& w) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return fallback;
  if (const std::string c = train::json_complaint<T>(obj[key]); !c.empty())
    w.bad(join(path, key), c);
  return obj[key].get<T>();
}

// A section's "type" ("null" for a null section).
std::string type_of(const json& section, const std::string& path, const Where& w) {
  if (section.is_null()) return "null";
  if (!section.is_object()) w.bad(path, "is not an object: " + train::json_excerpt(section));
  return field<std::string>(section, "type", "", path, w);
}

const json& member(const json& obj, const char* key) {
  static const json null;
  return obj.is_object() && obj.contains(key) ? obj[key] : null;
}

const json& array_member(const json& obj, const char* key, const std::string& path,
                         const Where& w) {
  const json& v = member(obj, key);
  if (!v.is_array()) w.bad(join(path, key), "must be a list, got " + train::json_excerpt(v));
  return v;
}

}  // namespace

// ---- the tokenizer's parts
// ------------------------------------------------------------------------

/// Everything that uses ICU or the JSON reader, kept out of the header.
struct ByteLevelBPE::Impl {
  /// A byte trie of the added tokens' texts: the longest one at a position.
  /// The added tokens' texts for finding the longest one starting at every byte in one pass:
  /// Aho-Corasick over the texts reversed, run over the text backwards (at most 2 steps a byte,
  /// whatever the number and length of the added tokens).
  struct Trie {
    std::unordered_map<uint64_t, int32_t> edges;  ///< node * 256 + byte -> child
    std::vector<int32_t> token{-1};               ///< index in added_ of the text ending here
    std::vector<int32_t> parent{-1}, depth{0};    ///< for the failure links
    std::vector<unsigned char> byte{0};           ///< the byte of the edge into a node
    std::vector<int32_t> fail, longest;           ///< failure link; node of the longest key, or -1
    void insert(std::string_view key, int32_t index);
    void build();
    int32_t child(int32_t node, unsigned char b) const {
      const auto it = edges.find(uint64_t(node) * 256 + b);
      return it == edges.end() ? -1 : it->second;
    }
    /// out[i]: the node of the longest key starting at text[i], or -1.
    void longest_at(std::string_view text, std::vector<int32_t>& out) const;
  };
  struct Merge {
    int32_t rank;
    int64_t id;
  };
  /// One step of the pre-tokenizer: a Split (its expression) or the ByteLevel (null expression
  /// unless use_regex).
  struct PreStep {
    std::unique_ptr<icu::RegexPattern> regex;
    bool byte_level = false;
    bool add_prefix_space = false;
  };

  std::unordered_map<std::string, int64_t> model_ids;  ///< the model's vocabulary
  std::unordered_map<std::string, int64_t> ids;        ///< and the added tokens
  std::unordered_map<int64_t, std::string> tokens;     ///< id -> token
  std::unordered_map<uint64_t, Merge> merges;          ///< (left id << 32 | right id) -> merge
  std::array<int64_t, 256> byte_ids{};                 ///< the id of each byte's token
  bool ignore_merges = false;
  std::vector<const icu::Normalizer2*> normalizers;
  std::vector<PreStep> pre_steps;
  Trie raw_added, normalized_added;  ///< the added tokens matched before / after normalising
  bool has_raw_added = false, has_normalized_added = false;
  std::unordered_set<int64_t> special;

  std::string normalize(const std::string& utf8) const;
  std::vector<std::string> pre_tokenize(std::string text) const;
  void append_word(const std::string& word, std::vector<int64_t>& out) const;
  void append_merged(std::vector<int64_t> symbols, std::vector<int64_t>& out) const;
};

void ByteLevelBPE::Impl::Trie::insert(std::string_view key, int32_t index) {
  int32_t node = 0;
  for (auto c = key.rbegin(); c != key.rend(); ++c) {
    const auto b = (unsigned char)*c;
    const auto [it, added] = edges.emplace(uint64_t(node) * 256 + b, (int32_t)token.size());
    if (added) {
      token.push_back(-1), parent.push_back(node), depth.push_back(depth[(size_t)node] + 1);
      byte.push_back(b);
    }
    node = it->second;
  }
  if (token[(size_t)node] < 0) token[(size_t)node] = index;
}

// The failure links in order of depth (a node's link is shallower than it), and with them the
// longest key that is a suffix of each node's string.
void ByteLevelBPE::Impl::Trie::build() {
  std::vector<int32_t> order(token.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = (int32_t)i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return depth[(size_t)a] < depth[(size_t)b]; });
  fail.assign(token.size(), 0);
  longest.assign(token.size(), -1);
  for (const int32_t v : order) {
    if (v == 0) continue;
    if (const int32_t u = parent[(size_t)v]; u != 0) {
      int32_t z = fail[(size_t)u], next = -1;
      while ((next = child(z, byte[(size_t)v])) < 0 && z != 0) z = fail[(size_t)z];
      fail[(size_t)v] = next < 0 ? 0 : next;
    }
    longest[(size_t)v] = token[(size_t)v] >= 0 ? v : longest[(size_t)fail[(size_t)v]];
  }
}

// Backwards: after text[i] the state is the longest reversed key prefix that ends the reversed
// text read, so its longest key is the longest added token starting at i.
void ByteLevelBPE::Impl::Trie::longest_at(std::string_view text, std::vector<int32_t>& out) const {
  out.assign(text.size(), -1);
  int32_t state = 0;
  for (size_t i = text.size(); i-- > 0;) {
    const auto b = (unsigned char)text[i];
    int32_t next;
    while ((next = child(state, b)) < 0 && state != 0) state = fail[(size_t)state];
    state = next < 0 ? 0 : next;
    out[i] = longest[(size_t)state];
  }
}

namespace {

// ---- reading tokenizer.json
// -----------------------------------------------------------------------

// "model": BPE with its vocabulary (ids in [0, 2^31)), nothing that changes ids we do not do.
void read_model_options(const json& model, ByteLevelBPE::Impl& impl, const Where& w) {
  const std::string type = type_of(model, "model", w);
  if (type != "BPE")
    w.unsupported("model.type", model.is_object() ? member(model, "type") : model, "BPE");
  const json& dropout = member(model, "dropout");
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0))
    w.unsupported("model.dropout", dropout, "null or 0: dropout makes the ids random");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = member(model, key);
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty()))
      w.unsupported(join("model", key), v, "null: byte-level BPE has none");
  }
  if (field(model, "byte_fallback", false, "model", w))
    w.unsupported("model.byte_fallback", true, "false: byte-level BPE needs no fallback");
  impl.ignore_merges = field(model, "ignore_merges", false, "model", w);
}

void read_vocab(const json& model, ByteLevelBPE::Impl& impl, const Where& w) {
  const json& vocab = member(model, "vocab");
  if (!vocab.is_object()) w.bad("model.vocab", "must be an object of token: id");
  std::unordered_map<int64_t, std::string> owner;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string path = "model.vocab[\"" + printable(it.key()) + "\"]";
    if (const std::string c = train::json_complaint<int32_t>(it.value());
        !c.empty() || it.value().get<int64_t>() < 0)
      w.bad(path,
            c.empty() ? "must be a non-negative id, got " + train::json_excerpt(it.value()) : c);
    const int64_t id = it.value().get<int64_t>();
    if (const auto [o, added] = owner.emplace(id, it.key()); !added)
      w.bad(path, "has the id " + std::to_string(id) + " of \"" + printable(o->second) + "\" too");
    impl.model_ids.emplace(it.key(), id);
    impl.tokens.emplace(id, it.key());
  }
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(byte_chars()[(size_t)b], c);
    const auto it = impl.model_ids.find(c);
    if (it == impl.model_ids.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      w.bad("model.vocab", std::string("has no token \"") + printable(c) + "\" for the byte " +
                               hex + " (a byte-level vocabulary has all 256)");
    }
    impl.byte_ids[(size_t)b] = it->second;
  }
  impl.ids = impl.model_ids;
}

// A merge's two parts: "a b" (one space) or ["a", "b"].
std::pair<std::string, std::string> merge_parts(const json& m, const std::string& path,
                                                const Where& w) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
      w.bad(path, "\"" + printable(s) + "\" is not two tokens separated by one space");
    return {s.substr(0, space), s.substr(space + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  w.bad(path, "must be \"a b\" or [\"a\", \"b\"], got " + train::json_excerpt(m));
}

// Rank = index in the list; a pair listed twice keeps its last rank, as tokenizers' map does.
void read_merges(const json& model, ByteLevelBPE::Impl& impl, const Where& w) {
  const json& merges = array_member(model, "merges", "model", w);
  impl.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string path = index("model.merges", i);
    const auto [a, b] = merge_parts(merges[i], path, w);
    auto id_of = [&](const std::string& t, const char* what) {
      const auto it = impl.model_ids.find(t);
      if (it == impl.model_ids.end())
        w.bad(path, std::string("(\"") + printable(a) + "\", \"" + printable(b) + "\"): its " +
                        what + " \"" + printable(t) + "\" is not in model.vocab");
      return it->second;
    };
    const int64_t left = id_of(a, "left part"), right = id_of(b, "right part");
    const int64_t merged = id_of(a + b, "result");
    if (i > (size_t)INT32_MAX) w.bad("model.merges", "has more than 2^31 entries");
    impl.merges[uint64_t(left) << 32 | uint64_t(right)] = {(int32_t)i, merged};
  }
}

const icu::Normalizer2* normalizer_named(const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "NFC") n = icu::Normalizer2::getNFCInstance(status);
  else if (type == "NFD") n = icu::Normalizer2::getNFDInstance(status);
  else if (type == "NFKC") n = icu::Normalizer2::getNFKCInstance(status);
  else if (type == "NFKD") n = icu::Normalizer2::getNFKDInstance(status);
  else return nullptr;
  if (U_FAILURE(status))
    fail(std::string("ByteLevelBPE: ICU's ") + type + ": " + u_errorName(status));
  return n;
}

void read_normalizer(const json& n, const std::string& path, ByteLevelBPE::Impl& impl,
                     const Where& w) {
  const std::string type = type_of(n, path, w);
  if (type == "null") return;
  if (type == "Sequence") {
    const json& list = array_member(n, "normalizers", path, w);
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(list[i], index(join(path, "normalizers"), i), impl, w);
    return;
  }
  const icu::Normalizer2* normalizer = normalizer_named(type);
  if (!normalizer)
    w.unsupported(join(path, "type"), type, "NFC, NFD, NFKC, NFKD or a Sequence of them");
  impl.normalizers.push_back(normalizer);
}

// tokenizers' regular expressions run in Oniguruma, whose \s is Unicode's White_Space; ICU's
// documentation gives \s a smaller set (no U+000B, U+0085), so both are spelt out.
std::string with_white_space_classes(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char next = pattern[++i];
    if (next == 's') out += "\\p{White_Space}";
    else if (next == 'S') out += "\\P{White_Space}";
    else out.push_back('\\'), out.push_back(next);
  }
  return out;
}

std::unique_ptr<icu::RegexPattern> compile(const std::string& pattern, bool literal,
                                           const std::string& path, const Where& w) {
  UParseError where{};
  UErrorCode status = U_ZERO_ERROR;
  const std::string source = literal ? pattern : with_white_space_classes(pattern);
  std::unique_ptr<icu::RegexPattern> re(icu::RegexPattern::compile(
      icu::UnicodeString::fromUTF8(source), literal ? UREGEX_LITERAL : 0, where, status));
  if (U_FAILURE(status))
    w.bad(path, "\"" + printable(pattern) + "\" is not a regular expression ICU accepts (" +
                    u_errorName(status) + " at offset " + std::to_string(where.offset) + ")");
  return re;
}

// GPT-2's expression, which a ByteLevel pre-tokenizer with use_regex runs (tokenizers'
// byte_level.rs).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

ByteLevelBPE::Impl::PreStep read_split(const json& s, const std::string& path, const Where& w) {
  const json& pattern = member(s, "pattern");
  const bool regex =
      pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string();
  const bool literal =
      pattern.is_object() && pattern.contains("String") && pattern["String"].is_string();
  if (!regex && !literal)
    w.bad(join(path, "pattern"), "must be {\"Regex\": \"...\"} or {\"String\": \"...\"}, got " +
                                     train::json_excerpt(pattern));
  const std::string behavior = field<std::string>(s, "behavior", "", path, w);
  if (behavior != "Isolated") w.unsupported(join(path, "behavior"), behavior, "Isolated");
  if (field(s, "invert", false, path, w)) w.unsupported(join(path, "invert"), true, "false");
  const std::string text = pattern[regex ? "Regex" : "String"].get<std::string>();
  ByteLevelBPE::Impl::PreStep step;
  step.regex = compile(text, literal, join(path, regex ? "pattern.Regex" : "pattern.String"), w);
  return step;
}

void read_pre_tokenizer(const json& p, const std::string& path, ByteLevelBPE::Impl& impl,
                        const Where& w) {
  const std::string type = type_of(p, path, w);
  if (!impl.pre_steps.empty() && impl.pre_steps.back().byte_level)
    w.bad(path, "follows the ByteLevel pre-tokenizer, which must come last");
  if (type == "Sequence") {
    const json& list = array_member(p, "pretokenizers", path, w);
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], index(join(path, "pretokenizers"), i), impl, w);
  } else if (type == "Split") {
    impl.pre_steps.push_back(read_split(p, path, w));
  } else if (type == "ByteLevel") {
    ByteLevelBPE::Impl::PreStep step;
    step.byte_level = true;
    step.add_prefix_space = field(p, "add_prefix_space", true, path, w);
    if (field(p, "use_regex", true, path, w))
      step.regex = compile(kGpt2Pattern, false, join(path, "use_regex"), w);
    impl.pre_steps.push_back(std::move(step));
  } else {
    w.unsupported(join(path, "type"), type == "null" ? json() : json(type),
                  "ByteLevel, Split or a Sequence of Splits then ByteLevel");
  }
}

BPEAddedToken read_added_token(const json& t, const std::string& path, const Where& w) {
  BPEAddedToken a;
  if (!t.is_object()) w.bad(path, "must be an object, got " + train::json_excerpt(t));
  a.id = field<int64_t>(t, "id", -1, path, w);
  if (a.id < 0 || a.id > INT32_MAX) w.bad(join(path, "id"), "must be an id in [0, 2^31)");
  a.content = field<std::string>(t, "content", "", path, w);
  if (a.content.empty()) w.bad(join(path, "content"), "must be a non-empty string");
  a.special = field(t, "special", false, path, w);
  a.lstrip = field(t, "lstrip", false, path, w);
  a.rstrip = field(t, "rstrip", false, path, w);
  a.single_word = field(t, "single_word", false, path, w);
  a.normalized = field(t, "normalized", !a.special, path, w);
  return a;
}

// An added token in the model's vocabulary keeps its id there; one outside takes an id no model
// token has.
void check_added_id(const BPEAddedToken& a, const ByteLevelBPE::Impl& impl, const std::string& path,
                    const Where& w) {
  if (const auto it = impl.ids.find(a.content); it != impl.ids.end() && it->second != a.id)
    w.bad(join(path, "id"), std::to_string(a.id) + " of \"" + printable(a.content) +
                                "\" is not its id " + std::to_string(it->second) +
                                " in the vocabulary");
  if (const auto it = impl.tokens.find(a.id); it != impl.tokens.end() && it->second != a.content)
    w.bad(join(path, "id"), std::to_string(a.id) + " of \"" + printable(a.content) +
                                "\" is the id of \"" + printable(it->second) + "\"");
}

void read_added_tokens(const json& list, ByteLevelBPE::Impl& impl,
                       std::vector<BPEAddedToken>& added, const Where& w) {
  if (list.is_null()) return;
  if (!list.is_array()) w.bad("added_tokens", "must be a list, got " + train::json_excerpt(list));
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = index("added_tokens", i);
    BPEAddedToken a = read_added_token(list[i], path, w);
    check_added_id(a, impl, path, w);
    impl.ids.emplace(a.content, a.id);
    impl.tokens.emplace(a.id, a.content);
    if (a.special) impl.special.insert(a.id);
    if (a.normalized) {
      impl.normalized_added.insert(impl.normalize(a.content), (int32_t)added.size());
      impl.has_normalized_added = true;
    } else {
      impl.raw_added.insert(a.content, (int32_t)added.size());
      impl.has_raw_added = true;
    }
    added.push_back(std::move(a));
  }
}

// The ids of a template's special token: special_tokens[name].ids, each a known id.
std::vector<int64_t> template_ids(const json& post, const std::string& name,
                                  const ByteLevelBPE::Impl& impl, const std::string& path,
                                  const Where& w) {
  const json& entry = member(member(post, "special_tokens"), name.c_str());
  const std::string entry_path = "special_tokens[\"" + printable(name) + "\"]";
  const json& ids = member(entry, "ids");
  if (const std::string c = train::json_complaint<std::vector<int64_t>>(ids); !c.empty())
    w.bad(path, "names " + entry_path + ", whose \"ids\" " + c);
  for (const int64_t id : ids.get<std::vector<int64_t>>())
    if (!impl.tokens.count(id))
      w.bad(path, "names " + entry_path + ", whose id " + std::to_string(id) + " has no token");
  return ids.get<std::vector<int64_t>>();
}

// TemplateProcessing's "single": the special tokens before and after the one sequence $A.
void read_template(const json& post, const std::string& path, const ByteLevelBPE::Impl& impl,
                   std::vector<int64_t>& prefix, std::vector<int64_t>& suffix, const Where& w) {
  const json& single = array_member(post, "single", path, w);
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item_path = index(join(path, "single"), i);
    const json& item = single[i];
    const json& sequence = member(item, "Sequence");
    const json& special = member(member(item, "SpecialToken"), "id");
    if (!sequence.is_null()) {
      if (seen_a || member(sequence, "id") != "A")
        w.unsupported(item_path, item, "one {\"Sequence\": {\"id\": \"A\"}}");
      seen_a = true;
    } else if (special.is_string()) {
      const auto ids = template_ids(post, special.get<std::string>(), impl, item_path, w);
      (seen_a ? suffix : prefix).insert((seen_a ? suffix : prefix).end(), ids.begin(), ids.end());
    } else {
      w.unsupported(item_path, item, "{\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    }
  }
  if (!seen_a) w.bad(join(path, "single"), "has no {\"Sequence\": {\"id\": \"A\"}}");
}

void read_post_processor(const json& post, const std::string& path, const ByteLevelBPE::Impl& impl,
                         std::vector<int64_t>& prefix, std::vector<int64_t>& suffix,
                         bool& have_template, const Where& w) {
  const std::string type = type_of(post, path, w);
  if (type == "null" || type == "ByteLevel") return;  // ByteLevel changes offsets only
  if (type == "Sequence") {
    const json& list = array_member(post, "processors", path, w);
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(list[i], index(join(path, "processors"), i), impl, prefix, suffix,
                          have_template, w);
  } else if (type == "TemplateProcessing" && !have_template) {
    read_template(post, path, impl, prefix, suffix, w);
    have_template = true;
  } else {
    w.unsupported(join(path, "type"), type,
                  "ByteLevel, one TemplateProcessing, or a Sequence of them");
  }
}

// Truncation and padding would change the ids of one text; padding to the longest of a batch
// does not.
void check_batch_fields(const json& doc, const Where& w) {
  if (const json& t = member(doc, "truncation"); !t.is_null())
    w.unsupported("truncation", t, "null");
  const json& padding = member(doc, "padding");
  if (padding.is_null()) return;
  if (member(padding, "strategy") != "BatchLongest")
    w.unsupported("padding.strategy", member(padding, "strategy"),
                  "\"BatchLongest\" or no padding");
  if (const json& m = member(padding, "pad_to_multiple_of"); !m.is_null())
    w.unsupported("padding.pad_to_multiple_of", m, "null");
}

void read_decoder(const json& decoder, const Where& w) {
  const std::string type = type_of(decoder, "decoder", w);
  if (type != "ByteLevel")
    w.unsupported("decoder.type", type == "null" ? json() : json(type), "ByteLevel");
}

void check_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0)
      fail("ByteLevelBPE: the text is not valid UTF-8 at byte " + std::to_string(i) + " (" +
           printable(s.substr(i, std::min<size_t>(4, s.size() - i))) + ")");
    i += len;
  }
}

// The code point that ends text (non-empty, valid UTF-8), and where it starts.
char32_t last_code_point(std::string_view text, size_t& start) {
  start = text.size() - 1;
  while (start > 0 && ((unsigned char)text[start] & 0xC0) == 0x80) --start;
  return code_point_at(text, start, text.size() - start);
}

bool is_white_space(char32_t c) { return u_hasBinaryProperty((UChar32)c, UCHAR_WHITE_SPACE); }

// The regex crate's Unicode \w, which tokenizers' single_word tests at a token's edges.
bool is_word_char(char32_t c) {
  const auto u = (UChar32)c;
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

bool ends_with_word(std::string_view text) {
  size_t start;
  return !text.empty() && is_word_char(last_code_point(text, start));
}

bool starts_with_word(std::string_view text) {
  if (text.empty()) return false;
  const size_t len = std::max<size_t>(1, utf8_sequence_length(text, 0));
  return is_word_char(code_point_at(text, 0, len));
}

// Where the whitespace that ends text[0, end) starts.
size_t white_space_start(std::string_view text, size_t end) {
  size_t start = end;
  while (start > 0) {
    size_t at;
    if (!is_white_space(last_code_point(text.substr(0, start), at))) break;
    start = at;
  }
  return start;
}

// Where the whitespace that starts text[begin, ...) ends.
size_t white_space_end(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    const size_t len = std::max<size_t>(1, utf8_sequence_length(text, begin));
    if (!is_white_space(code_point_at(text, begin, len))) break;
    begin += len;
  }
  return begin;
}

/// A part of the text: an added token's id, or text for the model (id -1).
struct Part {
  size_t begin, end;
  int64_t id;
};

// tokenizers' AddedVocabulary::find_matches: the leftmost longest added token, again after it;
// a single_word one not between word boundaries skipped; lstrip and rstrip taking the
// whitespace beside it.
void split_added(std::string_view text, const ByteLevelBPE::Impl::Trie& trie,
                 const std::vector<BPEAddedToken>& added, std::vector<Part>& parts) {
  std::vector<int32_t> longest;
  trie.longest_at(text, longest);
  size_t done = 0;
  for (size_t i = 0; i < text.size();) {
    const int32_t node = longest[i];
    if (node < 0) {
      ++i;
      continue;
    }
    const BPEAddedToken& a = added[(size_t)trie.token[(size_t)node]];
    size_t start = i, stop = i + (size_t)trie.depth[(size_t)node];
    i = stop;
    if (a.single_word &&
        (ends_with_word(text.substr(0, start)) || starts_with_word(text.substr(stop))))
      continue;
    if (a.lstrip) start = white_space_start(text, start);
    if (a.rstrip) stop = white_space_end(text, stop);
    start = std::max(start, done);  // whitespace an rstrip before already took
    if (done < start) parts.push_back({done, start, -1});
    parts.push_back({start, stop, a.id});
    done = stop;
  }
  if (done < text.size()) parts.push_back({done, text.size(), -1});
}

// Isolated: each match a piece, and the text between matches too; empty pieces dropped.
void split_isolated(const icu::RegexPattern& re, const std::string& text,
                    std::vector<std::string>& out) {
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(re.matcher(u, status));
  auto emit = [&](int32_t begin, int32_t end) {
    if (end <= begin) return;
    std::string piece;
    out.push_back(u.tempSubStringBetween(begin, end).toUTF8String(piece));
  };
  int32_t done = 0;
  while (U_SUCCESS(status) && m->find(status)) {
    const int32_t begin = m->start(status), end = m->end(status);
    emit(done, begin);
    emit(begin, end);
    done = end;
  }
  if (U_FAILURE(status))
    fail(std::string("ByteLevelBPE: the pre-tokenizer's expression: ") + u_errorName(status));
  emit(done, u.length());
}

}  // namespace

std::string ByteLevelBPE::Impl::normalize(const std::string& utf8) const {
  if (normalizers.empty()) return utf8;
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(utf8);
  for (const icu::Normalizer2* n : normalizers) {
    UErrorCode status = U_ZERO_ERROR;
    s = n->normalize(s, status);
    if (U_FAILURE(status)) fail(std::string("ByteLevelBPE: normalising: ") + u_errorName(status));
  }
  std::string out;
  return s.toUTF8String(out);
}

std::vector<std::string> ByteLevelBPE::Impl::pre_tokenize(std::string text) const {
  std::vector<std::string> pieces, next;
  pieces.push_back(std::move(text));
  for (const PreStep& step : pre_steps) {
    next.clear();
    for (std::string& piece : pieces) {
      if (piece.empty()) continue;
      if (step.byte_level && step.add_prefix_space && piece[0] != ' ') piece.insert(0, " ");
      if (step.regex) split_isolated(*step.regex, piece, next);
      else next.push_back(std::move(piece));
    }
    pieces.swap(next);
  }
  return pieces;
}

// With ignore_merges, a word that is a token is that token; else one symbol per byte, merged.
void ByteLevelBPE::Impl::append_word(const std::string& word, std::vector<int64_t>& out) const {
  if (ignore_merges) {
    std::string mapped;
    for (const char b : word) append_utf8(byte_chars()[(unsigned char)b], mapped);
    if (const auto it = model_ids.find(mapped); it != model_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int64_t> symbols;
  symbols.reserve(word.size());
  for (const char b : word) symbols.push_back(byte_ids[(unsigned char)b]);
  append_merged(std::move(symbols), out);
}

// tokenizers' Word::merge_all: a queue of the adjacent pairs that merge, lowest rank first and
// leftmost among equals; an entry whose pair has changed since is skipped unless the pair now
// there makes the same token. O(n log n) in the word's bytes.
void ByteLevelBPE::Impl::append_merged(std::vector<int64_t> c, std::vector<int64_t>& out) const {
  struct Entry {
    int32_t rank, pos;
    int64_t id;
    bool operator<(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = (int32_t)c.size();
  std::vector<int32_t> prev(c.size()), next(c.size());
  std::vector<bool> alive(c.size(), true);
  for (int32_t i = 0; i < n; ++i) prev[(size_t)i] = i - 1, next[(size_t)i] = i + 1 < n ? i + 1 : -1;
  auto lookup = [&](int32_t a, int32_t b) -> const Merge* {
    const auto it = merges.find(uint64_t(c[(size_t)a]) << 32 | uint64_t(c[(size_t)b]));
    return it == merges.end() ? nullptr : &it->second;
  };
  std::priority_queue<Entry> queue;
  auto push = [&](int32_t a, int32_t b) {
    if (const Merge* m = lookup(a, b)) queue.push({m->rank, a, m->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    const auto pos = (size_t)top.pos;
    if (!alive[pos] || next[pos] < 0) continue;
    const int32_t right = next[pos];
    if (const Merge* m = lookup(top.pos, right); !m || m->id != top.id) continue;
    c[pos] = top.id;
    alive[(size_t)right] = false;
    next[pos] = next[(size_t)right];
    if (next[pos] >= 0) prev[(size_t)next[pos]] = top.pos;
    if (prev[pos] >= 0) push(prev[pos], top.pos);
    if (next[pos] >= 0) push(top.pos, next[pos]);
  }
  for (size_t i = 0; i < c.size(); ++i)
    if (alive[i]) out.push_back(c[i]);
}

// ---- ByteLevelBPE
// ---------------------------------------------------------------------------------

ByteLevelBPE::ByteLevelBPE(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ByteLevelBPE::~ByteLevelBPE() = default;
ByteLevelBPE::ByteLevelBPE(ByteLevelBPE&&) noexcept = default;
ByteLevelBPE& ByteLevelBPE::operator=(ByteLevelBPE&&) noexcept = default;

ByteLevelBPE ByteLevelBPE::from_tokenizer_json(const std::string& path) {
  const Where w{"ByteLevelBPE: " + quoted(path)};
  const json doc = train::parse_json(read_file(path, w.file), w.file, 64);
  if (!doc.is_object()) fail(w.file + ": not a JSON object");
  auto impl = std::make_unique<Impl>();
  const json& model = member(doc, "model");
  read_model_options(model, *impl, w);
  read_vocab(model, *impl, w);
  read_merges(model, *impl, w);
  check_batch_fields(doc, w);
  read_normalizer(member(doc, "normalizer"), "normalizer", *impl, w);
  read_pre_tokenizer(member(doc, "pre_tokenizer"), "pre_tokenizer", *impl, w);
  if (impl->pre_steps.empty() || !impl->pre_steps.back().byte_level)
    w.bad("pre_tokenizer", "does not end with a ByteLevel pre-tokenizer");
  std::vector<BPEAddedToken> added;
  read_added_tokens(member(doc, "added_tokens"), *impl, added, w);
  impl->raw_added.build();
  impl->normalized_added.build();
  std::vector<int64_t> prefix, suffix;
  bool have_template = false;
  read_post_processor(member(doc, "post_processor"), "post_processor", *impl, prefix, suffix,
                      have_template, w);
  read_decoder(member(doc, "decoder"), w);
  int64_t size = 0;
  for (const auto& [id, token] : impl->tokens) size = std::max(size, id + 1);
  ByteLevelBPE bpe(std::move(impl));
  bpe.added_ = std::move(added);
  bpe.prefix_ = std::move(prefix);
  bpe.suffix_ = std::move(suffix);
  bpe.vocab_size_ = size;
  return bpe;
}

// tokenizers' order: the raw-text added tokens out first, the rest normalised, then the
// normalised added tokens out, then the pre-tokenizer's words through the model.
std::vector<int64_t> ByteLevelBPE::encode(const std::string& utf8, bool add_special_tokens) const {
  check_utf8(utf8);
  const Impl& impl = *impl_;
  std::vector<int64_t> ids;
  if (add_special_tokens) ids = prefix_;
  std::vector<Part> parts, inner;
  if (impl.has_raw_added) split_added(utf8, impl.raw_added, added_, parts);
  else if (!utf8.empty()) parts.push_back({0, utf8.size(), -1});
  for (const Part& part : parts) {
    if (part.id >= 0) {
      ids.push_back(part.id);
      continue;
    }
    const std::string text = impl.normalize(utf8.substr(part.begin, part.end - part.begin));
    inner.clear();
    if (impl.has_normalized_added) split_added(text, impl.normalized_added, added_, inner);
    else if (!text.empty()) inner.push_back({0, text.size(), -1});
    for (const Part& p : inner) {
      if (p.id >= 0) {
        ids.push_back(p.id);
        continue;
      }
      for (const std::string& word : impl.pre_tokenize(text.substr(p.begin, p.end - p.begin)))
        impl.append_word(word, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

std::string ByteLevelBPE::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const int64_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return utf8_lossy(bytes);
}

std::optional<int64_t> ByteLevelBPE::token_to_id(const std::string& token) const {
  const auto it = impl_->ids.find(token);
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

const std::string& ByteLevelBPE::id_to_token(int64_t id) const {
  const auto it = impl_->tokens.find(id);
  if (it == impl_->tokens.end())
    fail("ByteLevelBPE: the id " + std::to_string(id) + " has no token (the vocabulary has " +
         std::to_string(impl_->tokens.size()) + " ids in [0, " + std::to_string(vocab_size_) +
         "))");
  return it->second;
}

std::vector<int64_t> ByteLevelBPE::special_ids() const {
  std::vector<int64_t> ids(impl_->special.begin(), impl_->special.end());
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool ByteLevelBPE::is_special(int64_t id) const { return impl_->special.count(id) > 0; }

std::optional<int64_t> ByteLevelBPE::bos_id() const {
  if (prefix_.size() != 1) return std::nullopt;
  return prefix_[0];
}

std::string ByteLevelBPE::token_bytes(int64_t id) const {
  const std::string& token = id_to_token(id);
  return bytes_of_chars(token).value_or(token);
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  if (append_lossy(bytes, out) < bytes.size()) out.append("\xEF\xBF\xBD");
  return out;
}

// ---- BPEStreamDecoder
// -----------------------------------------------------------------------------

BPEStreamDecoder::BPEStreamDecoder(const ByteLevelBPE& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string BPEStreamDecoder::push(int64_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  std::string out;
  pending_.erase(0, append_lossy(pending_, out));
  return out;
}

std::string BPEStreamDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace graft::text
