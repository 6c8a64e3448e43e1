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
#include <thread>

#include "experts/expert_cache.h"
#include "model/decoder.h"
#include "model/expert_pool_util.h"
#include "model/model.h"

namespace moert::model {
namespace {

using Clock = std::chrono::steady_clock;
using pool_test::Reference;
using test_util::SameBits;

const std::string kName = "tiny-moe-shakespeare-q4_0.gguf";
constexpr auto kHangGuard = std::chrono::seconds(2);

// Every read on the loader's thread held up `ms`.
std::function<void(const experts::ExpertInfo&)> SlowDevice(int ms) {
  return [ms](const experts::ExpertInfo&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
}

class ExpertPoolDeadlineTest : public ::testing::TestWithParam<bool> {};

TEST_P(ExpertPoolDeadlineTest, LoadsPastTheDeadlineGiveTheSameTokensAndLogits) {
  ModelLoadOptions options = pool_test::Options();
  options.expert_pool_fraction = 0.25;
  options.io_mode = experts::IoMode::kBuffered;
  options.prefetch = GetParam();
  options.expert_cache.loader.wait_deadline_ms = 2;
  options.expert_cache.loader.before_read_for_testing = SlowDevice(20);
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

// A model whose loader holds every read 300 ms, with `queued` prefetches waiting
// behind the one in progress.
std::unique_ptr<Model> LoadWithALongQueue(size_t* queued) {
  ModelLoadOptions options = pool_test::Options();
  options.expert_pool_fraction = 1.0;
  options.io_mode = experts::IoMode::kBuffered;
  options.expert_cache.loader.before_read_for_testing = SlowDevice(300);
  std::unique_ptr<Model> model = pool_test::Load(kName, options);
  if (model == nullptr) return nullptr;
  experts::ExpertCache& cache = *dynamic_cast<DecoderModel&>(*model).expert_cache();
  for (int l = 0; l < 4; ++l) {
    for (int e = 0; e < 8; ++e) cache.Prefetch(l, e);  // until the queue is full
  }
  const auto until = Clock::now() + kHangGuard;
  while (cache.loader().queued() + 1 < cache.stats().loads_in_flight && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *queued = cache.loader().queued();
  return model;
}

class ExpertPoolCancel : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadWithALongQueue(&queued_);
    ASSERT_NE(model_, nullptr);
    EXPECT_GE(queued_, 8u);
  }
  std::unique_ptr<Model> model_;
  size_t queued_ = 0;
};

TEST_F(ExpertPoolCancel, DroppingQueuedPrefetchesDuringAHeldUpReadIsPrompt) {
  const auto start = Clock::now();
  model_->CancelPendingLoads();
  const auto took = Clock::now() - start;
  EXPECT_LT(took, kHangGuard);
  std::printf("CancelPendingLoads: %zu queued loads dropped in %.3f ms\n", queued_,
              std::chrono::duration<double, std::milli>(took).count());
  const MemoryStats s = model_->memory_stats();
  EXPECT_EQ(s.pool.prefetch_cancelled, queued_);
  EXPECT_LE(s.pool.loads_in_flight, 1u);  // at most the read held up
  EXPECT_EQ(dynamic_cast<DecoderModel&>(*model_).expert_cache()->loader().queued(), 0u);
}

TEST_F(ExpertPoolCancel, DestroyingWithAHeldUpReadAndALongQueueIsPrompt) {
  const auto start = Clock::now();
  model_.reset();
  const auto took = Clock::now() - start;
  EXPECT_LT(took, kHangGuard);
  std::printf("destroyed with a 300 ms read held up and %zu queued in %.1f ms\n", queued_,
              std::chrono::duration<double, std::milli>(took).count());
}

}  // namespace
}  // namespace moert::model
