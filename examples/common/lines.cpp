#include "examples/common/lines.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace graft::text {

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

}  // namespace graft::text
