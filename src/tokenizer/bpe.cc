// Byte-level BPE (llama.cpp's llm_tokenizer_bpe_session). Each pre-tokenized word
// is byte-encoded and split into characters; the adjacent pair with the lowest merge
// rank is merged first (ties: leftmost) until no pair has a merge.
//
// Symbols carry their token id and merges are looked up by id pair. That gives the
// same result as llama.cpp's lookup by text because Vocab accepts only merges whose
// both sides are tokens: a symbol that is no token can take part in no merge.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace moert::tokenizer {
namespace {

struct Symbol {
  int prev;
  int next;
  size_t start;  // into the word
  size_t n;      // 0 once merged into its left neighbour
  TokenId id;    // the token whose text this symbol is, or kNoToken
};

struct Bigram {
  int left;
  int right;
  int32_t rank;
  size_t size;
};

// Orders the max-heap: lowest rank on top, then the leftmost pair.
struct BigramLess {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

class BpeSession {
 public:
  explicit BpeSession(const Vocab& vocab) : vocab_(vocab) {}

  void EncodeWord(std::string_view word, std::vector<TokenId>* out) {
    symbols_.clear();
    queue_ = {};
    if (vocab_.ignore_merges()) {
      const TokenId whole = vocab_.Find(word);
      if (whole != kNoToken) {
        out->push_back(whole);
        return;
      }
    }
    size_t offset = 0;
    int index = 0;
    while (offset < word.size()) {
      const size_t n =
          std::min(Utf8SequenceLength(static_cast<uint8_t>(word[offset])), word.size() - offset);
      symbols_.push_back({index - 1, offset + n == word.size() ? -1 : index + 1, offset, n,
                          vocab_.Find(word.substr(offset, n))});
      offset += n;
      ++index;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) TryAddBigram(i - 1, i);

    while (!queue_.empty()) {
      const Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      // Stale: one side changed since this pair was queued. llama.cpp compares the
      // texts; as symbols only grow, comparing the lengths is the same test.
      if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
      left.n += right.n;
      right.n = 0;
      left.id = vocab_.Find(word.substr(left.start, left.n));
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = bigram.left;
      TryAddBigram(left.prev, bigram.left);
      TryAddBigram(bigram.left, left.next);
    }

    for (const Symbol& symbol : symbols_) {
      if (symbol.n == 0) continue;
      if (symbol.id != kNoToken) {
        out->push_back(symbol.id);
        continue;
      }
      // As llama.cpp: try each byte of the (byte-encoded) text as a token; bytes
      // that are none are dropped.
      for (size_t i = 0; i < symbol.n; ++i) {
        const TokenId id = vocab_.Find(word.substr(symbol.start + i, 1));
        if (id != kNoToken) out->push_back(id);
      }
    }
  }

 private:
  void TryAddBigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const int32_t rank = vocab_.MergeRank(symbols_[left].id, symbols_[right].id);
    if (rank < 0) return;
    queue_.push({left, right, rank, symbols_[left].n + symbols_[right].n});
  }

  const Vocab& vocab_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue_;
};

}  // namespace

void BpeEncode(const Vocab& vocab, std::string_view text, std::vector<TokenId>* out) {
  BpeSession session(vocab);
  for (const std::string& piece : PreTokenize(vocab.pre_tokenizer(), text)) {
    session.EncodeWord(ByteEncode(piece), out);
  }
}

}  // namespace moert::tokenizer
