// Reading text line by line with a cap applied while reading: an overlong line (a binary file,
// a corpus without newlines) costs at most `cap` bytes of memory, never the whole line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace graft::text {

// The largest file from outside a program reads (a corpus or TSV, a text, an ids file): 1 GiB.
constexpr uintmax_t kMaxInputFileBytes = uintmax_t(1) << 30;

// Refuses, before it is read, an outside file that exists but is not a regular file (a device
// such as /dev/zero, a FIFO, a socket: reading one may never end), or is larger than
// `cap` bytes. A path that does not exist, or a directory, passes, for the reader's own open
// or read error (a directory's read fails at once: it cannot hang). Errors are
// graft::Error "<who>: '<path>' is not a regular file ..." / "... is N bytes, over the limit of
// `cap` bytes ..." (who empty: no prefix).
void check_input_file(const std::string& who, const std::string& path,
                      uintmax_t cap = kMaxInputFileBytes);

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

// One line of a chunk read by for_each_chunk(): its text, or too_long (text empty) when it was
// over the cap.
struct CappedLine {
  std::string text;
  bool too_long = false;
};

// Reads `in` (stdin, say) to its end in chunks of at most `chunk` lines, each line capped at
// `cap` bytes while reading (LineReader), and hands each chunk to `use` with the number of lines
// before it: memory stays bounded whatever comes in (`< /dev/zero`, `yes`), and output can
// follow each chunk. A read error throws as LineReader::next() does, naming `what`.
void for_each_chunk(FILE* in, size_t cap, size_t chunk, const std::string& what,
                    const std::function<void(const std::vector<CappedLine>&, size_t)>& use);

}  // namespace graft::text
