// The reference check's C++ side (tests/spm_reference.sh): text::LlamaTokenizer's ids and texts,
// in the form the script's Python side writes.
//   spm_ids MODEL FILE...        per file "# FILE", then per line ('\n' ends a line) the ids of
//                                encode(line) (the BOS first), '\t', the hex of decode(those ids);
//                                "invalid" for a line that is not UTF-8
//   spm_ids --decode MODEL IDS   per line of IDS (ids split by spaces) the hex of decode(ids)
// The streaming decoder, fed the ids one at a time, must give decode's text, its output so far a
// prefix of it after each id: a difference is an error (exit 1). A repeated line is computed once.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "graft/autograd/tensor.h"
#include "graft/nn/text/llama_tokenizer.h"

using graft::text::LlamaStreamDecoder;
using graft::text::LlamaTokenizer;

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) out.append({digits[c >> 4], digits[c & 15]});
  return out;
}

// decode(ids), checked against the streaming decoder.
std::string decoded(const LlamaTokenizer& tok, const std::vector<int64_t>& ids) {
  const std::string text = tok.decode(ids);
  LlamaStreamDecoder stream(tok);
  std::string printed;
  for (const int64_t id : ids) {
    printed += stream.push(id);
    if (text.compare(0, printed.size(), printed) != 0)
      graft::fail("spm_ids: the streaming decoder's text is not a prefix of decode's (" +
                  hex(printed) + ", " + hex(text) + ")");
  }
  if (printed + stream.finish() != text)
    graft::fail("spm_ids: the streaming decoder differs from decode (" + hex(text) + ")");
  return hex(text);
}

std::string row(const LlamaTokenizer& tok, const std::string& line) {
  std::vector<int64_t> ids;
  try {
    ids = tok.encode(line);
  } catch (const graft::Error&) {
    return "invalid\n";
  }
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out + "\t" + decoded(tok, ids) + "\n";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) graft::fail("spm_ids: cannot open '" + path + "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The row of each distinct line, computed once (a fortune file repeats many lines).
void print_file(const LlamaTokenizer& tok, const std::string& path,
                std::unordered_map<std::string, std::string>& rows) {
  const std::string bytes = read_file(path);
  std::string out = "# " + path + "\n";
  for (size_t begin = 0; begin < bytes.size();) {
    size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();
    const std::string line = bytes.substr(begin, end - begin);
    auto [it, added] = rows.try_emplace(line);
    if (added) it->second = row(tok, line);
    out += it->second;
    begin = end + 1;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void print_decoded(const LlamaTokenizer& tok, const std::string& path) {
  std::istringstream lines(read_file(path));
  std::string line, out;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::vector<int64_t> ids;
    for (int64_t id; fields >> id;) ids.push_back(id);
    out += decoded(tok, ids) + "\n";
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool decode = argc > 1 && std::string(argv[1]) == "--decode";
  if (argc < 3 || (decode && argc != 4)) {
    std::cerr << "usage: spm_ids MODEL FILE... | spm_ids --decode MODEL IDS\n";
    return 2;
  }
  try {
    const LlamaTokenizer tok(argv[decode ? 2 : 1]);
    if (decode) print_decoded(tok, argv[3]);
    std::unordered_map<std::string, std::string> rows;
    for (int i = 2; !decode && i < argc; ++i) print_file(tok, argv[i], rows);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "spm_ids: " << e.what() << "\n";
    return 1;
  }
}
