// Reading text line by line with a cap applied while reading: an overlong line (a binary file,
// a corpus without newlines) costs at most `cap` bytes of memory, never the whole line.
#pragma once

#include <cstdio>
#include <string>

namespace graft::text {

class LineReader {
 public:
  // Reads from f (not owned); lines longer than cap bytes (without the line ending) are
  // reported as too long and their content is not kept.
  LineReader(FILE* f, size_t cap) : f_(f), cap_(cap) {}
  // The next line without "\n" or "\r\n"; false at the end of the input. too_long: the line
  // exceeded the cap (line is then empty). A read error throws std::runtime_error(what + ": " +
  // strerror).
  bool next(std::string& line, bool& too_long, const std::string& what);

 private:
  FILE* f_;
  size_t cap_;
};

}  // namespace graft::text
