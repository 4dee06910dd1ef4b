// Internal to nn/text: the check every SentencePiece model file gets before SentencePiece reads
// it (text::Tokenizer's, text::MarianTokenizer's).
#pragma once

#include <string>

namespace graft::text::detail {

// Refuses a device or a pipe (whose reading may never end), or a file over
// Tokenizer::kMaxModelBytes, naming the path; a missing path is left to SentencePiece.
void check_model_file(const std::string& path);

}  // namespace graft::text::detail
