// A fixed greedy run of a model, for tests that compare two ways of running the same
// model bit for bit (an expert pool against fully resident experts, prefetch on
// against off): a prompt that spreads over the experts, one prefill batch (every
// row's logits kept), then greedy decoding one token at a time.
#ifndef MOERT_TESTS_COMMON_GREEDY_RUN_H_
#define MOERT_TESTS_COMMON_GREEDY_RUN_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/model.h"

namespace moert::test_util {

// "First Citizen:\nBefore we proceed" (the oracle vocabulary), then pseudo-random ids
// below 2048 from `seed` up to `n` tokens.
inline std::vector<int32_t> SpreadPrompt(size_t n, uint32_t seed = 12345) {
  std::vector<int32_t> ids = {1, 650, 996, 2007, 13, 2026, 1985, 565, 341, 586, 1749};
  uint32_t state = seed;
  while (ids.size() < n) {
    state = state * 1103515245u + 12345u;
    ids.push_back(static_cast<int32_t>((state >> 8) % 2048));
  }
  return ids;
}

inline int32_t Argmax(const float* logits, size_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct GreedyRun {
  std::vector<float> prefill;  // every prompt token's logits
  std::vector<int32_t> tokens;
  std::vector<float> decode;   // each step's logits
};

// SpreadPrompt(prompt_tokens) as one batch into a 64-position cache, then
// `decode_steps` greedy tokens. Failures are test failures (the run stops there).
inline GreedyRun RunGreedy(model::Model& model, size_t prompt_tokens, int decode_steps) {
  GreedyRun g;
  auto cache = model.NewKvCache(64);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return g;
  const std::vector<int32_t> prompt = SpreadPrompt(prompt_tokens);
  absl::Status s = model.Forward(prompt, cache->get(), model::LogitsFor::kAll, &g.prefill);
  EXPECT_TRUE(s.ok()) << s;
  const size_t vocab = model.spec().n_vocab;
  if (g.prefill.size() != prompt.size() * vocab) return g;
  int32_t next = Argmax(g.prefill.data() + (prompt.size() - 1) * vocab, vocab);
  std::vector<float> logits;
  for (int i = 0; i < decode_steps; ++i) {
    g.tokens.push_back(next);
    s = model.Forward({&next, 1}, cache->get(), model::LogitsFor::kLast, &logits);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return g;
    g.decode.insert(g.decode.end(), logits.begin(), logits.end());
    next = Argmax(logits.data(), vocab);
  }
  return g;
}

}  // namespace moert::test_util

#endif  // MOERT_TESTS_COMMON_GREEDY_RUN_H_
