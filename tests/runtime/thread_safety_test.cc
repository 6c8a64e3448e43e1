// The calls documented for any thread, hammered from several threads while the runtime
// loads models and generates: SetTemperature, TrimMemory and CreateSession against
// LoadModel and Generate; sessions on different threads taking turns on one model; the
// C API's any-thread calls leaving the handle's last error alone. The assertions are on
// behaviour (every call succeeds, tokens equal a single-threaded run); the data races
// are ThreadSanitizer's to find (the CI's TSan step runs this binary).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/greedy_request.h"
#include "moert/moert.h"
#include "moert/runtime.h"

namespace moert {
namespace {

const std::string kQ4Model =
    std::string(MOERT_SHARED_DIR) + "/models/tiny-moe-shakespeare-q4_0.gguf";
const std::string kQ8Model =
    std::string(MOERT_SHARED_DIR) + "/models/tiny-moe-shakespeare-q8_0.gguf";

RuntimeOptions Options() {
  RuntimeOptions options;
  options.threads = 1;
  options.context_length = 64;
  options.expert_pool_bytes = 4 << 20;
  options.router_alpha = 0;
  options.hot_set = false;
  return options;
}

using test_util::Greedy;

TEST(ThreadSafetyTest, AnyThreadCallsRaceWithLoadModelAndGenerate) {
  std::unique_ptr<MoERuntime> runtime;
  ASSERT_TRUE(MoERuntime::Create(Options(), &runtime).ok());
  ASSERT_TRUE(runtime->LoadModel(kQ4Model).ok());
  GenerateResult want;
  ASSERT_TRUE(runtime->Generate(Greedy(6), {}, &want).ok());

  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // the app's thermal and memory signals
    for (int i = 0; !stop.load(); ++i) {
      runtime->SetTemperature(i % 2 == 0 ? 40.0f : std::numeric_limits<float>::quiet_NaN());
      if (!runtime->TrimMemory(i % 3 == 0 ? 5 : 0).ok()) ++failures;
      (void)runtime->model_info();
    }
  });
  threads.emplace_back([&] {  // sessions made and dropped while models change
    while (!stop.load()) {
      std::unique_ptr<Session> session;
      const Status status = runtime->CreateSession(&session);
      if (!status.ok() && status.code() != StatusCode::kFailedPrecondition) ++failures;
    }
  });
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(runtime->LoadModel(round % 2 == 0 ? kQ8Model : kQ4Model).ok());
    GenerateResult got;
    ASSERT_TRUE(runtime->Generate(Greedy(6), {}, &got).ok());
    EXPECT_EQ(got.tokens.size(), 6u);
  }
  ASSERT_TRUE(runtime->LoadModel(kQ4Model).ok());
  ASSERT_TRUE(runtime->TrimMemory(0).ok());
  GenerateResult again;
  ASSERT_TRUE(runtime->Generate(Greedy(6), {}, &again).ok());
  stop = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(again.tokens, want.tokens);
}

TEST(ThreadSafetyTest, SessionsOnThreadsTakeTurnsAndOneShotCallsToo) {
  std::unique_ptr<MoERuntime> runtime;
  ASSERT_TRUE(MoERuntime::Create(Options(), &runtime).ok());
  ASSERT_TRUE(runtime->LoadModel(kQ4Model).ok());
  GenerateResult want;
  ASSERT_TRUE(runtime->Generate(Greedy(8), {}, &want).ok());

  constexpr int kThreads = 3;
  std::vector<std::vector<int32_t>> got(kThreads * 2);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<Session> session;
      if (!runtime->CreateSession(&session).ok()) return;
      GenerateResult result;
      if (session->Generate(Greedy(8), {}, &result).ok()) got[t] = result.tokens;
      // The runtime's one-shot Generate from several threads: they take turns.
      GenerateResult one_shot;
      if (runtime->Generate(Greedy(8), {}, &one_shot).ok()) got[kThreads + t] = one_shot.tokens;
      if (t == 0) (void)runtime->TrimMemory(80);  // frees the idle sessions' caches
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::vector<int32_t>& tokens : got) EXPECT_EQ(tokens, want.tokens);
}

TEST(ThreadSafetyTest, CApiAnyThreadCallsLeaveTheLastErrorAlone) {
  moert_runtime_options options;
  moert_runtime_options_default(&options);
  options.threads = 1;
  options.context_length = 64;
  moert_runtime* rt = nullptr;
  ASSERT_EQ(moert_runtime_create(&options, &rt), MOERT_OK);
  ASSERT_EQ(moert_runtime_set_hot_set(rt, 0), MOERT_OK);
  ASSERT_EQ(moert_runtime_load_model(rt, kQ4Model.c_str(), nullptr, nullptr), MOERT_OK);
  // A failed call on this thread leaves an error the others must not clear.
  ASSERT_EQ(moert_runtime_set_memory_budget(rt, -1), MOERT_INVALID_ARGUMENT);
  const std::string error = moert_last_error(rt);
  ASSERT_NE(error.find("memory_budget_bytes"), std::string::npos);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        if (moert_runtime_set_temperature(rt, 30.0f + static_cast<float>(i % 20)) != MOERT_OK) {
          ++failures;
        }
        if (moert_runtime_trim(rt, t == 0 ? 10 : 0) != MOERT_OK) ++failures;
      }
      // An error on another thread goes to that thread's slot.
      if (moert_runtime_trim(rt, -1) != MOERT_INVALID_ARGUMENT) ++failures;
      if (std::strstr(moert_last_error(nullptr), "trim level") == nullptr) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(std::string(moert_last_error(rt)), error);
  moert_runtime_destroy(rt);
}

}  // namespace
}  // namespace moert
