// Byte-level BPE encoding of one fragment of text, as llama.cpp's llm_tokenizer_bpe
// does it: pre-tokenize with the vocabulary's regex split, map each word's bytes to
// GPT-2's printable code points, then apply merges in rank order.
#ifndef MOERT_TOKENIZER_BPE_H_
#define MOERT_TOKENIZER_BPE_H_

#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace moert::tokenizer {

// Appends the ids of `text` (raw UTF-8, no special tokens inside) to `out`.
void BpeEncode(const Vocab& vocab, std::string_view text, std::vector<TokenId>* out);

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_BPE_H_
