// The reference check's C++ side (tests/wordpiece_reference.sh): text::WordPiece's ids for every
// line of some files, or its per-character normalisation table, in the forms the script's
// `tokenizers` side writes.
//   wordpiece_ids MODEL_DIR FILE...  "# FILE" then, per line ('\n' ends a line), its ids with
//                                    [CLS] and [SEP] (no truncation), or "invalid" for a line
//                                    that is not UTF-8
//   wordpiece_ids --chars            per code point (no surrogates): hex | clean_text alone |
//                                    handle_chinese_chars alone | strip_accents alone |
//                                    lowercase alone | the pre-tokenizer's class of "a" c "b"
//                                    (P split off, W whitespace, - neither), each text in hex;
//                                    then "|u" for a code point unassigned in ICU's Unicode
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <unicode/uchar.h>

#include "graft/autograd/tensor.h"
#include "graft/nn/text/wordpiece.h"

using graft::text::WordPiece;
using graft::text::WordPieceOptions;

namespace {

std::string hex_code_points(const std::string& utf8) {
  std::string out;
  char buf[16];
  for (size_t i = 0; i < utf8.size();) {
    const auto b = (unsigned char)utf8[i];
    const size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    uint32_t c = len == 1 ? b : b & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) c = (c << 6) | ((unsigned char)utf8[i + k] & 0x3F);
    std::snprintf(buf, sizeof buf, out.empty() ? "%X" : " %X", c);
    out += buf;
    i += len;
  }
  return out;
}

std::string utf8_of(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += (char)c;
  } else if (c < 0x800) {
    s += (char)(0xC0 | (c >> 6)), s += (char)(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += (char)(0xE0 | (c >> 12)), s += (char)(0x80 | ((c >> 6) & 0x3F)),
        s += (char)(0x80 | (c & 0x3F));
  } else {
    s += (char)(0xF0 | (c >> 18)), s += (char)(0x80 | ((c >> 12) & 0x3F));
    s += (char)(0x80 | ((c >> 6) & 0x3F)), s += (char)(0x80 | (c & 0x3F));
  }
  return s;
}

// Not assigned in ICU's Unicode version (a newer character, whose case mapping ICU lacks).
bool unknown_to_icu(uint32_t c) {
  UVersionInfo age;
  u_charAge((UChar32)c, age);
  return age[0] == 0 && age[1] == 0;
}

WordPiece with_one_step(int step) {
  WordPieceOptions o;
  o.clean_text = step == 0;
  o.handle_chinese_chars = step == 1;
  o.strip_accents = step == 2;
  o.lowercase = step == 3;
  o.added_tokens = std::vector<std::string>{};
  return WordPiece({"[PAD]", "[UNK]", "[CLS]", "[SEP]"}, o);
}

void print_chars() {
  std::vector<WordPiece> steps;
  for (int step = 0; step < 5; ++step) steps.push_back(with_one_step(step));  // 4: nothing
  std::string out;
  char buf[16];
  for (uint32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c < 0xE000) continue;
    const std::string s = utf8_of(c);
    std::snprintf(buf, sizeof buf, "%X", c);
    out += buf;
    for (int step = 0; step < 4; ++step)
      out.append("|").append(hex_code_points(steps[step].normalize(s)));
    std::string between = "a";
    between.append(s).push_back('b');
    const std::vector<std::string> words = steps[4].basic_tokenize(between);
    out += words.size() == 3 ? "|P" : words.size() == 2 ? "|W" : "|-";
    out += unknown_to_icu(c) ? "|u\n" : "\n";
    if (out.size() > (1 << 20)) std::fwrite(out.data(), 1, out.size(), stdout), out.clear();
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void print_ids(const WordPiece& wp, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) graft::fail("wordpiece_ids: cannot open '" + path + "'");
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::string out = "# " + path + "\n";
  for (size_t begin = 0; begin < bytes.size();) {
    size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();
    try {
      const auto ids = wp.encode_with_specials(bytes.substr(begin, end - begin),
                                               std::numeric_limits<int64_t>::max());
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out.push_back(' ');
        out.append(std::to_string(ids[i]));
      }
      out += '\n';
    } catch (const graft::Error&) {
      out += "invalid\n";
    }
    begin = end + 1;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 2 && std::string(argv[1]) == "--chars") {
      print_chars();
      return 0;
    }
    if (argc < 3) {
      std::cerr << "usage: wordpiece_ids MODEL_DIR FILE... | wordpiece_ids --chars\n";
      return 2;
    }
    const WordPiece wp = WordPiece::from_directory(argv[1]);
    for (int i = 2; i < argc; ++i) print_ids(wp, argv[i]);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "wordpiece_ids: " << e.what() << "\n";
    return 1;
  }
}
