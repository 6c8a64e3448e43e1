// Pre-tokenizers of byte-level BPE vocabularies: the regex splits llama.cpp applies
// before BPE merges, selected by the GGUF key `tokenizer.ggml.pre`. Matching runs on
// Unicode code points with real general-category tables (tokenizer/unicode.h).
#ifndef MOERT_TOKENIZER_PRETOKENIZER_H_
#define MOERT_TOKENIZER_PRETOKENIZER_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moert::tokenizer {

enum class PreTokenizer {
  kDefault,      // "default": llama.cpp's fallback expressions
  kGpt2,         // "gpt-2" (and "phi-2", "roberta-bpe", ...)
  kLlama3,       // "llama-bpe", "llama3", "llama-v3", "falcon3"
  kQwen2,        // "qwen2", "deepseek-r1-qwen"
  kDeepseekLlm,  // "deepseek-llm"
  kFalcon,       // "falcon"
  kMpt,          // "mpt"
  kStarcoder,    // "starcoder", "refact"
};

// Maps a `tokenizer.ggml.pre` value; an empty name gives kDefault. Names of llama.cpp
// pre-tokenizer types that use the same expressions as one of the kinds above map to
// that kind ("dbrx" to kLlama3, "olmo" to kGpt2, "command-r" to kStarcoder, ...). An
// unknown name is InvalidArgument naming it.
absl::StatusOr<PreTokenizer> PreTokenizerFromName(std::string_view name);

// The regular expressions `kind` applies, in order, exactly as llama.cpp's
// llm_tokenizer_bpe lists them (tokenizer/regex.h syntax).
std::span<const std::string_view> PreTokenizerExpressions(PreTokenizer kind);

// Splits UTF-8 `text` into pieces exactly as llama.cpp's unicode_regex_split does for
// `kind` (pieces are UTF-8, not yet byte-encoded). For valid UTF-8 the pieces
// concatenate to `text`; invalid UTF-8 is handled as llama.cpp does: each bad byte
// reads as U+FFFD and comes back as its 3-byte encoding. Empty text gives no pieces.
std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text);

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_PRETOKENIZER_H_
