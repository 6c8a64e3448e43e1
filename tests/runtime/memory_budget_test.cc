// The memory budget through the public C++ API: an expert pool gives the same greedy
// tokens as fully resident experts, its figures reach GenerationStats, bad options and
// a budget below the weights are clear errors, and the hot set is written beside the
// model when the model is unloaded and read back at the next load.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/greedy_request.h"
#include "moert/runtime.h"

namespace moert {
namespace {

const std::string kQ4Model = std::string(MOERT_SHARED_DIR) + "/models/tiny-moe-shakespeare-q4_0.gguf";

RuntimeOptions Options() {
  RuntimeOptions options;
  options.threads = 1;
  options.context_length = 64;
  options.hot_set = false;  // tests never write beside the shared models
  return options;
}

using test_util::Greedy;

std::unique_ptr<MoERuntime> Loaded(const RuntimeOptions& options, const std::string& path) {
  std::unique_ptr<MoERuntime> runtime;
  Status status = MoERuntime::Create(options, &runtime);
  EXPECT_TRUE(status.ok()) << status.ToString();
  if (!status.ok()) return nullptr;
  status = runtime->LoadModel(path);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return status.ok() ? std::move(runtime) : nullptr;
}

std::vector<int32_t> GreedyTokens(MoERuntime& runtime, int n) {
  GenerateResult result;
  const Status status = runtime.Generate(Greedy(n), {}, &result);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return result.tokens;
}

TEST(MemoryBudgetTest, PoolGivesTheSameTokensAndReportsItsFigures) {
  auto resident = Loaded(Options(), kQ4Model);
  ASSERT_NE(resident, nullptr);
  const std::vector<int32_t> want = GreedyTokens(*resident, 24);
  EXPECT_EQ(resident->Stats().budget_bytes, 0);
  EXPECT_EQ(resident->Stats().expert_pool_bytes, 0);

  for (IoMode io : {IoMode::kDirect, IoMode::kBuffered, IoMode::kMmap}) {
    RuntimeOptions options = Options();
    options.expert_pool_fraction = 0.25;
    options.io_mode = io;
    options.router_alpha = 0;  // the residency penalty would change routing by design
    auto pooled = Loaded(options, kQ4Model);
    ASSERT_NE(pooled, nullptr);
    EXPECT_EQ(GreedyTokens(*pooled, 24), want) << "io mode " << static_cast<int>(io);
    const GenerationStats s = pooled->Stats();
    // 8 of the 32 experts: each 221184 bytes of pages (the budget's charge), in a 256 KiB
    // block.
    EXPECT_EQ(s.expert_pool_bytes, 8 * 221184);
    EXPECT_GT(s.budget_bytes, s.expert_pool_bytes);
    EXPECT_GT(s.expert_pool_used_bytes, 0);
    EXPECT_EQ(s.expert_pool_used_bytes + s.expert_pool_free_bytes, s.expert_pool_bytes);
    // A fraction; 1 would mean no free block at all in a pool with free bytes.
    EXPECT_TRUE(s.expert_pool_fragmentation >= 0.0 && s.expert_pool_fragmentation < 1.0)
        << s.expert_pool_fragmentation;
    // A quarter of the experts resident: some needed ones are there, some are not.
    EXPECT_GT(s.expert_hit_rate, 0.0);
    EXPECT_LT(s.expert_hit_rate, 1.0);
    EXPECT_GT(s.expert_bytes_read_per_token, 0.0);
    EXPECT_GT(s.expert_stall_ms_per_token, 0.0);  // misses wait for their reads
    EXPECT_GT(s.peak_rss_bytes, 0);
  }
}

TEST(MemoryBudgetTest, RoutingOptionsAndTheirStats) {
  RuntimeOptions options = Options();
  options.router_alpha = -1;
  std::unique_ptr<MoERuntime> runtime;
  Status status = MoERuntime::Create(options, &runtime);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("router_alpha"), std::string::npos);
  options = Options();
  options.dynamic_k = 2;
  EXPECT_EQ(MoERuntime::Create(options, &runtime).code(), StatusCode::kInvalidArgument);
  options = Options();
  options.thermal_limit_c = -1;
  EXPECT_EQ(MoERuntime::Create(options, &runtime).code(), StatusCode::kInvalidArgument);

  // Fully resident, no limit: the model's k = 2 everywhere, nothing changed.
  auto resident = Loaded(Options(), kQ4Model);
  ASSERT_NE(resident, nullptr);
  GreedyTokens(*resident, 8);
  EXPECT_EQ(resident->Stats().average_experts_per_token, 2.0);
  EXPECT_EQ(resident->Stats().router_changed_fraction, 0.0);

  // Too hot, as the host app reports it: one expert per token.
  options = Options();
  options.thermal_limit_c = 70;
  auto hot = Loaded(options, kQ4Model);
  ASSERT_NE(hot, nullptr);
  hot->SetTemperature(90);
  GreedyTokens(*hot, 8);
  EXPECT_EQ(hot->Stats().average_experts_per_token, 1.0);
  EXPECT_EQ(hot->Stats().router_changed_fraction, 1.0);
  hot->SetTemperature(std::nanf(""));  // back to sysfs (none here, or below 70)
  hot->SetTemperature(20);
  GreedyTokens(*hot, 8);
  EXPECT_EQ(hot->Stats().average_experts_per_token, 2.0);

  // Dynamic k: between one and two experts.
  options = Options();
  options.dynamic_k = 0.6f;
  auto dynamic = Loaded(options, kQ4Model);
  ASSERT_NE(dynamic, nullptr);
  GreedyTokens(*dynamic, 8);
  EXPECT_GT(dynamic->Stats().average_experts_per_token, 1.0);
  EXPECT_LT(dynamic->Stats().average_experts_per_token, 2.0);

  // A quarter of the experts in the pool and a strong residency penalty: some choices
  // move to resident experts.
  options = Options();
  options.expert_pool_fraction = 0.25;
  options.router_alpha = 4;
  auto pressed = Loaded(options, kQ4Model);
  ASSERT_NE(pressed, nullptr);
  GreedyTokens(*pressed, 16);
  EXPECT_GT(pressed->Stats().router_changed_fraction, 0.0);
  EXPECT_EQ(pressed->Stats().average_experts_per_token, 2.0);
}

TEST(MemoryBudgetTest, PrefetchGivesTheSameTokensAndReportsPrecision) {
  RuntimeOptions options = Options();
  options.prefetch_depth = 0;
  std::unique_ptr<MoERuntime> runtime;
  EXPECT_EQ(MoERuntime::Create(options, &runtime).code(), StatusCode::kInvalidArgument);

  options = Options();
  options.expert_pool_fraction = 0.5;
  options.router_alpha = 0;
  options.prefetch = false;
  auto plain = Loaded(options, kQ4Model);
  ASSERT_NE(plain, nullptr);
  const std::vector<int32_t> want = GreedyTokens(*plain, 16);
  EXPECT_EQ(plain->Stats().prefetch_precision, 0.0);
  options.prefetch = true;
  auto prefetched = Loaded(options, kQ4Model);
  ASSERT_NE(prefetched, nullptr);
  EXPECT_EQ(GreedyTokens(*prefetched, 16), want);
  const GenerationStats s = prefetched->Stats();
  EXPECT_GT(s.prefetch_precision, 0.0);
  EXPECT_LE(s.prefetch_precision, 1.0);
  EXPECT_GT(s.prefetch_recall, 0.0);
  EXPECT_LE(s.prefetch_recall, 1.0);
}

// Cancellation from another thread while a forward pass runs (loads and prefetches in
// flight): each call returns OK or Cancelled in bounded time with a prefix of the
// uncancelled tokens, and the next call gives the whole continuation again.
TEST(MemoryBudgetTest, CancelMidTokenWithPrefetchNeitherHangsNorChangesLaterOutput) {
  RuntimeOptions options = Options();
  options.expert_pool_fraction = 0.25;
  options.router_alpha = 0;
  options.prefetch = true;
  auto runtime = Loaded(options, kQ4Model);
  ASSERT_NE(runtime, nullptr);
  const std::vector<int32_t> want = GreedyTokens(*runtime, 24);
  ASSERT_EQ(want.size(), 24u);
  int cancelled = 0;
  for (int trial = 0; trial < 24; ++trial) {
    std::atomic<bool> cancel{false};
    GenerateRequest request = Greedy(24);
    request.cancel = &cancel;
    GenerateResult result;
    Status status;
    std::promise<void> finished;
    std::future<void> done = finished.get_future();
    std::thread worker([&] {
      status = runtime->Generate(request, {}, &result);
      finished.set_value();
    });
    // From 0 to ~2.3 ms in: before the first token, inside prefill, inside decode steps.
    std::this_thread::sleep_for(std::chrono::microseconds(100 * trial));
    cancel.store(true);
    if (done.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
      std::fprintf(stderr, "a cancelled generation did not return in 120 s\n");
      std::abort();  // a deadlock: the worker cannot be joined
    }
    worker.join();
    ASSERT_TRUE(status.ok() || status.code() == StatusCode::kCancelled) << status.ToString();
    if (status.code() == StatusCode::kCancelled) ++cancelled;
    ASSERT_LE(result.tokens.size(), want.size());
    EXPECT_TRUE(std::equal(result.tokens.begin(), result.tokens.end(), want.begin()))
        << "trial " << trial;
  }
  EXPECT_GT(cancelled, 0);  // the first trials cancel before the first token
  // A pin leaked by a cancelled call would have shrunk this 8-expert pool by now.
  EXPECT_EQ(GreedyTokens(*runtime, 24), want);
}

TEST(MemoryBudgetTest, BadOptionsAndTooSmallBudgets) {
  std::unique_ptr<MoERuntime> runtime;
  RuntimeOptions options = Options();
  options.memory_budget_bytes = -1;
  EXPECT_EQ(MoERuntime::Create(options, &runtime).code(), StatusCode::kInvalidArgument);
  options = Options();
  options.expert_pool_fraction = 1.5;
  Status status = MoERuntime::Create(options, &runtime);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("expert_pool_fraction"), std::string::npos);

  ASSERT_TRUE(MoERuntime::Create(Options(), &runtime).ok());
  options = Options();
  options.memory_budget_bytes = 1 << 20;
  ASSERT_TRUE(runtime->SetOptions(options).ok());
  status = runtime->LoadModel(kQ4Model);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("memory budget of 1048576 bytes"), std::string::npos)
      << status.ToString();
  EXPECT_FALSE(runtime->model_loaded());
  // One expert's block: less than the two a token needs.
  options = Options();
  options.expert_pool_bytes = 256 << 10;
  ASSERT_TRUE(runtime->SetOptions(options).ok());
  status = runtime->LoadModel(kQ4Model);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("needs 2 experts"), std::string::npos) << status.ToString();
  options.expert_pool_bytes = -5;
  EXPECT_EQ(runtime->SetOptions(options).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime->options().expert_pool_bytes, 256 << 10);  // unchanged
  EXPECT_EQ(runtime->SaveHotSet().code(), StatusCode::kFailedPrecondition);
}

TEST(MemoryBudgetTest, HotSetIsWrittenOnUnloadAndReadAtLoad) {
  const std::string dir =
      ::testing::TempDir() + "/moert-memory-budget-hot-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model = dir + "/tiny.gguf";
  std::filesystem::copy_file(kQ4Model, model);
  RuntimeOptions options = Options();
  options.hot_set = true;
  options.expert_pool_fraction = 0.5;
  options.cache_dir = dir + "/cache";  // made when first written
  // Hits that do not hang on timing: no prefetch (its loads race the token's own) and
  // routing that does not look at residency.
  options.prefetch = false;
  options.router_alpha = 0;
  const std::string hot = dir + "/cache/hot/tiny.gguf.moert-hot";
  std::vector<int32_t> first;
  double cold_hit_rate = 0;
  {
    auto runtime = Loaded(options, model);
    ASSERT_NE(runtime, nullptr);
    EXPECT_EQ(runtime->model_info().hot_set_path, hot);
    first = GreedyTokens(*runtime, 16);
    cold_hit_rate = runtime->Stats().expert_hit_rate;
    EXPECT_FALSE(std::filesystem::exists(hot));
  }
  ASSERT_TRUE(std::filesystem::exists(hot));
  EXPECT_FALSE(std::filesystem::exists(model + ".moert-hot"));  // never beside the model
  std::ifstream in(hot);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "moert-hot 1");
  // The next start loads those experts first: the same tokens, more hits.
  auto runtime = Loaded(options, model);
  ASSERT_NE(runtime, nullptr);
  EXPECT_EQ(GreedyTokens(*runtime, 16), first);
  EXPECT_GT(runtime->Stats().expert_hit_rate, cold_hit_rate);
  EXPECT_TRUE(runtime->SaveHotSet().ok());
  runtime.reset();
  std::filesystem::remove_all(dir);
}

// A cache directory that cannot be made (a file stands where it would go): SaveHotSet
// says so naming it, and the model goes on generating what it would have.
TEST(MemoryBudgetTest, AnUnwritableCacheDirIsAnErrorNotSilence) {
  const std::string dir =
      ::testing::TempDir() + "/moert-memory-budget-nocache-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "not a directory";
  RuntimeOptions options = Options();
  options.hot_set = true;
  options.expert_pool_fraction = 0.5;
  options.cache_dir = dir + "/file/cache";
  options.router_alpha = 0;  // routing independent of residency: the same tokens again
  auto runtime = Loaded(options, kQ4Model);
  ASSERT_NE(runtime, nullptr);
  const std::vector<int32_t> first = GreedyTokens(*runtime, 8);
  const Status status = runtime->SaveHotSet();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_NE(status.message().find(dir + "/file/cache/hot"), std::string::npos)
      << status.ToString();
  EXPECT_EQ(GreedyTokens(*runtime, 8), first);
  runtime.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moert
