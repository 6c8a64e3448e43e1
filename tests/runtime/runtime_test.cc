// Tests of the public C++ API (moert/runtime.h) on the tiny MoE model: greedy
// generation against llama.cpp's reference continuation (shared/models/REFERENCE.md),
// KV cache reuse across turns, stop strings, cancel, max_tokens, stats, the context
// policies, and every error a caller can make - after each of which the runtime must
// still generate correctly.
#include "moert/moert.h"
#include "moert/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/tokenizer.h"

namespace moert {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kSharedDir = MOERT_SHARED_DIR;
const std::string kModelPath = kSharedDir + "/models/tiny-moe-shakespeare-f32.gguf";
const std::string kVocabOnlyPath = kSharedDir + "/vocab/ggml-vocab-gpt-2.gguf";

// REFERENCE.md: greedy 32-token continuation of "ROMEO:" (ids 1 826 2007).
const std::vector<int32_t> kPromptIds = {1, 826, 2007};
const std::vector<int32_t> kGreedyIds = {
    13, 2010, 270, 1999, 275, 2014, 277, 309, 261, 271, 584,  260,  1992, 1999, 302,  1999,
    13, 2012, 260, 1992, 275, 369,  822, 261, 292, 393, 2014, 1995, 1999, 13,   2010, 270};
constexpr char kGreedyText[] = "\nAnd, I'll be a breathen, and,\nThen I have been a pain'd,\nAnd";

GenerateRequest Greedy(std::string prompt, int max_tokens) {
  GenerateRequest request;
  request.prompt = std::move(prompt);
  request.max_tokens = max_tokens;
  request.temperature = 0.0f;
  return request;
}

// What a TokenCallback saw.
struct Recorder {
  std::string text;
  std::vector<int32_t> tokens;  // ids >= 0 only
  int calls = 0;
  TokenCallback Callback() {
    return [this](std::string_view piece, int32_t token) {
      ++calls;
      text += piece;
      if (token >= 0) tokens.push_back(token);
      return true;
    };
  }
};

// One compute thread: the machines running the tests are often busy, and results
// do not depend on the thread count (SessionOutlivesRuntimeAndReload uses the default).
RuntimeOptions OneThread() {
  RuntimeOptions options;
  options.threads = 1;
  return options;
}

std::unique_ptr<MoERuntime> NewRuntime(RuntimeOptions options = OneThread()) {
  std::unique_ptr<MoERuntime> runtime;
  const Status status = MoERuntime::Create(options, &runtime);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return runtime;
}

std::unique_ptr<MoERuntime> LoadedRuntime(RuntimeOptions options = OneThread()) {
  std::unique_ptr<MoERuntime> runtime = NewRuntime(options);
  const Status status = runtime->LoadModel(kModelPath);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return runtime;
}

std::unique_ptr<Session> NewSession(MoERuntime& runtime) {
  std::unique_ptr<Session> session;
  const Status status = runtime.CreateSession(&session);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return session;
}

// The check every error test ends with: the runtime still reproduces the reference.
void ExpectGreedyStillWorks(MoERuntime& runtime) {
  GenerateResult result;
  const Status status = runtime.Generate(Greedy("ROMEO:", 8), {}, &result);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_THAT(result.tokens,
              ElementsAreArray(std::vector<int32_t>(kGreedyIds.begin(), kGreedyIds.begin() + 8)));
}

// One runtime with the f32 model for the tests that need nothing special.
class RuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { runtime_ = LoadedRuntime().release(); }
  static void TearDownTestSuite() {
    delete runtime_;
    runtime_ = nullptr;
  }
  static MoERuntime* runtime_;
};
MoERuntime* RuntimeTest::runtime_ = nullptr;

TEST_F(RuntimeTest, ModelInfo) {
  ASSERT_TRUE(runtime_->model_loaded());
  const ModelInfo info = runtime_->model_info();
  EXPECT_EQ(info.path, kModelPath);
  EXPECT_EQ(info.architecture, "llama");
  EXPECT_EQ(info.vocab_size, 2048);
  EXPECT_EQ(info.training_context_length, 256);
  EXPECT_EQ(info.context_length, 256);  // context_length 0: the model's
  EXPECT_EQ(info.chat_template, "plain");
  EXPECT_EQ(runtime_->options().threads, 1);
}

TEST(RuntimeOptionsTest, ZeroThreadsMeansOnePerCpu) {
  auto runtime = NewRuntime(RuntimeOptions());
  EXPECT_GE(runtime->options().threads, 1);
  EXPECT_EQ(runtime->options().context_length, 0);
}

TEST_F(RuntimeTest, GreedyMatchesReference) {
  auto session = NewSession(*runtime_);
  Recorder recorder;
  GenerateResult result;
  const Status status = session->Generate(Greedy("ROMEO:", 32), recorder.Callback(), &result);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_THAT(result.tokens, ElementsAreArray(kGreedyIds));
  EXPECT_EQ(result.text, kGreedyText);
  EXPECT_EQ(result.finish_reason, FinishReason::kMaxTokens);
  EXPECT_THAT(recorder.tokens, ElementsAreArray(kGreedyIds));
  EXPECT_EQ(recorder.text, kGreedyText);
  // The prompt with BOS, then the continuation.
  std::vector<int32_t> context = kPromptIds;
  context.insert(context.end(), kGreedyIds.begin(), kGreedyIds.end());
  EXPECT_THAT(session->context_tokens(), ElementsAreArray(context));
}

TEST_F(RuntimeTest, OneShotGenerateMatchesReferenceEveryTime) {
  for (int i = 0; i < 2; ++i) {
    GenerateResult result;
    const Status status = runtime_->Generate(Greedy("ROMEO:", 32), {}, &result);
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_THAT(result.tokens, ElementsAreArray(kGreedyIds));
    EXPECT_EQ(result.text, kGreedyText);
  }
  // The second call shares the prompt with the first: it is taken from the cache.
  EXPECT_EQ(runtime_->Stats().cached_tokens, 2);
  EXPECT_EQ(runtime_->Stats().prefill_tokens, 1);
}

TEST_F(RuntimeTest, StatsAreFilled) {
  auto session = NewSession(*runtime_);
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 32)).ok());
  const GenerationStats stats = session->Stats();
  EXPECT_EQ(stats.prompt_tokens, 3);
  EXPECT_EQ(stats.cached_tokens, 0);
  EXPECT_EQ(stats.prefill_tokens, 3);
  EXPECT_EQ(stats.generated_tokens, 32);
  EXPECT_EQ(stats.context_slides, 0);
  EXPECT_EQ(stats.finish_reason, FinishReason::kMaxTokens);
  EXPECT_GT(stats.prefill_ms, 0);
  EXPECT_GT(stats.decode_ms, 0);
  EXPECT_GT(stats.time_to_first_token_ms, 0);
  EXPECT_GT(stats.prefill_tokens_per_second, 0);
  EXPECT_GT(stats.decode_tokens_per_second, 0);
  EXPECT_GT(stats.peak_rss_bytes, 0);
}

TEST_F(RuntimeTest, ContinuingReusesTheCacheAndMatchesReference) {
  auto session = NewSession(*runtime_);
  GenerateResult first, second;
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 16), {}, &first).ok());
  // An empty prompt continues the text; only the last sampled token is new to the cache.
  ASSERT_TRUE(session->Generate(Greedy("", 16), {}, &second).ok());
  EXPECT_THAT(first.tokens,
              ElementsAreArray(std::vector<int32_t>(kGreedyIds.begin(), kGreedyIds.begin() + 16)));
  EXPECT_THAT(second.tokens,
              ElementsAreArray(std::vector<int32_t>(kGreedyIds.begin() + 16, kGreedyIds.end())));
  EXPECT_EQ(first.text + second.text, kGreedyText);
  const GenerationStats stats = session->Stats();
  EXPECT_EQ(stats.prompt_tokens, 3 + 16);
  EXPECT_EQ(stats.cached_tokens, 3 + 16 - 1);
  EXPECT_EQ(stats.prefill_tokens, 1);
}

TEST_F(RuntimeTest, SecondTurnPrefillsOnlyTheNewTokens) {
  auto file = format::GgufFile::Open(kModelPath);
  ASSERT_TRUE(file.ok());
  auto tokenizer = tokenizer::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tokenizer.ok());
  const std::string turn2 = "\nJULIET:\nO Romeo, Romeo!";
  const size_t new_tokens = tokenizer->Encode(turn2, /*add_special=*/false, true).size();

  auto session = NewSession(*runtime_);
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 8)).ok());
  EXPECT_EQ(session->Stats().prefill_tokens, 3);
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy(turn2, 8), {}, &result).ok());
  const GenerationStats stats = session->Stats();
  // In the cache: the prompt and the first 7 generated tokens; the 8th was sampled
  // but not evaluated yet, so it is prefilled with the new text.
  EXPECT_EQ(stats.cached_tokens, 3 + 7);
  EXPECT_EQ(stats.prefill_tokens, 1 + static_cast<int>(new_tokens));
  EXPECT_EQ(stats.prompt_tokens, 3 + 8 + static_cast<int>(new_tokens));
  EXPECT_EQ(result.tokens.size(), 8u);
  EXPECT_EQ(session->context_tokens().size(), 3 + 8 + new_tokens + 8);
}

TEST_F(RuntimeTest, ChatTurnsReuseTheCache) {
  auto session = NewSession(*runtime_);
  ASSERT_TRUE(session->AddMessage("system", "You are a player.").ok());
  GenerateRequest request = Greedy("", 8);
  ASSERT_TRUE(session->Chat("ROMEO:", request).ok());
  const GenerationStats first = session->Stats();
  EXPECT_EQ(first.cached_tokens, 0);
  EXPECT_EQ(first.prefill_tokens, first.prompt_tokens);
  ASSERT_EQ(session->history().size(), 3u);
  EXPECT_EQ(session->history()[2].role, "assistant");

  ASSERT_TRUE(session->Chat("Speak again.", request).ok());
  const GenerationStats second = session->Stats();
  ASSERT_EQ(session->history().size(), 5u);
  EXPECT_GE(second.cached_tokens, first.prompt_tokens);
  EXPECT_EQ(second.prefill_tokens, second.prompt_tokens - second.cached_tokens);
  EXPECT_LT(second.prefill_tokens, second.prompt_tokens - first.prompt_tokens);
}

TEST_F(RuntimeTest, ChatTemplateOverrideByName) {
  auto session = NewSession(*runtime_);
  GenerateRequest request = Greedy("", 4);
  request.chat_template = "chatml";
  ASSERT_TRUE(session->Chat("Hello", request).ok());
  const int chatml_prompt = session->Stats().prompt_tokens;
  session->Reset();
  request.chat_template = "plain";
  ASSERT_TRUE(session->Chat("Hello", request).ok());
  EXPECT_GT(chatml_prompt, session->Stats().prompt_tokens);
}

TEST_F(RuntimeTest, StopStringIsNotEmitted) {
  auto session = NewSession(*runtime_);
  GenerateRequest request = Greedy("ROMEO:", 32);
  request.stop = {"never appears", "breathen"};
  Recorder recorder;
  GenerateResult result;
  ASSERT_TRUE(session->Generate(request, recorder.Callback(), &result).ok());
  EXPECT_EQ(result.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(result.text, "\nAnd, I'll be a ");
  EXPECT_EQ(recorder.text, result.text);
  EXPECT_THAT(recorder.text, Not(HasSubstr("breath")));
  EXPECT_LT(result.tokens.size(), 32u);
  EXPECT_EQ(session->Stats().finish_reason, FinishReason::kStopString);
}

TEST_F(RuntimeTest, StopStringAcrossTokensAndHeldBackText) {
  auto session = NewSession(*runtime_);
  GenerateRequest request = Greedy("ROMEO:", 32);
  request.stop = {"and,\nThen"};  // spans several tokens
  GenerateResult result;
  ASSERT_TRUE(session->Generate(request, {}, &result).ok());
  EXPECT_EQ(result.text, "\nAnd, I'll be a breathen, ");

  // A stop string whose start appears but never completes is emitted at the end.
  request.stop = {"\nAnd!"};
  Recorder recorder;
  session->Reset();
  ASSERT_TRUE(session->Generate(request, recorder.Callback(), &result).ok());
  EXPECT_EQ(result.finish_reason, FinishReason::kMaxTokens);
  EXPECT_EQ(recorder.text, kGreedyText);
  EXPECT_EQ(recorder.calls, 33);  // one per token, and one (-1) for the held-back "\nAnd"
}

TEST_F(RuntimeTest, MaxTokensIsHonoured) {
  auto session = NewSession(*runtime_);
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 5), {}, &result).ok());
  EXPECT_EQ(result.tokens.size(), 5u);
  EXPECT_EQ(result.finish_reason, FinishReason::kMaxTokens);
  session->Reset();
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 0), {}, &result).ok());
  EXPECT_TRUE(result.tokens.empty());
  EXPECT_EQ(session->Stats().prefill_tokens, 3);
}

TEST_F(RuntimeTest, CallbackReturningFalseCancels) {
  auto session = NewSession(*runtime_);
  int calls = 0;
  GenerateResult result;
  const Status status = session->Generate(
      Greedy("ROMEO:", 32), [&](std::string_view, int32_t) { return ++calls < 5; }, &result);
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  EXPECT_EQ(result.tokens.size(), 5u);
  EXPECT_EQ(result.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(session->Stats().finish_reason, FinishReason::kCancelled);
  // What was generated stays: continuing gives the rest of the reference.
  ASSERT_TRUE(session->Generate(Greedy("", 3), {}, &result).ok());
  EXPECT_THAT(result.tokens, ElementsAreArray(std::vector<int32_t>(kGreedyIds.begin() + 5,
                                                                   kGreedyIds.begin() + 8)));
}

TEST_F(RuntimeTest, CancelFlagStops) {
  auto session = NewSession(*runtime_);
  std::atomic<bool> cancel{false};
  GenerateRequest request = Greedy("ROMEO:", 32);
  request.cancel = &cancel;
  GenerateResult result;
  int calls = 0;
  const Status status = session->Generate(
      request,
      [&](std::string_view, int32_t) {
        if (++calls == 3) cancel = true;
        return true;
      },
      &result);
  EXPECT_EQ(status.code(), StatusCode::kCancelled);
  EXPECT_EQ(result.tokens.size(), 3u);

  // Set before the call: nothing is generated.
  session->Reset();
  const Status again = session->Generate(request, {}, &result);
  EXPECT_EQ(again.code(), StatusCode::kCancelled);
  EXPECT_TRUE(result.tokens.empty());
  ExpectGreedyStillWorks(*runtime_);
}

// A cancel set from another thread during a long request (a prefill of several
// chunks, then up to 200 tokens: the flag always lands while there is work left) stops
// it promptly (2 s past the work done is a hang guard, not a speed claim). Whether it
// landed in the prefill or in the decode, what the session holds is a prefix of the
// uncancelled run: the tokens generated so far are its first ones, and continuing gives
// the next ones.
TEST(RuntimeCancelTest, LongRequestStopsPromptlyAndResumes) {
  RuntimeOptions options = OneThread();
  options.context_length = 2048;
  std::unique_ptr<MoERuntime> runtime = LoadedRuntime(options);
  std::string text;
  for (int i = 0; i < 80; ++i) text += "ROMEO: What light through yonder window breaks?\n";
  constexpr int kMax = 200;
  auto fresh = NewSession(*runtime);
  GenerateResult want;
  ASSERT_TRUE(fresh->Generate(Greedy(text, kMax + 4), {}, &want).ok());
  ASSERT_GT(fresh->Stats().prompt_tokens, 1024);  // more than two prefill chunks
  ASSERT_EQ(want.tokens.size(), static_cast<size_t>(kMax + 4));

  auto session = NewSession(*runtime);
  std::atomic<bool> cancel{false};
  GenerateRequest request = Greedy(text, kMax);
  request.cancel = &cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    cancel = true;
  });
  const auto start = std::chrono::steady_clock::now();
  GenerateResult result;
  const Status status = session->Generate(request, {}, &result);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  canceller.join();
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  EXPECT_EQ(result.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(result.tokens.size(), static_cast<size_t>(kMax));
  EXPECT_LT(seconds, 2.0 + fresh->Stats().prefill_ms / 1000 + fresh->Stats().decode_ms / 1000);
  const size_t k = result.tokens.size();
  EXPECT_EQ(result.tokens, std::vector<int32_t>(want.tokens.begin(), want.tokens.begin() + k));

  GenerateResult resumed;
  ASSERT_TRUE(session->Generate(Greedy("", 4), {}, &resumed).ok());
  EXPECT_EQ(resumed.tokens,
            std::vector<int32_t>(want.tokens.begin() + k, want.tokens.begin() + k + 4));
}

// LoadModel's progress callback may return false: the load stops, Cancelled, and the
// model loaded before stays; a callback returning void never cancels.
TEST(RuntimeCancelTest, ProgressCallbackCancelsLoadModel) {
  std::unique_ptr<MoERuntime> runtime = LoadedRuntime();
  const std::string q8 = kSharedDir + "/models/tiny-moe-shakespeare-q8_0.gguf";
  int calls = 0;
  Status status = runtime->LoadModel(q8, [&](float fraction) { return ++calls < 3 && fraction < 1; });
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("cancelled"));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(runtime->model_info().path, kModelPath);
  ExpectGreedyStillWorks(*runtime);
  float last = 0;
  ASSERT_TRUE(runtime->LoadModel(q8, [&](float fraction) { last = fraction; }).ok());
  EXPECT_EQ(last, 1.0f);
  EXPECT_EQ(runtime->model_info().path, q8);

  moert_runtime* rt = nullptr;
  ASSERT_EQ(moert_runtime_create(nullptr, &rt), MOERT_OK);
  EXPECT_EQ(moert_runtime_load_model_cancellable(
                rt, kModelPath.c_str(), [](float, void*) { return 1; }, nullptr),
            MOERT_CANCELLED);
  EXPECT_THAT(moert_last_error(rt), HasSubstr("cancelled"));
  EXPECT_EQ(moert_runtime_load_model_cancellable(
                rt, kModelPath.c_str(), [](float, void*) { return 0; }, nullptr),
            MOERT_OK);
  moert_runtime_destroy(rt);
}

TEST_F(RuntimeTest, ResetForgetsEverything) {
  auto session = NewSession(*runtime_);
  ASSERT_TRUE(session->Chat("Hello", Greedy("", 4)).ok());
  session->Reset();
  EXPECT_TRUE(session->history().empty());
  EXPECT_TRUE(session->context_tokens().empty());
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 32), {}, &result).ok());
  EXPECT_THAT(result.tokens, ElementsAreArray(kGreedyIds));
  EXPECT_EQ(session->Stats().cached_tokens, 0);
}

TEST_F(RuntimeTest, SeededSamplingIsReproducible) {
  GenerateRequest request = Greedy("ROMEO:", 16);
  request.temperature = 0.9f;
  request.seed = 1234;
  GenerateResult a, b;
  ASSERT_TRUE(runtime_->Generate(request, {}, &a).ok());
  ASSERT_TRUE(runtime_->Generate(request, {}, &b).ok());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
}

TEST_F(RuntimeTest, SessionsOnTwoThreads) {
  auto a = NewSession(*runtime_);
  auto b = NewSession(*runtime_);
  GenerateResult result_a, result_b;
  Status status_a, status_b;
  std::thread thread([&] { status_a = a->Generate(Greedy("ROMEO:", 32), {}, &result_a); });
  status_b = b->Generate(Greedy("ROMEO:", 32), {}, &result_b);
  thread.join();
  ASSERT_TRUE(status_a.ok()) << status_a.ToString();
  ASSERT_TRUE(status_b.ok()) << status_b.ToString();
  EXPECT_THAT(result_a.tokens, ElementsAreArray(kGreedyIds));
  EXPECT_THAT(result_b.tokens, ElementsAreArray(kGreedyIds));
}

TEST_F(RuntimeTest, BadRequestsFailAndLeaveTheSessionAsItWas) {
  auto session = NewSession(*runtime_);
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 4)).ok());
  const std::vector<int32_t> context = session->context_tokens();

  struct Case {
    const char* name;
    GenerateRequest request;
    StatusCode code;
    const char* message;
  };
  std::vector<Case> cases;
  GenerateRequest r = Greedy("x", 4);
  r.temperature = -1;
  cases.push_back({"negative temperature", r, StatusCode::kInvalidArgument, "temperature"});
  r = Greedy("x", 4);
  r.top_p = 0;
  cases.push_back({"top_p 0", r, StatusCode::kInvalidArgument, "top_p"});
  r = Greedy("x", 4);
  r.top_p = 1.5f;
  cases.push_back({"top_p 1.5", r, StatusCode::kInvalidArgument, "top_p"});
  r = Greedy("x", 4);
  r.min_p = 2;
  cases.push_back({"min_p 2", r, StatusCode::kInvalidArgument, "min_p"});
  r = Greedy("x", 4);
  r.repeat_penalty = 0;
  cases.push_back({"repeat_penalty 0", r, StatusCode::kInvalidArgument, "repeat_penalty"});
  r = Greedy("x", 4);
  r.chat_template = "jinja-of-my-own";
  cases.push_back({"unknown template", r, StatusCode::kInvalidArgument, "jinja-of-my-own"});
  r = Greedy("x", 4);
  r.messages = {{"user", "hi"}};
  cases.push_back({"prompt and messages", r, StatusCode::kInvalidArgument, "not both"});
  r = Greedy("", 4);
  r.messages = {{"narrator", "hi"}};
  cases.push_back({"unknown role", r, StatusCode::kInvalidArgument, "narrator"});
  r = Greedy("x", 4);
  r.stop = {""};
  cases.push_back({"empty stop string", r, StatusCode::kInvalidArgument, "stop string 0"});

  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GenerateResult result;
    const Status status = session->Generate(c.request, {}, &result);
    EXPECT_EQ(status.code(), c.code) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_EQ(result.finish_reason, FinishReason::kNone);
    EXPECT_TRUE(result.tokens.empty());
    EXPECT_EQ(session->context_tokens(), context);
    EXPECT_EQ(runtime_->Generate(c.request).code(), c.code);
    ExpectGreedyStillWorks(*runtime_);
  }
  // The session itself still continues the reference.
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy("", 4), {}, &result).ok());
  EXPECT_THAT(result.tokens, ElementsAreArray(std::vector<int32_t>(kGreedyIds.begin() + 4,
                                                                   kGreedyIds.begin() + 8)));
}

TEST_F(RuntimeTest, AddMessageRejectsUnknownRole) {
  auto session = NewSession(*runtime_);
  const Status status = session->AddMessage("narrator", "Once upon a time");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("narrator"));
  EXPECT_TRUE(session->history().empty());
}

TEST(RuntimeErrorsTest, BadOptions) {
  std::unique_ptr<MoERuntime> runtime;
  RuntimeOptions options;
  options.threads = -1;
  EXPECT_EQ(MoERuntime::Create(options, &runtime).code(), StatusCode::kInvalidArgument);
  for (int poll : {-2, 101}) {
    options = {};
    options.poll = poll;
    const Status bad_poll = MoERuntime::Create(options, &runtime);
    EXPECT_EQ(bad_poll.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(bad_poll.message(), HasSubstr("poll"));
  }
  options = {};
  options.context_length = -5;
  const Status status = MoERuntime::Create(options, &runtime);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("context_length"));
  EXPECT_EQ(runtime, nullptr);
}

TEST(RuntimeErrorsTest, GenerateBeforeLoad) {
  auto runtime = NewRuntime();
  EXPECT_FALSE(runtime->model_loaded());
  Status status = runtime->Generate(Greedy("ROMEO:", 4));
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("LoadModel"));
  std::unique_ptr<Session> session;
  status = runtime->CreateSession(&session);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(session, nullptr);
  ASSERT_TRUE(runtime->LoadModel(kModelPath).ok());
  ExpectGreedyStillWorks(*runtime);
}

TEST(RuntimeErrorsTest, LoadErrorsNameTheFileAndKeepTheLoadedModel) {
  auto runtime = NewRuntime();
  const std::string missing = kSharedDir + "/models/no-such-model.gguf";
  Status status = runtime->LoadModel(missing);
  EXPECT_EQ(status.code(), StatusCode::kNotFound) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr(missing));
  EXPECT_FALSE(runtime->model_loaded());

  ASSERT_TRUE(runtime->LoadModel(kModelPath).ok());

  status = runtime->LoadModel(kVocabOnlyPath);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(kVocabOnlyPath));
  EXPECT_THAT(status.message(), HasSubstr("is not an LLM: it has no tensors"));
  ExpectGreedyStillWorks(*runtime);

  const std::string not_gguf = std::string(MOERT_SOURCE_DIR) + "/LICENSE";
  status = runtime->LoadModel(not_gguf);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(not_gguf));
  ExpectGreedyStillWorks(*runtime);
  EXPECT_EQ(runtime->model_info().path, kModelPath);
}

TEST(RuntimeErrorsTest, UnsupportedArchitecture) {
  format::GgufWriter writer;
  writer.SetString("general.architecture", "mamba");
  const std::vector<float> weights(4, 0.5f);
  ASSERT_TRUE(writer
                  .AddTensor("token_embd.weight", format::GgmlType::kF32, {2, 2},
                             {reinterpret_cast<const uint8_t*>(weights.data()),
                              weights.size() * sizeof(float)})
                  .ok());
  const std::string path = ::testing::TempDir() + "/runtime_test_mamba.gguf";
  ASSERT_TRUE(writer.WriteFile(path).ok());

  auto runtime = NewRuntime();
  const Status status = runtime->LoadModel(path);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_THAT(status.message(), HasSubstr("unsupported architecture 'mamba'"));
  EXPECT_FALSE(runtime->model_loaded());
  std::remove(path.c_str());
}

TEST(RuntimeErrorsTest, PromptLongerThanContext) {
  RuntimeOptions options = OneThread();
  options.context_length = 16;
  auto runtime = LoadedRuntime(options);
  EXPECT_EQ(runtime->model_info().context_length, 16);
  std::string long_prompt;
  for (int i = 0; i < 10; ++i) long_prompt += "ROMEO: What say you? ";
  GenerateResult result;
  Status status = runtime->Generate(Greedy(long_prompt, 4), {}, &result);
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("context holds 16"));
  ExpectGreedyStillWorks(*runtime);

  auto session = NewSession(*runtime);
  status = session->Generate(Greedy(long_prompt, 4));
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(session->context_tokens().empty());
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 4), {}, &result).ok());
  EXPECT_THAT(result.tokens,
              ElementsAreArray(std::vector<int32_t>(kGreedyIds.begin(), kGreedyIds.begin() + 4)));

  // Slide: the tail of the prompt is kept.
  GenerateRequest slide = Greedy(long_prompt, 4);
  slide.context_policy = ContextPolicy::kSlide;
  ASSERT_TRUE(runtime->Generate(slide, {}, &result).ok());
  EXPECT_EQ(result.tokens.size(), 4u);
  EXPECT_LE(runtime->Stats().prompt_tokens, 16 - 4);
}

TEST(RuntimeErrorsTest, FullContextStopsOrSlides) {
  RuntimeOptions options = OneThread();
  options.context_length = 32;
  auto runtime = LoadedRuntime(options);
  auto session = NewSession(*runtime);
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 100), {}, &result).ok());
  EXPECT_EQ(result.finish_reason, FinishReason::kContextFull);
  // 3 prompt tokens + 29 evaluated generated tokens fill 32; the 30th is sampled last.
  EXPECT_EQ(result.tokens.size(), 30u);
  EXPECT_THAT(std::vector<int32_t>(result.tokens.begin(), result.tokens.begin() + 30),
              ElementsAreArray(std::vector<int32_t>(kGreedyIds.begin(), kGreedyIds.begin() + 30)));
  // The next turn does not fit any more.
  EXPECT_EQ(session->Generate(Greedy("more", 4)).code(), StatusCode::kOutOfRange);

  GenerateRequest slide = Greedy("ROMEO:", 100);
  slide.context_policy = ContextPolicy::kSlide;
  session->Reset();
  ASSERT_TRUE(session->Generate(slide, {}, &result).ok());
  EXPECT_EQ(result.tokens.size(), 100u);
  EXPECT_EQ(result.finish_reason, FinishReason::kMaxTokens);
  EXPECT_GT(session->Stats().context_slides, 0);
  EXPECT_LE(session->context_tokens().size(), 32u + 1);
}

TEST(RuntimeErrorsTest, ChatSlideDropsOldestTurns) {
  RuntimeOptions options = OneThread();
  options.context_length = 64;
  auto runtime = LoadedRuntime(options);
  auto session = NewSession(*runtime);
  ASSERT_TRUE(session->AddMessage("system", "Be brief.").ok());
  GenerateRequest request = Greedy("", 8);
  request.context_policy = ContextPolicy::kSlide;
  for (int turn = 0; turn < 6; ++turn) {
    const Status status = session->Chat("Tell me of Romeo and Juliet.", request);
    ASSERT_TRUE(status.ok()) << "turn " << turn << ": " << status.ToString();
  }
  ASSERT_FALSE(session->history().empty());
  EXPECT_EQ(session->history()[0].role, "system");
  EXPECT_LT(session->history().size(), 1u + 2 * 6);
  EXPECT_EQ(session->history().back().role, "assistant");
}

TEST(RuntimeErrorsTest, ProgressEndsAtOne) {
  auto runtime = NewRuntime();
  std::vector<float> seen;
  ASSERT_TRUE(runtime->LoadModel(kModelPath, [&](float f) { seen.push_back(f); }).ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), 1.0f);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_LE(seen[i - 1], seen[i]);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1.0f), 1);
}

TEST(RuntimeErrorsTest, SessionOutlivesRuntimeAndReload) {
  auto runtime = LoadedRuntime(RuntimeOptions());
  auto session = NewSession(*runtime);
  ASSERT_TRUE(runtime->LoadModel(kModelPath).ok());  // a reload
  runtime.reset();
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy("ROMEO:", 32), {}, &result).ok());
  EXPECT_THAT(result.tokens, ElementsAreArray(kGreedyIds));
}

TEST(StatusTest, Basics) {
  EXPECT_TRUE(Status().ok());
  EXPECT_EQ(Status().ToString(), "OK");
  const Status s(StatusCode::kOutOfRange, "too long");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "OUT_OF_RANGE: too long");
  EXPECT_EQ(Status(StatusCode::kOk, "ignored").message(), "");
  EXPECT_STREQ(FinishReasonName(FinishReason::kStopString), "stop_string");
}

}  // namespace
}  // namespace moert
