#include "corpus.h"

#include "examples/common/lines.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace graft::text {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

size_t count_words(std::string_view s) {
  size_t n = 0;
  bool in_word = false;
  for (char c : s) {
    if (is_space(c)) {
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      ++n;
    }
  }
  return n;
}

}  // namespace

std::string CorpusStats::summary() const {
  return "read=" + std::to_string(read) + " kept=" + std::to_string(kept) +
         " empty=" + std::to_string(empty) + " malformed=" + std::to_string(malformed) +
         " bad_utf8=" + std::to_string(bad_utf8) + " too_long=" + std::to_string(too_long);
}

std::vector<Pair> read_tsv(const std::string& path, CorpusStats& stats, size_t max_bytes,
                           size_t max_words) {
  check_input_file("read_tsv", path);  // not /dev/zero, not over 1 GiB
  // stdio rather than iostreams: fopen reliably sets errno for the error message.
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    throw std::runtime_error("read_tsv: cannot open '" + path + "': " + std::strerror(errno));
  }
  std::vector<Pair> out;
  bool first = true;
  LineReader reader(f.get(), max_bytes ? max_bytes : kHardLineCap);
  std::string buf;
  bool too_long = false;
  while (reader.next(buf, too_long, "read_tsv: error reading '" + path + "'")) {
    ++stats.read;
    if (too_long) {
      ++stats.too_long;
      first = false;
      continue;
    }
    std::string_view line(buf);
    if (first && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
    first = false;

    if (trim(line).empty()) {
      ++stats.empty;
      continue;
    }
    if (!valid_utf8(line)) {
      ++stats.bad_utf8;
      continue;
    }
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos || line.find('\t', tab + 1) != std::string_view::npos) {
      ++stats.malformed;
      continue;
    }
    const std::string_view src = trim(line.substr(0, tab));
    const std::string_view tgt = trim(line.substr(tab + 1));
    if (src.empty() || tgt.empty()) {
      ++stats.malformed;
      continue;
    }
    if (max_words && (count_words(src) > max_words || count_words(tgt) > max_words)) {
      ++stats.too_long;
      continue;
    }
    ++stats.kept;
    out.push_back(Pair{std::string(src), std::string(tgt)});
  }
  return out;
}

}  // namespace graft::text
