// Pre-tokenizers of byte-level BPE vocabularies: the regex splits llama.cpp applies
// before BPE merges, selected by the GGUF key `tokenizer.ggml.pre`. Matching runs on
// Unicode code points with real general-category tables (tokenizer/unicode.h).
#ifndef MOERT_TOKENIZER_PRETOKENIZER_H_
#define MOERT_TOKENIZER_PRETOKENIZER_H_

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

// Maps a `tokenizer.ggml.pre` value; an empty name gives kDefault. An unknown name is
// InvalidArgument naming it.
absl::StatusOr<PreTokenizer> PreTokenizerFromName(std::string_view name);

// Splits UTF-8 `text` into pieces exactly as llama.cpp's unicode_regex_split does for
// `kind` (pieces are UTF-8, not yet byte-encoded; concatenated they give `text`).
// Invalid UTF-8 is handled as llama.cpp does (each bad byte reads as U+FFFD).
std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text);

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_PRETOKENIZER_H_
