// SentencePiece bigram merging (llama.cpp's llm_tokenizer_spm_session). The text is
// split into UTF-8 characters; the adjacent pair whose concatenation is the
// highest-scoring token is merged first (ties: leftmost), until no pair forms a token.
#include "tokenizer/spm.h"

#include <algorithm>
#include <cstdint>
#include <queue>

#include "tokenizer/unicode.h"

namespace moert::tokenizer {
namespace {

struct Symbol {
  int prev;
  int next;
  size_t start;  // into the text
  size_t n;      // 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

// Orders the max-heap: highest score on top, then the leftmost pair.
struct BigramLess {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

class SpmSession {
 public:
  SpmSession(const Vocab& vocab, std::string_view text) : vocab_(vocab), text_(text) {}

  void Encode(std::vector<TokenId>* out) {
    size_t offset = 0;
    int index = 0;
    symbols_.reserve(text_.size());
    while (offset < text_.size()) {
      const size_t n =
          std::min(Utf8SequenceLength(static_cast<uint8_t>(text_[offset])), text_.size() - offset);
      symbols_.push_back({index - 1, offset + n == text_.size() ? -1 : index + 1, offset, n});
      offset += n;
      ++index;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) TryAddBigram(i - 1, i);

    while (!queue_.empty()) {
      const Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      // Stale: one side was merged since this pair was queued.
      if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = bigram.left;
      TryAddBigram(left.prev, bigram.left);
      TryAddBigram(bigram.left, left.next);
    }

    if (symbols_.empty()) return;
    for (int i = 0; i != -1; i = symbols_[i].next) Resegment(symbols_[i], out);
  }

 private:
  void TryAddBigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view text =
        text_.substr(symbols_[left].start, symbols_[left].n + symbols_[right].n);
    const TokenId id = vocab_.Find(text);
    if (id == kNoToken) return;
    queue_.push({left, right, vocab_.score(id), text.size()});
  }

  // llama.cpp's resegment also looks the text up in a map of merges it made, but
  // only when the text is not a token, and every key of that map is a token: the
  // lookup never succeeds, so a symbol is its token or else its bytes.
  void Resegment(const Symbol& symbol, std::vector<TokenId>* out) const {
    const std::string_view text = text_.substr(symbol.start, symbol.n);
    const TokenId id = vocab_.Find(text);
    if (id != kNoToken) {
      out->push_back(id);
      return;
    }
    for (const char c : text) {
      TokenId byte_id = vocab_.ByteToken(static_cast<uint8_t>(c));
      // llama.cpp throws here (a vocabulary without byte tokens); emit <unk> instead.
      if (byte_id == kNoToken) byte_id = vocab_.unk();
      if (byte_id != kNoToken) out->push_back(byte_id);
    }
  }

  const Vocab& vocab_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue_;
};

}  // namespace

void SpmEncode(const Vocab& vocab, std::string_view text, std::vector<TokenId>* out) {
  SpmSession(vocab, text).Encode(out);
}

}  // namespace moert::tokenizer
