#include "corpus.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include <sys/types.h>  // ssize_t for POSIX getline

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

std::vector<Pair> read_tsv(const std::string& path, CorpusStats& stats,
                           size_t max_bytes, size_t max_words) {
  // stdio rather than iostreams: fopen reliably sets errno for the error
  // message, and POSIX getline keeps embedded NUL bytes instead of choking.
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    throw std::runtime_error("read_tsv: cannot open '" + path + "': " + std::strerror(errno));
  }
  // getline may realloc the buffer, so ownership lives in a struct that the
  // destructor can free even if push_back throws mid-file.
  struct LineBuf {
    char* p = nullptr;
    size_t cap = 0;
    ~LineBuf() { std::free(p); }
  } lb;
  std::vector<Pair> out;
  bool first = true;
  ssize_t got;
  while ((got = ::getline(&lb.p, &lb.cap, f.get())) >= 0) {
    std::string_view line(lb.p, static_cast<size_t>(got));
    ++stats.read;
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
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
    if (max_bytes && line.size() > max_bytes) {
      ++stats.too_long;
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
  const bool failed = std::ferror(f.get()) != 0;
  const int err = errno;
  if (failed) {
    throw std::runtime_error("read_tsv: error reading '" + path + "': " + std::strerror(err));
  }
  return out;
}

}  // namespace graft::text
