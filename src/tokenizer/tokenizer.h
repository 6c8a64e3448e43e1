// Text <-> token ids for a GGUF vocabulary, with the results of llama.cpp
// (src/llama-vocab.cpp, Feb 2025): SentencePiece ("llama") and byte-level BPE
// ("gpt2") encoding, special-token matching in raw text, and decoding, including a
// streaming decoder that never splits a UTF-8 character.
#ifndef MOERT_TOKENIZER_TOKENIZER_H_
#define MOERT_TOKENIZER_TOKENIZER_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "format/gguf.h"
#include "tokenizer/vocab.h"

namespace moert::tokenizer {

// Immutable once built; every method is const and safe to call from several threads.
class Tokenizer {
 public:
  // Reads the vocabulary of `file` (see Vocab::FromGguf).
  static absl::StatusOr<Tokenizer> FromGguf(const format::GgufFile& file);
  explicit Tokenizer(Vocab vocab);

  const Vocab& vocab() const { return vocab_; }

  // llama_tokenize. `add_special` adds BOS/EOS as the vocabulary asks
  // (tokenizer.ggml.add_bos_token / add_eos_token). Control tokens written in the
  // text are recognised only with `parse_special`; user-defined tokens always are.
  std::vector<TokenId> Encode(std::string_view text, bool add_special = true,
                              bool parse_special = false) const;

  // llama_token_to_piece: the bytes `id` stands for (not necessarily whole UTF-8
  // characters), valid as long as the tokenizer. Control and unknown tokens give ""
  // unless `special`. An id outside the vocabulary gives "".
  std::string_view TokenToPiece(TokenId id, bool special = false) const;

  // llama_detokenize (remove_special = false): the pieces concatenated, without the
  // space SentencePiece put in front of the first token when that is not BOS
  // (add_space_prefix), and with the vocabulary's clean-up of spaces before
  // punctuation (BPE vocabularies with clean_spaces). Decode(Encode(x, false)) == x
  // for valid UTF-8 x, unless clean_spaces removes a space from it.
  std::string Decode(std::span<const TokenId> ids, bool special = false) const;

 private:
  Vocab vocab_;
  // TokenToPiece(id, special = true) for every id, as llama.cpp caches it.
  std::vector<std::string> pieces_;
};

// Decodes tokens one at a time for streaming output. Each Push returns the text
// that is now complete: bytes that end inside a UTF-8 character are held back until
// the token that completes it arrives. Unlike Decode, pieces are not cleaned up and
// the first one keeps its leading space (generated tokens continue a prompt, as with
// llama.cpp's per-token common_token_to_piece). Holds a pointer to the tokenizer,
// which must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool special = false)
      : tokenizer_(&tokenizer), special_(special) {}

  std::string Push(TokenId id);
  // Returns whatever is still held back (an incomplete character at the end of the
  // stream, as raw bytes) and starts over.
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool special_;
  std::string pending_;
};

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_TOKENIZER_H_
