// ModelLoadOptions::ffn_input_observer, the hook moert-pack's calibration reads the
// experts' inputs through: one call per layer and Forward, in layer order, with that
// batch's FFN inputs, and no effect on the results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/model.h"

namespace moert::model {
namespace {

const std::string kModel = std::string(MOERT_SHARED_DIR) + "/models/tiny-moe-shakespeare-f32.gguf";

struct Call {
  int layer;
  int64_t n_tokens;
  std::vector<float> x;
};

TEST(FfnInputObserver, SeesEveryLayersInputAndChangesNothing) {
  auto file = format::GgufFile::Open(kModel);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<Call> calls;
  int64_t n_embd = 0;
  ModelLoadOptions options;
  options.quantized_kernels = false;
  options.ffn_input_observer = [&](int layer, int64_t n, const float* x) {
    calls.push_back({layer, n, std::vector<float>(x, x + n * n_embd)});
  };
  auto observed = Model::Load(**file, options);
  ASSERT_TRUE(observed.ok()) << observed.status();
  n_embd = (*observed)->spec().n_embd;
  const int n_layer = static_cast<int>((*observed)->spec().n_layer);
  options.ffn_input_observer = nullptr;
  auto plain = Model::Load(**file, options);
  ASSERT_TRUE(plain.ok()) << plain.status();

  const std::vector<int32_t> tokens = {1, 826, 2007, 13, 2026};
  auto cache = (*observed)->NewKvCache(16);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  ASSERT_TRUE((*observed)->Forward(tokens, cache->get(), LogitsFor::kAll, &logits).ok());
  ASSERT_EQ(calls.size(), static_cast<size_t>(n_layer));
  for (int il = 0; il < n_layer; ++il) {
    EXPECT_EQ(calls[static_cast<size_t>(il)].layer, il);
    EXPECT_EQ(calls[static_cast<size_t>(il)].n_tokens, 5);
    // The normed residual stream: finite, not all zero, different in every layer.
    double sum_sq = 0;
    for (float v : calls[static_cast<size_t>(il)].x) {
      ASSERT_TRUE(std::isfinite(v));
      sum_sq += static_cast<double>(v) * v;
    }
    EXPECT_GT(sum_sq, 0.0);
    if (il > 0) {
      EXPECT_NE(calls[static_cast<size_t>(il)].x, calls[static_cast<size_t>(il - 1)].x);
    }
  }

  // The observer does not change the logits.
  auto plain_cache = (*plain)->NewKvCache(16);
  ASSERT_TRUE(plain_cache.ok());
  std::vector<float> plain_logits;
  ASSERT_TRUE((*plain)->Forward(tokens, plain_cache->get(), LogitsFor::kAll, &plain_logits).ok());
  EXPECT_EQ(logits, plain_logits);

  // Token by token, it sees the same rows one at a time (the forward pass gives the
  // same bits batched or not).
  const std::vector<Call> batched = calls;
  calls.clear();
  (*cache)->Truncate(0);
  for (int32_t t : tokens) {
    ASSERT_TRUE((*observed)->Forward({&t, 1}, cache->get(), LogitsFor::kLast, &logits).ok());
  }
  ASSERT_EQ(calls.size(), static_cast<size_t>(n_layer) * tokens.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const int il = static_cast<int>(i % static_cast<size_t>(n_layer));
    const size_t t = i / static_cast<size_t>(n_layer);
    ASSERT_EQ(calls[i].layer, il);
    ASSERT_EQ(calls[i].n_tokens, 1);
    const std::vector<float>& all = batched[static_cast<size_t>(il)].x;
    EXPECT_EQ(calls[i].x, std::vector<float>(all.begin() + static_cast<int64_t>(t) * n_embd,
                                             all.begin() + static_cast<int64_t>(t + 1) * n_embd))
        << "layer " << il << ", token " << t;
  }
}

}  // namespace
}  // namespace moert::model
