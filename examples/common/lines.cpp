#include "examples/common/lines.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "graft/autograd/tensor.h"
#include "graft/autograd/text.h"

namespace graft::text {

void check_input_file(const std::string& who, const std::string& path, uintmax_t cap) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symbolic links
  if (ec || !fs::exists(st) || fs::is_directory(st)) return;
  const std::string file = (who.empty() ? "" : who + ": ") + "'" + printable(path) + "'";
  if (!fs::is_regular_file(st))
    fail(file + " is not a regular file (a device or a pipe, whose reading may never end)");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail(file + ": cannot read its size: " + ec.message());
  if (size > cap)
    fail(file + " is " + std::to_string(size) + " bytes, over the limit of " + std::to_string(cap) +
         " bytes for an input file (split it)");
}

// Byte by byte (getc_unlocked is a buffered read, not a call per byte), so NUL bytes stay in
// the line for the UTF-8 check to reject, and nothing past the cap is stored.
bool LineReader::next(std::string& line, bool& too_long, const std::string& what) {
  line.clear();
  too_long = false;
  bool any = false;
  int c;
  while ((c = getc_unlocked(f_)) != EOF) {
    any = true;
    if (c == '\n') break;
    if (too_long) continue;
    if (line.size() > cap_) {  // one byte over the cap may still be the "\r" of "\r\n"
      too_long = true;
      line.clear();
      continue;
    }
    line.push_back(char(c));
  }
  if (std::ferror(f_)) throw std::runtime_error(what + ": " + std::strerror(errno));
  if (!any) return false;
  if (!too_long && !line.empty() && line.back() == '\r') line.pop_back();
  if (line.size() > cap_) {
    too_long = true;
    line.clear();
  }
  return true;
}

void for_each_chunk(FILE* in, size_t cap, size_t chunk, const std::string& what,
                    const std::function<void(const std::vector<CappedLine>&, size_t)>& use) {
  LineReader reader(in, cap);
  std::vector<CappedLine> lines;
  size_t before = 0;
  CappedLine l;
  while (reader.next(l.text, l.too_long, what)) {
    lines.push_back(l);
    if (lines.size() < chunk) continue;
    use(lines, before);
    before += lines.size();
    lines.clear();
  }
  if (!lines.empty()) use(lines, before);
}

}  // namespace graft::text
