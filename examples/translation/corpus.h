// Reader for parallel corpora stored as "source<TAB>target" lines. Real-world
// crawled corpora are dirty, so bad lines are skipped and counted rather than
// treated as fatal; the counts let a training run report how much was lost.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "graft/autograd/text.h"

namespace graft::text {

// Every line read lands in exactly one of the other buckets, so
// read == kept + empty + malformed + bad_utf8 + too_long.
struct CorpusStats {
  size_t read = 0, kept = 0, empty = 0, malformed = 0, bad_utf8 = 0, too_long = 0;
  // e.g. "read=10 kept=4 empty=1 malformed=3 bad_utf8=1 too_long=1"
  std::string summary() const;
};

constexpr size_t kHardLineCap = 1 << 20;

struct Pair {
  std::string src, tgt;
};

// Reads `path` line by line (LF or CRLF endings; a leading UTF-8 BOM is
// ignored). Each side is trimmed of ASCII whitespace. Checks, in order:
//   too_long  - the line (without its line ending) exceeds max_bytes, found while
//               reading: no more than max_bytes of a line is ever held;
//   empty     - the line is blank or whitespace only;
//   bad_utf8  - the line is not well-formed UTF-8 (see valid_utf8);
//   malformed - not exactly one tab, or a side is empty after trimming;
//   too_long  - max_words > 0 and a side has more whitespace-separated words.
// max_words == 0 disables the word limit; max_bytes == 0 means kHardLineCap.
// Stats are accumulated into `stats` (not reset), so several files can share
// one tally. Throws std::runtime_error("read_tsv: cannot open '<path>':
// <strerror>") when the file cannot be opened, graft::Error when it is not a
// regular file (a directory, /dev/zero) or is over kMaxInputFileBytes
// (check_input_file), and an "error reading" message on an I/O error.
std::vector<Pair> read_tsv(const std::string& path, CorpusStats& stats, size_t max_bytes = 1000,
                           size_t max_words = 0);

}  // namespace graft::text
