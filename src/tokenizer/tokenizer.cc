// Encoding and decoding around the two merge algorithms (spm.cc, bpe.cc): special
// tokens are cut out of the raw text first (llama.cpp's tokenizer_st_partition), the
// text between them is tokenized, BOS/EOS are added as the vocabulary asks; decoding
// maps each token back to its bytes (llama.cpp's token_to_piece and detokenize).
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_format.h"
#include "core/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"

namespace moert::tokenizer {
namespace {

constexpr std::string_view kEscapedSpace = "\xe2\x96\x81";  // U+2581

// A piece of the input: raw text to tokenize, or a special token matched in it.
struct Fragment {
  TokenId token;  // kNoToken for raw text
  size_t offset;
  size_t length;
};

// Splits `text` at every occurrence of a special token, longest tokens first; each
// token splits what the longer ones left as raw text, leftmost match first.
std::vector<Fragment> Partition(const Vocab& vocab, std::string_view text, bool parse_special) {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({kNoToken, 0, text.size()});
  std::vector<Fragment> next;
  for (const TokenId id : vocab.special_tokens()) {
    // Control and unknown tokens only with parse_special; user-defined ones always
    // (as Hugging Face tokenizers treat added tokens).
    if (!parse_special && (vocab.IsControl(id) || vocab.IsUnknown(id))) continue;
    const std::string& special = vocab.text(id);
    next.clear();
    bool found = false;
    for (const Fragment& fragment : fragments) {
      if (fragment.token != kNoToken) {
        next.push_back(fragment);
        continue;
      }
      const size_t end = fragment.offset + fragment.length;
      const std::string_view window = text.substr(0, end);
      size_t pos = fragment.offset;
      while (pos < end) {
        const size_t match = window.find(special, pos);
        if (match == std::string_view::npos) break;
        found = true;
        if (match > pos) next.push_back({kNoToken, pos, match - pos});
        next.push_back({id, 0, 0});
        pos = match + special.size();
      }
      if (pos < end) next.push_back({kNoToken, pos, end - pos});
    }
    if (found) fragments.swap(next);
  }
  return fragments;
}

// llama_decode_text: GPT-2 byte code points back to bytes.
std::string DecodeByteLevel(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const uint32_t cp : DecodeUtf8(text)) {
    if (const std::optional<uint8_t> byte = CodepointToByte(cp)) {
      out.push_back(static_cast<char>(*byte));
      continue;
    }
    // llama.cpp's marker for a code point that is no byte, kept byte for byte
    // (including its quirk of repeating the whole token text).
    out += "[UNK_BYTE_0x";
    for (const char c : EncodeUtf8(cp))
      absl::StrAppendFormat(&out, "%02x", static_cast<uint8_t>(c));
    out.append(text);
    out += "]";
  }
  return out;
}

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

// llama.cpp's clean_up_tokenization_spaces passes, on the whole decoded text.
void CleanSpaces(std::string& text) {
  // " ?", " !", " .", " ," lose the space.
  size_t total1 = text.size();
  size_t total = total1 ? 1 : 0;
  for (size_t i = 1; i < total1; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    text[total++] = x;
  }
  // " ' " becomes "'".
  const size_t total2 = total;
  total = total ? 1 : 0;
  for (size_t i = 1; i < total2; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --total;
      text[++i] = '\0';
    }
    text[total++] = x;
  }
  // " 's", " 'm", " 're", " 've" lose the space.
  const size_t total3 = total;
  total = total ? 1 : 0;
  for (size_t i = 1; i < total3; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (i + 2 < total3) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    text[total++] = x;
  }
  text.resize(total);
}

// Length of the longest prefix of `bytes` that does not end inside a UTF-8
// character. A sequence that can never complete (a stray continuation byte, an
// invalid lead) is not held back.
size_t CompleteUtf8Prefix(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<uint8_t>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) {
      need = 2;
    } else if ((c & 0xF0) == 0xE0) {
      need = 3;
    } else if ((c & 0xF8) == 0xF0) {
      need = 4;
    }
    return back < need ? n - back : n;
  }
  return n;
}

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::FromGguf(const format::GgufFile& file) {
  MOERT_ASSIGN_OR_RETURN(Vocab vocab, Vocab::FromGguf(file));
  return Tokenizer(std::move(vocab));
}

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  pieces_.resize(vocab_.size());
  for (TokenId id = 0; id < vocab_.size(); ++id) {
    const std::string& text = vocab_.text(id);
    // Same order of tests as llama.cpp: a special or user-defined token is its text
    // even if it is also marked normal.
    if (vocab_.IsControl(id) || vocab_.IsUnknown(id) || vocab_.IsUserDefined(id)) {
      pieces_[id] = text;
    } else if (vocab_.IsNormal(id)) {
      pieces_[id] = vocab_.type() == VocabType::kSpm ? ReplaceAll(text, kEscapedSpace, " ")
                                                     : DecodeByteLevel(text);
    } else if (vocab_.IsByte(id)) {
      pieces_[id] = std::string(1, static_cast<char>(vocab_.TokenByte(id)));
    }
    // Unused and undefined tokens decode to nothing.
  }
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const std::vector<Fragment> fragments = Partition(vocab_, text, parse_special);
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && vocab_.add_bos()) out.push_back(vocab_.bos());
  if (vocab_.type() == VocabType::kSpm) {
    // SentencePiece's dummy prefix: a space before the text and after every special
    // token, so a word there tokenizes the same as inside a sentence.
    bool prev_special = true;
    std::string normalized;
    for (const Fragment& fragment : fragments) {
      if (fragment.token != kNoToken) {
        out.push_back(fragment.token);
        prev_special = true;
        continue;
      }
      const std::string_view raw = text.substr(fragment.offset, fragment.length);
      normalized.clear();
      if (vocab_.add_space_prefix() && prev_special) normalized += kEscapedSpace;
      for (const char c : raw) {
        if (c == ' ') {
          normalized += kEscapedSpace;
        } else {
          normalized += c;
        }
      }
      SpmEncode(vocab_, normalized, &out);
      prev_special = false;
    }
  } else {
    for (const Fragment& fragment : fragments) {
      if (fragment.token != kNoToken) {
        out.push_back(fragment.token);
      } else {
        BpeEncode(vocab_, text.substr(fragment.offset, fragment.length), &out);
      }
    }
  }
  if (add_special && vocab_.add_eos()) out.push_back(vocab_.eos());
  return out;
}

std::string_view Tokenizer::TokenToPiece(TokenId id, bool special) const {
  if (!vocab_.Contains(id)) return {};
  if (!special && (vocab_.IsControl(id) || vocab_.IsUnknown(id))) return {};
  return pieces_[id];
}

std::string Tokenizer::Decode(std::span<const TokenId> ids, bool special) const {
  std::string out;
  // The first token's piece loses one leading space: the one SentencePiece put
  // there. llama.cpp drops it even when that first piece is empty (a BOS with
  // special = false), so a leading BOS keeps the space.
  bool remove_space = vocab_.add_space_prefix();
  for (const TokenId id : ids) {
    std::string_view piece = TokenToPiece(id, special);
    if (remove_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    remove_space = false;
    out.append(piece);
  }
  if (vocab_.clean_spaces()) CleanSpaces(out);
  return out;
}

std::string StreamDecoder::Push(TokenId id) {
  pending_.append(tokenizer_->TokenToPiece(id, special_));
  const size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace moert::tokenizer
