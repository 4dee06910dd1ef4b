// Shared by the example programs: strict UTF-8 validation.
#pragma once

#include <string_view>

namespace graft::text {

// Strict UTF-8 well-formedness (RFC 3629 / Unicode Table 3-7): rejects stray
// continuation bytes, C0/C1 and other overlong forms, UTF-16 surrogates
// (U+D800..U+DFFF), code points above U+10FFFF, and truncated sequences.
bool valid_utf8(std::string_view s);

}  // namespace graft::text
