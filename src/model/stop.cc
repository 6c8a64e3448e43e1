// StopMatcher: hold back what may start a stop string, cut at the first complete
// one.
#include "model/stop.h"

#include <algorithm>
#include <utility>

namespace moert::model {

StopMatcher::StopMatcher(std::vector<std::string> stop_strings) {
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) continue;
    stops_.push_back(std::move(stop_strings[i]));
    stop_index_.push_back(static_cast<int>(i));
  }
}

std::string StopMatcher::Push(std::string_view piece) {
  if (stopped()) return {};
  pending_.append(piece);

  // Everything shown so far had no stop string start in it (it was not held
  // back), so an occurrence lies wholly in pending_. The first to end wins: that
  // is the one a piece-by-piece feed would have met first, which keeps the result
  // independent of how the text is split.
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = pending_.find(stops_[i]);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stops_[i].size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_pos = pos;
      best_end = end;
      matched_ = stop_index_[i];
    }
  }
  if (best_pos != std::string::npos) {
    std::string out = pending_.substr(0, best_pos);
    pending_.clear();
    return out;
  }

  const size_t keep = HeldBackLength();
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  if (stopped()) return {};
  return std::exchange(pending_, std::string());
}

void StopMatcher::Reset() {
  pending_.clear();
  matched_ = -1;
}

size_t StopMatcher::HeldBackLength() const {
  size_t longest = 0;
  const std::string_view text = pending_;
  for (const std::string& stop : stops_) {
    // Proper prefixes only: a whole stop string would have matched above.
    for (size_t len = std::min(text.size(), stop.size() - 1); len > longest; --len) {
      if (text.substr(text.size() - len) == std::string_view(stop).substr(0, len)) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

}  // namespace moert::model
