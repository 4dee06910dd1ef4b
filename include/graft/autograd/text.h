/// @file
/// Text checks the readers and error messages of nn, models and the programs need: strict UTF-8
/// validation, and bytes from a file made safe to print.
#pragma once

#include <string>
#include <string_view>

/// Text: UTF-8 validation and printable excerpts of untrusted text (here, in graft_autograd), and
/// the tokenizers (graft/nn/text/, library graft_text).
namespace graft::text {

/// True when `s` is well-formed UTF-8.
///
/// Strict UTF-8 well-formedness (RFC 3629 / Unicode Table 3-7): rejects stray
/// continuation bytes, C0/C1 and other overlong forms, UTF-16 surrogates
/// (U+D800..U+DFFF), code points above U+10FFFF, and truncated sequences.
bool valid_utf8(std::string_view s);
/// The length of the well-formed UTF-8 sequence starting at s[i] (1 to 4), 0 if there is none.
size_t utf8_sequence_length(std::string_view s, size_t i);

/// s for an error message: well-formed UTF-8 kept; control characters (C0, DEL, C1), the
/// bidirectional overrides, backslashes and invalid bytes written as `\xNN` per byte (`\\` for a
/// backslash); cut after max_bytes with "...".
std::string printable(std::string_view s, size_t max_bytes = 200);

}  // namespace graft::text
