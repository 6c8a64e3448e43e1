// SentencePiece encoding of one fragment of text, as llama.cpp's llm_tokenizer_spm
// does it: greedy bigram merges by token score, then byte fallback (<0xXX>) for
// whatever did not become a token.
#ifndef MOERT_TOKENIZER_SPM_H_
#define MOERT_TOKENIZER_SPM_H_

#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace moert::tokenizer {

// `text` is already normalised: spaces replaced by U+2581 and the space prefix added.
// Appends the ids to `out`.
void SpmEncode(const Vocab& vocab, std::string_view text, std::vector<TokenId>* out);

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_SPM_H_
