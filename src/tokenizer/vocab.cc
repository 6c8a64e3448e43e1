// Loads and validates the tokenizer vocabulary. The defaults and heuristics follow
// llama.cpp's llama_vocab::impl::load (src/llama-vocab.cpp, Feb 2025) so that moert
// tokenizes every GGUF file exactly as llama.cpp does; where llama.cpp would warn and
// carry on with a broken table (mismatched arrays, ids out of range), we refuse the
// file with an error naming the key.
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/status.h"
#include "core/strings.h"

namespace moert::tokenizer {
namespace {

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTokenType = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";
constexpr std::string_view kKeyBos = "tokenizer.ggml.bos_token_id";
constexpr std::string_view kKeyEos = "tokenizer.ggml.eos_token_id";
constexpr std::string_view kKeyEot = "tokenizer.ggml.eot_token_id";
constexpr std::string_view kKeyEom = "tokenizer.ggml.eom_token_id";
constexpr std::string_view kKeyUnk = "tokenizer.ggml.unknown_token_id";
constexpr std::string_view kKeySep = "tokenizer.ggml.seperator_token_id";  // sic
constexpr std::string_view kKeyPad = "tokenizer.ggml.padding_token_id";
constexpr std::string_view kKeyAddBos = "tokenizer.ggml.add_bos_token";
constexpr std::string_view kKeyAddEos = "tokenizer.ggml.add_eos_token";
constexpr std::string_view kKeyAddSpacePrefix = "tokenizer.ggml.add_space_prefix";

// Token texts llama.cpp treats as special whatever their declared type (converters
// used to get this wrong): each is promoted to a control token, and may become the
// EOT or EOM token (when the file names none) and end generation.
enum class TextRole { kEot, kEom, kFim };
struct SpecialText {
  std::string_view text;
  TextRole role;
  bool eog;  // also ends generation
};
constexpr SpecialText kSpecialTexts[] = {
    {"<|eot_id|>", TextRole::kEot, true},
    {"<|im_end|>", TextRole::kEot, true},
    {"<|end|>", TextRole::kEot, true},
    {"<end_of_turn>", TextRole::kEot, true},
    {"<|endoftext|>", TextRole::kEot, true},
    {"<EOT>", TextRole::kEot, true},
    {"_<EOT>", TextRole::kEot, true},
    {"<｜end▁of▁sentence｜>", TextRole::kEot, true},  // DeepSeek
    {"<|eom_id|>", TextRole::kEom, true},
    {"<|fim_prefix|>", TextRole::kFim, false},
    {"<fim-prefix>", TextRole::kFim, false},
    {"<｜fim▁begin｜>", TextRole::kFim, false},
    {"<PRE>", TextRole::kFim, false},
    {"<|fim_suffix|>", TextRole::kFim, false},
    {"<fim-suffix>", TextRole::kFim, false},
    {"<｜fim▁hole｜>", TextRole::kFim, false},
    {"<SUF>", TextRole::kFim, false},
    {"<|fim_middle|>", TextRole::kFim, false},
    {"<fim-middle>", TextRole::kFim, false},
    {"<｜fim▁end｜>", TextRole::kFim, false},
    {"<MID>", TextRole::kFim, false},
    {"<|fim_pad|>", TextRole::kFim, true},
    {"<fim-pad>", TextRole::kFim, true},
    {"<PAD>", TextRole::kFim, true},
    {"<|fim_repo|>", TextRole::kFim, true},
    {"<|repo_name|>", TextRole::kFim, true},
    {"<fim-repo>", TextRole::kFim, true},
    {"<REPO>", TextRole::kFim, true},
    {"<|file_sep|>", TextRole::kFim, true},
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xXX>" -> XX.
std::optional<uint8_t> ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return std::nullopt;
  const int hi = HexValue(text[3]);
  const int lo = HexValue(text[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

// Reads an optional key with `get`; NotFound becomes nullopt, other errors pass.
template <typename T, typename Getter>
absl::Status ReadOptional(std::string_view key, Getter get, std::optional<T>* out) {
  auto value = get(key);
  if (absl::IsNotFound(value.status())) return absl::OkStatus();
  if (!value.ok()) return value.status();
  *out = static_cast<T>(*value);
  return absl::OkStatus();
}

// Reads the tokenizer keys into `source`. Errors name the file and the key (the
// GgufFile accessors' messages already start with the file's name).
absl::Status ReadSource(const format::GgufFile& file, VocabSource& source) {
  {
    auto model = file.GetString(kKeyModel);
    if (absl::IsNotFound(model.status())) {
      return absl::NotFoundError(
          StrCat(file.name(), ": no tokenizer (key ", kKeyModel, " is missing)"));
    }
    MOERT_RETURN_IF_ERROR(model.status());
    source.model = std::string(*model);
  }
  std::optional<std::string_view> pre;
  MOERT_RETURN_IF_ERROR(ReadOptional<std::string_view>(
      kKeyPre, [&](std::string_view k) { return file.GetString(k); }, &pre));
  if (pre) source.pre = std::string(*pre);

  {
    auto tokens = file.GetStringArray(kKeyTokens);
    if (absl::IsNotFound(tokens.status())) {
      return absl::NotFoundError(
          StrCat(file.name(), ": key ", kKeyTokens, " (the token list) is missing"));
    }
    MOERT_RETURN_IF_ERROR(tokens.status());
    source.tokens.assign(tokens->begin(), tokens->end());
  }
  if (const format::GgufKeyValue* kv = file.FindKey(kKeyScores)) {
    // llama.cpp also accepts int32 scores.
    if (kv->value.type == format::GgufValueType::kArray &&
        kv->value.array_type == format::GgufValueType::kInt32) {
      MOERT_ASSIGN_OR_RETURN(std::vector<int64_t> ints, file.GetIntArray(kKeyScores));
      source.scores.assign(ints.begin(), ints.end());
    } else {
      MOERT_ASSIGN_OR_RETURN(source.scores, file.GetFloatArray(kKeyScores));
    }
  }
  if (file.FindKey(kKeyTokenType) != nullptr) {
    MOERT_ASSIGN_OR_RETURN(std::vector<int64_t> types, file.GetIntArray(kKeyTokenType));
    source.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < INT32_MIN || types[i] > INT32_MAX) {
        return absl::InvalidArgumentError(
            StrCat(kKeyTokenType, "[", i, "] = ", types[i], " is out of range"));
      }
      source.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  if (file.FindKey(kKeyMerges) != nullptr) {
    MOERT_ASSIGN_OR_RETURN(std::vector<std::string_view> merges, file.GetStringArray(kKeyMerges));
    source.merges.assign(merges.begin(), merges.end());
  }

  auto get_int = [&](std::string_view k) { return file.GetInt(k); };
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyBos, get_int, &source.bos_id));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyEos, get_int, &source.eos_id));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyEot, get_int, &source.eot_id));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyEom, get_int, &source.eom_id));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyUnk, get_int, &source.unk_id));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeySep, get_int, &source.sep_id));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyPad, get_int, &source.pad_id));
  auto get_bool = [&](std::string_view k) { return file.GetBool(k); };
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyAddBos, get_bool, &source.add_bos));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyAddEos, get_bool, &source.add_eos));
  MOERT_RETURN_IF_ERROR(ReadOptional(kKeyAddSpacePrefix, get_bool, &source.add_space_prefix));

  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Vocab> Vocab::FromGguf(const format::GgufFile& file) {
  VocabSource source;
  MOERT_RETURN_IF_ERROR(ReadSource(file, source));
  absl::StatusOr<Vocab> vocab = FromSource(std::move(source));
  if (!vocab.ok()) {
    return absl::Status(vocab.status().code(), StrCat(file.name(), ": ", vocab.status().message()));
  }
  return vocab;
}

absl::StatusOr<Vocab> Vocab::FromSource(VocabSource source) {
  Vocab vocab;
  MOERT_RETURN_IF_ERROR(vocab.ApplyDefaults(source));
  MOERT_RETURN_IF_ERROR(vocab.LoadTokens(source));
  if (vocab.type_ == VocabType::kBpe) {
    MOERT_RETURN_IF_ERROR(vocab.LoadMerges(source.merges));
  }
  MOERT_RETURN_IF_ERROR(vocab.LoadSpecialIds(source));
  vocab.DetectSpecialsByText();
  vocab.BuildTables();
  return vocab;
}

absl::Status Vocab::ApplyDefaults(const VocabSource& source) {
  model_name_ = source.model;
  pre_name_ = source.pre;
  if (source.model == "llama") {
    type_ = VocabType::kSpm;
    bos_ = 1;
    eos_ = 2;
    unk_ = 0;
    add_space_prefix_ = true;
    add_bos_ = true;
    add_eos_ = false;
    clean_spaces_ = false;
  } else if (source.model == "gpt2") {
    type_ = VocabType::kBpe;
    // llama.cpp's defaults (GPT-2's <|endoftext|> in the Falcon vocabulary).
    bos_ = 11;
    eos_ = 11;
    add_space_prefix_ = false;
    clean_spaces_ = true;
    if (source.merges.empty()) {
      return absl::InvalidArgumentError(
          StrCat(kKeyMerges, " is missing or empty; a gpt2 (BPE) vocabulary needs it"));
    }
    auto pre = PreTokenizerFromName(source.pre);
    if (!pre.ok()) {
      return absl::UnimplementedError(
          StrCat(kKeyPre, " '", source.pre, "' is not supported: ", pre.status().message()));
    }
    pre_tokenizer_ = *pre;
    const std::string& p = source.pre;
    if (p == "llama3" || p == "llama-v3" || p == "llama-bpe" || p == "falcon3") {
      ignore_merges_ = true;
      add_bos_ = true;
    } else if (p == "deepseek-llm" || p == "deepseek-coder" || p == "deepseek-v3" || p == "qwen2" ||
               p == "deepseek-r1-qwen" || p == "command-r" || p == "poro-chat" || p == "viking" ||
               p == "smollm" || p == "chameleon" || p == "tekken") {
      clean_spaces_ = false;
    }
  } else if (source.model.empty()) {
    return absl::InvalidArgumentError(StrCat(kKeyModel, " is empty"));
  } else {
    return absl::UnimplementedError(
        StrCat("tokenizer model '", source.model, "' (", kKeyModel,
               ") is not supported; moert supports 'llama' (SentencePiece) and 'gpt2' (BPE)"));
  }
  if (source.add_space_prefix) add_space_prefix_ = *source.add_space_prefix;
  return absl::OkStatus();
}

absl::Status Vocab::LoadTokens(VocabSource& source) {
  const size_t n = source.tokens.size();
  if (n == 0) return absl::InvalidArgumentError(StrCat(kKeyTokens, " is empty"));
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(StrCat(kKeyTokens, " has too many tokens: ", n));
  }
  if (!source.scores.empty() && source.scores.size() != n) {
    return absl::InvalidArgumentError(
        StrCat(kKeyScores, " has ", source.scores.size(), " entries but ", kKeyTokens, " has ", n));
  }
  if (!source.token_types.empty() && source.token_types.size() != n) {
    return absl::InvalidArgumentError(StrCat(kKeyTokenType, " has ", source.token_types.size(),
                                             " entries but ", kKeyTokens, " has ", n));
  }
  tokens_.resize(n);
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Token& token = tokens_[i];
    token.text = std::move(source.tokens[i]);
    // As llama.cpp: an empty text can never match, so give it a unique placeholder.
    if (token.text.empty()) token.text = StrCat("[EMPTY_", i, "]");
    if (!source.scores.empty()) token.score = source.scores[i];
    if (!source.token_types.empty()) {
      const int32_t t = source.token_types[i];
      token.type = (t >= 0 && t <= 6) ? static_cast<TokenType>(t) : TokenType::kUndefined;
    }
    switch (token.type) {
      case TokenType::kNormal:
        token.attr = kAttrNormal;
        break;
      case TokenType::kUnknown:
        token.attr = kAttrUnknown;
        break;
      case TokenType::kControl:
        token.attr = kAttrControl;
        break;
      case TokenType::kUserDefined:
        token.attr = kAttrUserDefined;
        break;
      case TokenType::kUnused:
        token.attr = kAttrUnused;
        break;
      case TokenType::kByte:
        token.attr = kAttrByte;
        break;
      case TokenType::kUndefined:
        token.attr = 0;
        break;
    }
    if (token.type == TokenType::kByte) {
      std::optional<uint8_t> byte = ParseByteToken(token.text);
      if (!byte) {
        return absl::InvalidArgumentError(StrCat(kKeyTokenType, "[", i, "] says byte, but ",
                                                 kKeyTokens, "[", i, "] is '", token.text,
                                                 "', not <0xXX>"));
      }
      token.byte = *byte;
    }
    const auto [it, inserted] = token_to_id_.emplace(token.text, static_cast<TokenId>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(StrCat(kKeyTokens, "[", i, "] '", token.text,
                                               "' duplicates ", kKeyTokens, "[", it->second, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status Vocab::LoadMerges(const std::vector<std::string>& merges) {
  merge_ranks_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& merge = merges[i];
    // As llama.cpp: split at the first space after the first byte, so a left part
    // may itself start with a space.
    const size_t pos = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    if (pos == std::string::npos) {
      return absl::InvalidArgumentError(
          StrCat(kKeyMerges, "[", i, "] '", merge, "' is not two tokens separated by a space"));
    }
    const std::string_view left = std::string_view(merge).substr(0, pos);
    const std::string_view right = std::string_view(merge).substr(pos + 1);
    const TokenId left_id = Find(left);
    const TokenId right_id = Find(right);
    if (left_id == kNoToken || right_id == kNoToken) {
      return absl::InvalidArgumentError(StrCat(kKeyMerges, "[", i, "] '", merge, "' names '",
                                               left_id == kNoToken ? left : right,
                                               "', which is not in ", kKeyTokens));
    }
    const uint64_t key = (static_cast<uint64_t>(left_id) << 32) | static_cast<uint32_t>(right_id);
    // The first occurrence wins, as with llama.cpp's emplace.
    merge_ranks_.emplace(key, static_cast<int32_t>(i));
  }
  return absl::OkStatus();
}

absl::Status Vocab::LoadSpecialIds(const VocabSource& source) {
  struct Entry {
    std::string_view key;
    const std::optional<int64_t>& value;
    TokenId& id;
  };
  const Entry entries[] = {
      {kKeyBos, source.bos_id, bos_}, {kKeyEos, source.eos_id, eos_},
      {kKeyEot, source.eot_id, eot_}, {kKeyEom, source.eom_id, eom_},
      {kKeyUnk, source.unk_id, unk_}, {kKeySep, source.sep_id, sep_},
      {kKeyPad, source.pad_id, pad_},
  };
  for (const Entry& e : entries) {
    // A default that does not fit this vocabulary is dropped, as llama.cpp does.
    if (!Contains(e.id)) e.id = kNoToken;
    if (!e.value) continue;
    if (*e.value < 0 || *e.value >= size()) {
      return absl::InvalidArgumentError(
          StrCat(e.key, " = ", *e.value, " is out of range (", size(), " tokens)"));
    }
    e.id = static_cast<TokenId>(*e.value);
  }
  if (source.add_bos) add_bos_ = *source.add_bos;
  if (source.add_eos) add_eos_ = *source.add_eos;
  if (add_bos_ && bos_ == kNoToken) {
    return absl::InvalidArgumentError(
        StrCat(kKeyAddBos, " is true but there is no BOS token (", kKeyBos, ")"));
  }
  if (add_eos_ && eos_ == kNoToken) {
    return absl::InvalidArgumentError(
        StrCat(kKeyAddEos, " is true but there is no EOS token (", kKeyEos, ")"));
  }
  return absl::OkStatus();
}

void Vocab::DetectSpecialsByText() {
  struct Hit {
    TokenId id;
    const SpecialText* special;
  };
  std::vector<Hit> hits;
  for (const SpecialText& special : kSpecialTexts) {
    const TokenId id = Find(special.text);
    if (id != kNoToken) hits.push_back({id, &special});
  }
  // llama.cpp walks an unordered map here, so which of several EOT candidates wins is
  // unspecified there; walking by id makes it the lowest id.
  std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) { return a.id < b.id; });
  std::vector<TokenId> eog;
  for (const Hit& hit : hits) {
    tokens_[hit.id].attr |= kAttrControl;
    if (hit.special->role == TextRole::kEot && eot_ == kNoToken) eot_ = hit.id;
    if (hit.special->role == TextRole::kEom && eom_ == kNoToken) eom_ = hit.id;
    if (hit.special->eog) eog.push_back(hit.id);
  }
  for (TokenId id : {eos_, eot_, eom_}) {
    if (id != kNoToken) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  eog_ids_ = std::move(eog);
}

void Vocab::BuildTables() {
  // SentencePiece byte fallback: "<0xXX>", else the byte as a one-character token.
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const char hex[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    TokenId id = Find(std::string_view(hex, 6));
    if (id == kNoToken) {
      const char raw = static_cast<char>(b);
      id = Find(std::string_view(&raw, 1));
    }
    byte_tokens_[b] = id;
  }

  special_tokens_.clear();
  for (TokenId id = 0; id < size(); ++id) {
    if (tokens_[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special_tokens_.push_back(id);
    }
  }
  // Longest first, so that a special token containing another one wins. llama.cpp's
  // std::sort leaves equal lengths in no particular order; ties go by id here.
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](TokenId a, TokenId b) {
    return tokens_[a].text.size() > tokens_[b].text.size();
  });
}

bool Vocab::IsEog(TokenId id) const {
  return id != kNoToken && std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

TokenId Vocab::Find(std::string_view text) const {
  const auto it = token_to_id_.find(absl::string_view(text.data(), text.size()));
  return it == token_to_id_.end() ? kNoToken : it->second;
}

int32_t Vocab::MergeRank(TokenId left, TokenId right) const {
  if (left < 0 || right < 0) return -1;
  const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  const auto it = merge_ranks_.find(key);
  return it == merge_ranks_.end() ? -1 : it->second;
}

}  // namespace moert::tokenizer
