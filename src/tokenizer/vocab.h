// The tokenizer vocabulary as a GGUF file describes it (the `tokenizer.ggml.*` keys):
// token texts, scores and types, BPE merges, special token ids and the add-BOS/EOS
// and space-prefix flags, with llama.cpp's defaults where a key is absent. Loading
// validates everything the tokenizers later index with, so encoding cannot fail.
#ifndef MOERT_TOKENIZER_VOCAB_H_
#define MOERT_TOKENIZER_VOCAB_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "format/gguf.h"
#include "tokenizer/pretokenizer.h"

namespace moert::tokenizer {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// tokenizer.ggml.model: "llama" is SentencePiece, "gpt2" byte-level BPE.
enum class VocabType { kSpm, kBpe };

// Values of tokenizer.ggml.token_type (llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The raw contents of the tokenizer keys, before defaults and validation. FromGguf
// fills it from a file; tests build one by hand. An absent optional means the key is
// absent (llama.cpp's default for the model type applies).
struct VocabSource {
  std::string model;                 // tokenizer.ggml.model
  std::string pre;                   // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores (empty: all 0)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (empty: all normal)
  std::vector<std::string> merges;   // tokenizer.ggml.merges ("left right")
  std::optional<int64_t> bos_id, eos_id, eot_id, eom_id, unk_id, sep_id, pad_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

class Vocab {
 public:
  // Reads the tokenizer keys of `file` (works on vocabulary-only files).
  static absl::StatusOr<Vocab> FromGguf(const format::GgufFile& file);
  // Applies defaults and validates. Errors name the GGUF key (and index) at fault;
  // an unsupported model or pre-tokenizer is Unimplemented.
  static absl::StatusOr<Vocab> FromSource(VocabSource source);

  VocabType type() const { return type_; }
  const std::string& model_name() const { return model_name_; }
  const std::string& pre_name() const { return pre_name_; }
  PreTokenizer pre_tokenizer() const { return pre_tokenizer_; }

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  bool Contains(TokenId id) const { return id >= 0 && id < size(); }
  // Precondition for the per-token accessors: Contains(id).
  const std::string& text(TokenId id) const { return tokens_[id].text; }
  float score(TokenId id) const { return tokens_[id].score; }
  TokenType token_type(TokenId id) const { return tokens_[id].type; }
  bool IsNormal(TokenId id) const { return Has(id, kAttrNormal); }
  bool IsUnknown(TokenId id) const { return Has(id, kAttrUnknown); }
  bool IsControl(TokenId id) const { return Has(id, kAttrControl); }
  bool IsUserDefined(TokenId id) const { return Has(id, kAttrUserDefined); }
  bool IsByte(TokenId id) const { return Has(id, kAttrByte); }
  // End of generation: EOS, EOT, EOM and the tokens llama.cpp recognises by text.
  bool IsEog(TokenId id) const;

  // The id whose text is exactly `text`, or kNoToken.
  TokenId Find(std::string_view text) const;
  // Rank of the BPE merge "left right" (lower merges first), or -1.
  int32_t MergeRank(TokenId left, TokenId right) const;
  // SentencePiece byte fallback: the token for a raw byte ("<0xXX>", else the byte
  // itself as text), or kNoToken.
  TokenId ByteToken(uint8_t byte) const { return byte_tokens_[byte]; }
  // The byte a byte-type token ("<0xXX>") stands for; precondition IsByte(id).
  uint8_t TokenByte(TokenId id) const { return tokens_[id].byte; }

  // Special ids (kNoToken when the vocabulary has none).
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }
  TokenId eom() const { return eom_; }
  TokenId unk() const { return unk_; }
  TokenId sep() const { return sep_; }
  TokenId pad() const { return pad_; }

  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // llama3-style BPE: a pre-tokenized word that is a token is taken whole.
  bool ignore_merges() const { return ignore_merges_; }
  // Decoding removes the space before ?!., and some contractions (BPE only).
  bool clean_spaces() const { return clean_spaces_; }

  // Control, user-defined and unknown tokens, longest text first: the texts the
  // encoder matches in raw input before tokenizing what lies between them.
  std::span<const TokenId> special_tokens() const { return special_tokens_; }

 private:
  // llama_token_attr bits. A type maps to one bit; llama.cpp's text heuristics can
  // add kAttrControl to a token of another type.
  enum : uint8_t {
    kAttrNormal = 1 << 0,
    kAttrUnknown = 1 << 1,
    kAttrControl = 1 << 2,
    kAttrUserDefined = 1 << 3,
    kAttrUnused = 1 << 4,
    kAttrByte = 1 << 5,
  };
  struct Token {
    std::string text;
    float score = 0;
    TokenType type = TokenType::kNormal;
    uint8_t attr = kAttrNormal;
    uint8_t byte = 0;  // for kAttrByte tokens
  };

  Vocab() = default;
  bool Has(TokenId id, uint8_t attr) const { return (tokens_[id].attr & attr) != 0; }
  absl::Status ApplyDefaults(const VocabSource& source);
  absl::Status LoadTokens(VocabSource& source);
  absl::Status LoadMerges(const std::vector<std::string>& merges);
  absl::Status LoadSpecialIds(const VocabSource& source);
  void DetectSpecialsByText();
  void BuildTables();

  VocabType type_ = VocabType::kSpm;
  std::string model_name_;
  std::string pre_name_;
  PreTokenizer pre_tokenizer_ = PreTokenizer::kDefault;
  std::vector<Token> tokens_;
  absl::flat_hash_map<std::string, TokenId> token_to_id_;
  // (left id << 32 | right id) -> rank.
  absl::flat_hash_map<uint64_t, int32_t> merge_ranks_;
  std::array<TokenId, 256> byte_tokens_{};
  std::vector<TokenId> special_tokens_;
  std::vector<TokenId> eog_ids_;  // sorted

  TokenId bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken, eom_ = kNoToken;
  TokenId unk_ = kNoToken, sep_ = kNoToken, pad_ = kNoToken;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  bool ignore_merges_ = false;
  bool clean_spaces_ = false;
};

}  // namespace moert::tokenizer

#endif  // MOERT_TOKENIZER_VOCAB_H_
