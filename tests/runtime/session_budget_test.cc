// Every session inside the memory budget, through the public C++ API: each session's KV
// cache is reserved in the budget; one that does not fit fails with ResourceExhausted
// naming the numbers and the others go on; with shrink_pool_for_sessions it takes its
// bytes from the expert pool (down to the floor) and gives them back when it ends; the
// default context is what fits; TrimMemory shrinks the pool and frees idle sessions'
// caches without changing what they generate; and the process's resident memory stays
// within the budget (+5%) while two long sessions generate in turn.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "moert/runtime.h"

namespace moert {
namespace {

const std::string kQ4Model =
    std::string(MOERT_SHARED_DIR) + "/models/tiny-moe-shakespeare-q4_0.gguf";
constexpr int64_t kMiB = int64_t{1} << 20;
// The tiny model's KV cache: 4 layers of 128 key and 128 value floats per position.
constexpr int64_t kKvBytesPerPosition = 4 * (128 + 128) * 4;
// What the budget charges for one of its experts: its 54 pages (in a 256 KiB block).
// A pool is a whole number of them.
constexpr int64_t kCharge = 221184;
constexpr int64_t Charges(int64_t bytes) { return bytes / kCharge * kCharge; }

RuntimeOptions Options(int context_length, int64_t pool_bytes) {
  RuntimeOptions options;
  options.threads = 1;
  options.context_length = context_length;
  options.expert_pool_bytes = pool_bytes;
  options.router_alpha = 0;  // routing independent of residency: tokens comparable
  options.hot_set = false;   // tests never write beside the shared models
  // Prefetch on (the default, said here): the pool's limit holds for prefetches too.
  options.prefetch = true;
  return options;
}

std::unique_ptr<MoERuntime> Loaded(const RuntimeOptions& options) {
  std::unique_ptr<MoERuntime> runtime;
  Status status = MoERuntime::Create(options, &runtime);
  EXPECT_TRUE(status.ok()) << status.ToString();
  if (!status.ok()) return nullptr;
  status = runtime->LoadModel(kQ4Model);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return status.ok() ? std::move(runtime) : nullptr;
}

// What a budget of everything but the KV cache holds: the weights outside the pool,
// scratch and the pool (read from the budget a model derives without one).
int64_t BudgetWithoutKv(int context_length, int64_t pool_bytes) {
  auto probe = Loaded(Options(context_length, pool_bytes));
  if (probe == nullptr) return 0;
  GenerateRequest request;
  request.prompt = "A";
  request.max_tokens = 1;
  if (!probe->Generate(request).ok()) return 0;
  return probe->Stats().budget_bytes - int64_t{context_length} * kKvBytesPerPosition;
}

GenerateRequest Greedy(std::string prompt, int max_tokens) {
  GenerateRequest request;
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  request.temperature = 0.0f;
  return request;
}

std::vector<int32_t> GenerateOn(Session& session, const std::string& prompt, int max_tokens) {
  GenerateResult result;
  const Status status = session.Generate(Greedy(prompt, max_tokens), {}, &result);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return result.tokens;
}

std::unique_ptr<Session> NewSession(MoERuntime& runtime, int context_length = 0) {
  std::unique_ptr<Session> session;
  SessionOptions options;
  options.context_length = context_length;
  const Status status = runtime.CreateSession(options, &session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

TEST(SessionBudgetTest, AThirdSessionOverTheBudgetFailsCleanlyAndTheOthersGoOn) {
  constexpr int kContext = 2048;
  const int64_t base = BudgetWithoutKv(kContext, 2 * kMiB);
  ASSERT_GT(base, 0);
  RuntimeOptions options = Options(kContext, 2 * kMiB);
  options.memory_budget_bytes = base + 2 * kContext * kKvBytesPerPosition;  // two sessions
  auto runtime = Loaded(options);
  ASSERT_NE(runtime, nullptr);
  auto a = NewSession(*runtime);
  auto b = NewSession(*runtime);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<int32_t> a_first = GenerateOn(*a, "ROMEO:", 8);

  std::unique_ptr<Session> c;
  const Status refused = runtime->CreateSession(&c);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_EQ(c, nullptr);
  const std::string& message = refused.message();
  EXPECT_NE(message.find("a KV cache of 2048 positions needs 8388608 bytes"), std::string::npos)
      << message;
  EXPECT_NE(message.find(std::to_string(options.memory_budget_bytes)), std::string::npos)
      << message;
  EXPECT_NE(message.find("16777216 bytes of 2 KV cache(s)"), std::string::npos) << message;
  EXPECT_NE(message.find("shrink_pool"), std::string::npos) << message;

  // The first two go on: b generates what a did from the same prompt, a continues.
  EXPECT_EQ(GenerateOn(*b, "ROMEO:", 8), a_first);
  EXPECT_EQ(GenerateOn(*a, " and", 4).size(), 4u);
  EXPECT_EQ(a->Stats().kv_caches, 2);
  EXPECT_EQ(a->Stats().kv_reserved_bytes, 2 * kContext * kKvBytesPerPosition);
  EXPECT_EQ(a->Stats().kv_cache_bytes, kContext * kKvBytesPerPosition);

  // A session's end gives its reservation back; a smaller session fits beside them.
  b.reset();
  ASSERT_TRUE(runtime->CreateSession(&c).ok());
  std::unique_ptr<Session> small;
  SessionOptions tiny;
  tiny.context_length = 16;
  EXPECT_EQ(runtime->CreateSession(tiny, &small).code(), StatusCode::kResourceExhausted)
      << "the budget is full again: a and c";
  c.reset();
  small = NewSession(*runtime, 16);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->context_length(), 16);
}

TEST(SessionBudgetTest, ShrinkPoolForSessionsTakesFromThePoolDownToItsFloor) {
  constexpr int kContext = 512;  // 2 MiB of KV cache
  const int64_t base = BudgetWithoutKv(kContext, 4 * kMiB);
  ASSERT_GT(base, 0);
  RuntimeOptions options = Options(kContext, 4 * kMiB);
  options.memory_budget_bytes = base + kContext * kKvBytesPerPosition;  // one session
  options.shrink_pool_for_sessions = true;
  // What the pool keeps when a second session's 2 MiB come out of it.
  const int64_t shrunk = Charges(Charges(4 * kMiB) - 2 * kMiB);
  options.expert_pool_floor_bytes = shrunk;

  auto reference_runtime = Loaded(Options(kContext, 0));
  ASSERT_NE(reference_runtime, nullptr);
  auto reference = NewSession(*reference_runtime);
  const std::vector<int32_t> want = GenerateOn(*reference, "JULIET:", 12);

  auto runtime = Loaded(options);
  ASSERT_NE(runtime, nullptr);
  auto a = NewSession(*runtime);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(GenerateOn(*a, "JULIET:", 12), want);
  EXPECT_EQ(a->Stats().expert_pool_bytes, Charges(4 * kMiB));

  auto b = NewSession(*runtime);  // takes 2 MiB from the pool
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(GenerateOn(*b, "JULIET:", 12), want);  // outputs do not depend on the pool's size
  EXPECT_EQ(b->Stats().expert_pool_bytes, shrunk);
  EXPECT_LE(b->Stats().expert_pool_used_bytes, shrunk);

  std::unique_ptr<Session> c;
  const Status refused = runtime->CreateSession(&c);  // the pool is at its floor
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("(its floor)"), std::string::npos) << refused.ToString();

  b.reset();  // the pool grows back
  a->Reset();
  EXPECT_EQ(GenerateOn(*a, "JULIET:", 12), want);
  EXPECT_EQ(a->Stats().expert_pool_bytes, Charges(4 * kMiB));
}

TEST(SessionBudgetTest, TheDefaultContextIsWhatFits) {
  // Without a budget: the training context (256).
  auto plain = Loaded(Options(0, 2 * kMiB));
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->model_info().context_length, 256);

  // A budget that leaves 100 positions beside a sized pool gets 100.
  const int64_t base = BudgetWithoutKv(256, 2 * kMiB);
  ASSERT_GT(base, 0);
  RuntimeOptions options = Options(0, 2 * kMiB);
  options.memory_budget_bytes = base + 100 * kKvBytesPerPosition + 1000;
  auto runtime = Loaded(options);
  ASSERT_NE(runtime, nullptr);
  EXPECT_EQ(runtime->model_info().context_length, 100);
  auto session = NewSession(*runtime);
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->context_length(), 100);

  // One position short of nothing: a load error naming the numbers.
  options.memory_budget_bytes = base + kKvBytesPerPosition / 2;
  std::unique_ptr<MoERuntime> none;
  ASSERT_TRUE(MoERuntime::Create(options, &none).ok());
  const Status status = none->LoadModel(kQ4Model);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("not one KV cache position (4096 bytes)"), std::string::npos)
      << status.ToString();
}

TEST(SessionBudgetTest, BadSessionOptions) {
  auto runtime = Loaded(Options(64, 2 * kMiB));
  ASSERT_NE(runtime, nullptr);
  std::unique_ptr<Session> session;
  SessionOptions options;
  options.context_length = -1;
  EXPECT_EQ(runtime->CreateSession(options, &session).code(), StatusCode::kInvalidArgument);
  options.context_length = 1 << 23;
  EXPECT_EQ(runtime->CreateSession(options, &session).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(session, nullptr);
  EXPECT_EQ(runtime->TrimMemory(-1).code(), StatusCode::kInvalidArgument);
  options.context_length = 32;
  ASSERT_TRUE(runtime->CreateSession(options, &session).ok());
  EXPECT_EQ(session->context_length(), 32);
}

TEST(SessionBudgetTest, TrimShrinksThePoolAndFreesIdleSessionsWithoutChangingTheirOutput) {
  auto reference_runtime = Loaded(Options(256, 0));
  ASSERT_NE(reference_runtime, nullptr);
  auto reference = NewSession(*reference_runtime);
  const std::vector<int32_t> first = GenerateOn(*reference, "KING:", 10);
  const std::vector<int32_t> second = GenerateOn(*reference, " the", 10);

  RuntimeOptions options = Options(256, 4 * kMiB);
  options.expert_pool_floor_bytes = 2 * kMiB;
  auto runtime = Loaded(options);
  ASSERT_NE(runtime, nullptr);
  auto session = NewSession(*runtime);
  EXPECT_EQ(GenerateOn(*session, "KING:", 10), first);
  const int context = static_cast<int>(session->context_tokens().size());
  EXPECT_EQ(session->Stats().expert_pool_bytes, Charges(4 * kMiB));
  EXPECT_GT(session->Stats().expert_pool_used_bytes, 2 * kMiB);

  // Complete: the pool to its floor at once (no step runs), the idle session's cache freed.
  ASSERT_TRUE(runtime->TrimMemory(static_cast<int>(TrimLevel::kComplete)).ok());
  EXPECT_EQ(GenerateOn(*session, " the", 10), second);  // its context evaluated again
  EXPECT_EQ(session->Stats().cached_tokens, 0);
  EXPECT_GE(session->Stats().prefill_tokens, context);
  EXPECT_EQ(session->Stats().expert_pool_bytes, Charges(2 * kMiB));
  EXPECT_LE(session->Stats().expert_pool_used_bytes, Charges(2 * kMiB));

  // A moderate level caps at 75%; none lifts the cap.
  ASSERT_TRUE(runtime->TrimMemory(static_cast<int>(TrimLevel::kRunningModerate)).ok());
  GenerateOn(*session, " a", 2);
  EXPECT_EQ(session->Stats().expert_pool_bytes, Charges(Charges(4 * kMiB) * 3 / 4));
  ASSERT_TRUE(runtime->TrimMemory(static_cast<int>(TrimLevel::kNone)).ok());
  GenerateOn(*session, " a", 2);
  EXPECT_EQ(session->Stats().expert_pool_bytes, Charges(4 * kMiB));
  EXPECT_GT(session->Stats().cached_tokens, 0);  // trims below Complete keep the cache
}

// The process's resident set now and at its peak (/proc/self/status), 0 where unknown.
struct Rss {
  int64_t now = 0;
  int64_t peak = 0;
};

Rss ReadRss() {
  Rss rss;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    std::istringstream in(line);
    std::string key;
    int64_t kib = 0;
    in >> key >> kib;
    if (key == "VmRSS:") rss.now = kib * 1024;
    if (key == "VmHWM:") rss.peak = kib * 1024;
  }
  return rss;
}

// Resets the peak to the current resident set (Linux >= 4.0); false where refused.
bool ResetPeakRss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

TEST(SessionBudgetTest, PeakRssStaysWithinTheBudgetWhileTwoLongSessionsGenerateInTurn) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory is in the resident set";
#endif
  if (!ResetPeakRss() || ReadRss().peak == 0) {
    GTEST_SKIP() << "/proc/self/clear_refs or VmHWM is not available here";
  }
  constexpr int kContext = 4096;  // 16 MiB of KV cache a session
  RuntimeOptions options = Options(kContext, 0);
  // Weights and scratch about 37 MiB (16 of them the runtime's allowance), 2 sessions
  // of 16 MiB; the pool gets the rest.
  options.memory_budget_bytes = 86 * kMiB;
  options.shrink_pool_for_sessions = true;
  const Rss before = ReadRss();
  auto runtime = Loaded(options);
  ASSERT_NE(runtime, nullptr);
  auto a = NewSession(*runtime);
  auto b = NewSession(*runtime);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::ifstream text(std::string(MOERT_SHARED_DIR) + "/models/valid.txt");
  std::stringstream read;
  read << text.rdbuf();
  std::string long_text = read.str();
  long_text.resize(6000);  // about 2,000 tokens
  for (int turn = 0; turn < 3; ++turn) {
    const std::string piece = long_text.substr(static_cast<size_t>(turn) * 2000, 2000);
    EXPECT_EQ(GenerateOn(*a, piece, 8).size(), 8u);
    EXPECT_EQ(GenerateOn(*b, piece, 8).size(), 8u);
  }
  EXPECT_GT(a->context_tokens().size(), 1500u);
  std::unique_ptr<Session> third;
  EXPECT_EQ(runtime->CreateSession(&third).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(GenerateOn(*a, " and", 4).size(), 4u);
  const Rss after = ReadRss();
  const int64_t grown = after.peak - before.now;
  EXPECT_LE(grown, options.memory_budget_bytes + options.memory_budget_bytes / 20)
      << "peak RSS grew by " << grown << " bytes over a budget of " << options.memory_budget_bytes;
  RecordProperty("peak_rss_growth_bytes", std::to_string(grown));
}

}  // namespace
}  // namespace moert
