// The reference check's C++ side (tests/bpe_reference.sh): text::ByteLevelBPE's ids and texts for
// every line of some files, in the form the script's `tokenizers` side writes.
//   bpe_ids TOKENIZER_JSON FILE...
// Per file "# FILE", then per line ('\n' ends a line; a '\r' stays in it), four fields split by
// '\t': the ids of encode(line, add_special_tokens = true); those of encode(line, false);
// decode(the second ids); decode(the first ids, skip_special_tokens = true). A line that is not
// UTF-8 is "invalid". The streaming decoder, fed the second ids one at a time, must give the
// same text as decode: a difference is an error (exit 1). A repeated line is computed once.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <unordered_map>
#include <vector>

#include "graft/autograd/tensor.h"
#include "graft/nn/text/bpe.h"

using graft::text::BPEStreamDecoder;
using graft::text::ByteLevelBPE;

namespace {

void append_ids(const std::vector<int64_t>& ids, std::string& out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(' ');
    out.append(std::to_string(ids[i]));
  }
}

std::string streamed(const ByteLevelBPE& bpe, const std::vector<int64_t>& ids) {
  BPEStreamDecoder stream(bpe);
  std::string text;
  for (const int64_t id : ids) text += stream.push(id);
  return text + stream.finish();
}

void append_line(const ByteLevelBPE& bpe, const std::string& line, std::string& out) {
  std::vector<int64_t> with, without;
  try {
    with = bpe.encode(line, true);
    without = bpe.encode(line, false);
  } catch (const graft::Error&) {
    out += "invalid\n";
    return;
  }
  const std::string text = bpe.decode(without);
  if (streamed(bpe, without) != text)
    graft::fail("bpe_ids: the streaming decoder differs from decode on the line \"" + line + "\"");
  append_ids(with, out);
  out += '\t';
  append_ids(without, out);
  out.append("\t").append(text).append("\t").append(bpe.decode(with, true)).append("\n");
}

// The row of each distinct line, computed once (a fortune file repeats many lines).
using Rows = std::unordered_map<std::string, std::string>;

void print_file(const ByteLevelBPE& bpe, const std::string& path, Rows& rows) {
  std::ifstream in(path, std::ios::binary);
  if (!in) graft::fail("bpe_ids: cannot open '" + path + "'");
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::string out = "# " + path + "\n";
  for (size_t begin = 0; begin < bytes.size();) {
    size_t end = bytes.find('\n', begin);
    if (end == std::string::npos) end = bytes.size();
    const std::string line = bytes.substr(begin, end - begin);
    auto [row, added] = rows.try_emplace(line);
    if (added) append_line(bpe, line, row->second);
    out += row->second;
    begin = end + 1;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: bpe_ids TOKENIZER_JSON FILE...\n";
    return 2;
  }
  try {
    const ByteLevelBPE bpe = ByteLevelBPE::from_tokenizer_json(argv[1]);
    Rows rows;
    for (int i = 2; i < argc; ++i) print_file(bpe, argv[i], rows);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bpe_ids: " << e.what() << "\n";
    return 1;
  }
}
