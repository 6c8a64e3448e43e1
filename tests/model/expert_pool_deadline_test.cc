// A model with an expert pool on a device so slow that every load passes the loader's
// deadline: the decode steps read their experts themselves and give the fully
// resident tokens and logits bit for bit (with and without prefetch), each timeout
// counted. Dropping the queued prefetches (Model::CancelPendingLoads) and destroying
// the model with a held-up read and a long queue return promptly (2 s: hang guards,
// not speed claims).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "common/held_reads.h"
#include "experts/expert_cache.h"
#include "model/decoder.h"
#include "model/expert_pool_util.h"
#include "model/model.h"

namespace moert::model {
namespace {

using Clock = std::chrono::steady_clock;
using pool_test::Reference;
using test_util::kHangGuard;
using test_util::ReadGate;
using test_util::ReadHook;
using test_util::SlowReads;
using test_util::SameBits;

const std::string kName = "tiny-moe-shakespeare-q4_0.gguf";

class ExpertPoolDeadlineTest : public ::testing::TestWithParam<bool> {};

TEST_P(ExpertPoolDeadlineTest, LoadsPastTheDeadlineGiveTheSameTokensAndLogits) {
  ModelLoadOptions options = pool_test::Options();
  options.expert_pool_fraction = 0.25;
  options.io_mode = experts::IoMode::kBuffered;
  options.prefetch = GetParam();
  options.expert_cache.loader.wait_deadline_ms = 2;
  options.expert_cache.loader.before_read_for_testing = SlowReads(20);
  std::unique_ptr<Model> model = pool_test::Load(kName, options);
  ASSERT_NE(model, nullptr);
  const pool_test::Generation got = pool_test::Generate(*model);
  const pool_test::Generation& want = Reference(kName);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_TRUE(SameBits(got.prefill, want.prefill)) << "prefill logits differ";
  EXPECT_TRUE(SameBits(got.decode, want.decode)) << "decode logits differ";
  const MemoryStats s = model->memory_stats();
  EXPECT_GT(s.pool.load_timeouts, 0u);
  EXPECT_EQ(s.pool.failed_loads, 0u);
  EXPECT_EQ(s.pool.pinned_experts, 0u);
  std::printf("prefetch %s: %llu misses, %llu load timeouts\n", GetParam() ? "on" : "off",
              static_cast<unsigned long long>(s.pool.misses),
              static_cast<unsigned long long>(s.pool.load_timeouts));
}

INSTANTIATE_TEST_SUITE_P(Prefetch, ExpertPoolDeadlineTest, ::testing::Bool(),
                         [](const auto& test) { return test.param ? "on" : "off"; });

// A model whose loader's reads `hook` holds up, with as many prefetches queued behind
// the read in progress as the queue takes.
std::unique_ptr<Model> LoadWithALongQueue(ReadHook hook) {
  ModelLoadOptions options = pool_test::Options();
  options.expert_pool_fraction = 1.0;
  options.io_mode = experts::IoMode::kBuffered;
  options.expert_cache.loader.io_threads = 1;  // the read held up holds the queue behind it
  options.expert_cache.loader.before_read_for_testing = std::move(hook);
  std::unique_ptr<Model> model = pool_test::Load(kName, options);
  if (model == nullptr) return nullptr;
  experts::ExpertCache& cache = *dynamic_cast<DecoderModel&>(*model).expert_cache();
  for (int l = 0; l < 4; ++l) {
    for (int e = 0; e < 8; ++e) cache.Prefetch(l, e);  // until the queue is full
  }
  return model;
}

size_t Queued(Model& model) {
  return dynamic_cast<DecoderModel&>(model).expert_cache()->loader().queued();
}

class ExpertPoolCancel : public ::testing::Test {
 protected:
  void TearDown() override { gate_.Open(); }  // before the model goes
  ReadGate gate_;
  std::unique_ptr<Model> model_;
};

TEST_F(ExpertPoolCancel, DroppingQueuedPrefetchesDuringAHeldUpReadIsPrompt) {
  model_ = LoadWithALongQueue(gate_.Hook());
  ASSERT_NE(model_, nullptr);
  gate_.AwaitHeld(1);
  const size_t queued = Queued(*model_);
  EXPECT_GE(queued, 8u);
  const auto start = Clock::now();
  model_->CancelPendingLoads();
  const auto took = Clock::now() - start;
  EXPECT_LT(took, kHangGuard);
  std::printf("CancelPendingLoads: %zu queued loads dropped in %.3f ms\n", queued,
              std::chrono::duration<double, std::milli>(took).count());
  const MemoryStats s = model_->memory_stats();
  EXPECT_EQ(s.pool.prefetch_cancelled, queued);
  EXPECT_EQ(s.pool.loads_in_flight, 1u);  // the read held up
  EXPECT_EQ(Queued(*model_), 0u);
}

TEST(ExpertPoolDestroy, WithAHeldUpReadAndALongQueueIsPrompt) {
  std::unique_ptr<Model> model = LoadWithALongQueue(SlowReads(300));
  ASSERT_NE(model, nullptr);
  const experts::ExpertCache& cache = *dynamic_cast<DecoderModel&>(*model).expert_cache();
  ASSERT_TRUE(test_util::Eventually(
      [&] { return cache.loader().queued() < cache.stats().loads_in_flight; }));
  const size_t queued = Queued(*model);
  EXPECT_GE(queued, 8u);
  const auto start = Clock::now();
  model.reset();
  const auto took = Clock::now() - start;
  EXPECT_LT(took, kHangGuard);
  std::printf("destroyed with a 300 ms read held up and %zu queued in %.1f ms\n", queued,
              std::chrono::duration<double, std::milli>(took).count());
}

}  // namespace
}  // namespace moert::model
