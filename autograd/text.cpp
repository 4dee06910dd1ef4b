#include "graft/autograd/text.h"

#include <cstdio>

namespace graft::text {

// The length of the well-formed UTF-8 sequence at s[i], or 0 when there is none. The allowed
// range of the second byte depends on the lead byte; this is what excludes overlongs (E0
// 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points beyond U+10FFFF (F4 90..BF)
// without decoding.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const unsigned char b = p[i];
  if (b < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;  // continuation byte as lead, C0/C1 overlong, F5..FF
  }
  if (i + len > n) return 0;
  if (p[i + 1] < lo || p[i + 1] > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if ((p[i + k] & 0xC0) != 0x80) return 0;
  return len;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (!len) return false;
    i += len;
  }
  return true;
}

namespace {

// C1 controls (U+0080..U+009F: terminal escape introducers) and the bidirectional overrides and
// isolates (U+202A..U+202E, U+2066..U+2069), which would reorder what a reader sees.
bool invisible_control(std::string_view s, size_t i, size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (len == 2) return p[0] == 0xC2 && p[1] < 0xA0;
  if (len == 3 && p[0] == 0xE2 && p[1] == 0x80) return p[2] >= 0xAA && p[2] <= 0xAE;
  if (len == 3 && p[0] == 0xE2 && p[1] == 0x81) return p[2] >= 0xA6 && p[2] <= 0xA9;
  return false;
}

}  // namespace

std::string printable(std::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    const unsigned char b = (unsigned char)s[i];
    const size_t len = utf8_sequence_length(s, i);
    if ((len > 1 && !invisible_control(s, i, len)) ||
        (len == 1 && b >= 0x20 && b != 0x7F && b != '\\')) {
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    char buf[8];
    std::snprintf(buf, sizeof buf, b == '\\' ? "\\\\" : "\\x%02X", b);
    out += buf;
    ++i;
  }
  return out;
}

}  // namespace graft::text
