// Stop strings for streamed generation: StopMatcher is fed the decoded text pieces
// and hands back only text that can no longer turn into a stop string, so the
// stop string never reaches the user. EOS / end-of-turn token stops are the
// caller's (by the vocabulary's ids).
#ifndef MOERT_MODEL_STOP_H_
#define MOERT_MODEL_STOP_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace moert::model {

// The text shown is the generated text up to the first stop string to complete
// (the one that ends first; of those ending together, the longest), whatever the
// split of the text into pieces. Matching is on bytes.
class StopMatcher {
 public:
  // Empty strings in `stop_strings` are ignored (they would stop at once).
  explicit StopMatcher(std::vector<std::string> stop_strings);

  // Feeds the next decoded piece; returns the text that may be shown now. It
  // holds back the longest tail that is the start of a stop string. When a stop
  // string completes, returns the text before it, stopped() turns true, and every
  // later call returns "".
  std::string Push(std::string_view piece);

  // When generation ends for another reason (EOS, length): the held-back text,
  // which turned out not to be a stop string. "" once stopped.
  std::string Flush();

  bool stopped() const { return matched_ >= 0; }
  // The index in the constructor's `stop_strings` of the string that stopped
  // generation; -1 while none has.
  int matched() const { return matched_; }
  // The text held back at the moment (never shown yet).
  const std::string& pending() const { return pending_; }

  // Forgets the pending text and the stop, for a new generation.
  void Reset();

 private:
  // Length of the longest tail of pending_ that is a proper prefix of a stop
  // string.
  size_t HeldBackLength() const;

  std::vector<std::string> stops_;
  std::vector<int> stop_index_;  // stops_[i] is the constructor's stop_index_[i]-th
  std::string pending_;
  int matched_ = -1;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_STOP_H_
