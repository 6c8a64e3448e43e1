// Repro bundles of a session: one written on request holds the context's tokens, the
// router logits of the first decoded token (whose top-k is the routing the model chose),
// the first layers' KV cache (the bits a fresh run of the same tokens gives), the pool's
// state and the options; a failed request and a degraded one write theirs when asked
// to, and not otherwise; the cap leaves the KV cache out and says so.
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/greedy_request.h"
#include "format/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "moert/runtime.h"
#include "telemetry/crash_repro.h"
#include "telemetry/platform.h"
#include "telemetry/repro_bundle.h"

namespace moert {
namespace {

using ::testing::HasSubstr;
using test_util::Greedy;

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";
const std::string kQ8 = kModels + "tiny-moe-shakespeare-q8_0.gguf";

class ReproTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("moert-repro-test-" + std::string(::testing::UnitTest::GetInstance()
                                                  ->current_test_info()
                                                  ->name()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<MoERuntime> Runtime(RuntimeOptions options) {
    options.threads = 1;
    options.hot_set = false;
    options.cache_dir = (dir_ / "cache").string();
    std::unique_ptr<MoERuntime> runtime;
    EXPECT_TRUE(MoERuntime::Create(options, &runtime).ok());
    const Status loaded = runtime->LoadModel(kQ8);
    EXPECT_TRUE(loaded.ok()) << loaded.ToString();
    return runtime;
  }

  std::vector<std::filesystem::path> Bundles(const std::filesystem::path& dir) const {
    std::vector<std::filesystem::path> out;
    if (!std::filesystem::exists(dir)) return out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path());
    return out;
  }

  std::filesystem::path dir_;
};

TEST_F(ReproTest, OnRequestTheBundleHoldsTheSessionsState) {
  RuntimeOptions options;
  options.expert_pool_fraction = 0.5;
  auto runtime = Runtime(options);
  std::unique_ptr<Session> session;
  ASSERT_TRUE(runtime->CreateSession(&session).ok());
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy(8), {}, &result).ok());
  EXPECT_TRUE(result.repro_path.empty());  // nothing asked for it
  std::string written;
  const Status status = session->WriteRepro("", &written);
  ASSERT_TRUE(status.ok()) << status.ToString();
  // Under CACHE_DIR/repro by default.
  EXPECT_EQ(std::filesystem::path(written).parent_path(), dir_ / "cache" / "repro");
  absl::StatusOr<telemetry::ReproBundle> b = telemetry::ReadReproBundle(written);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->trigger, "request");
  EXPECT_TRUE(b->error.empty());
  EXPECT_EQ(b->tokens, session->context_tokens());
  EXPECT_EQ(telemetry::ReproValue(b->model, "path"), kQ8);
  EXPECT_THAT(telemetry::ReproValue(b->model, "hash"), ::testing::StartsWith("fnv1a64:"));
  EXPECT_EQ(telemetry::ReproValue(b->model, "architecture"), "llama");
  EXPECT_EQ(telemetry::ReproValue(b->options, "expert_pool_fraction"), "0.5");
  EXPECT_EQ(telemetry::ReproValue(b->options, "backend"), "cpu");
  EXPECT_EQ(telemetry::ReproValue(b->fingerprint, "cores"),
            std::to_string(std::thread::hardware_concurrency()));
  EXPECT_FALSE(telemetry::ReproValue(b->fingerprint, "mem_total").empty());
  // Every layer routed the first decoded token: 4 layers of 8 experts.
  EXPECT_EQ(b->router_logits.width, 8);
  EXPECT_EQ(b->router_logits.layers, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float f : b->router_logits.logits) EXPECT_TRUE(std::isfinite(f));
  // The pool: 4 layers' residency and blocks.
  EXPECT_FALSE(telemetry::ReproValue(b->pool, "pool_bytes").empty());
  EXPECT_FALSE(telemetry::ReproValue(b->pool, "layer3_resident").empty());
  EXPECT_THAT(telemetry::ReproValue(b->pool, "layer0_blocks"), HasSubstr("@"));
  // The KV cache of the first two layers over the evaluated positions.
  EXPECT_EQ(b->kv.layers, 2);
  EXPECT_GT(b->kv.positions, 0);
  EXPECT_TRUE(b->dropped.empty());
  // The same file name is never handed out twice.
  std::string again;
  ASSERT_TRUE(session->WriteRepro("", &again).ok());
  EXPECT_NE(again, written);
}

// The numerics: the bundle's router logits choose the experts the model routed to, and
// its KV cache is the one a fresh run of its tokens computes.
TEST_F(ReproTest, RouterLogitsAndKvMatchTheModel) {
  auto runtime = Runtime({});
  std::unique_ptr<Session> session;
  ASSERT_TRUE(runtime->CreateSession(&session).ok());
  ASSERT_TRUE(session->Generate(Greedy(4)).ok());
  const std::string path = (dir_ / "x.moert-repro").string();
  ASSERT_TRUE(session->WriteRepro(path).ok());
  absl::StatusOr<telemetry::ReproBundle> b = telemetry::ReadReproBundle(path);
  ASSERT_TRUE(b.ok()) << b.status();

  // The model again, with a routing observer, over the same tokens: the prompt as one
  // batch, then the first generated token alone (the first decoded token).
  auto file = format::GgufFile::Open(kQ8);
  ASSERT_TRUE(file.ok());
  std::vector<std::vector<int>> chosen;
  model::ModelLoadOptions load;
  load.route_observer = [&](int layer, int64_t n, int slots, const int* experts, const float*) {
    if (n != 1) return;
    if (chosen.size() <= static_cast<size_t>(layer)) chosen.resize(static_cast<size_t>(layer) + 1);
    chosen[static_cast<size_t>(layer)].assign(experts, experts + slots);
  };
  auto model = model::Model::Load(**file, load);
  ASSERT_TRUE(model.ok()) << model.status();
  auto cache = (*model)->NewKvCache(64);
  ASSERT_TRUE(cache.ok());
  const size_t prompt = session->context_tokens().size() - 4 + 1;  // 4 generated, last not evaluated
  const std::vector<int32_t>& tokens = b->tokens;
  ASSERT_GE(tokens.size(), prompt + 1);
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward(std::span(tokens).subspan(0, prompt - 1), cache->get(),
                                model::LogitsFor::kLast, &logits).ok());
  ASSERT_TRUE((*model)->Forward(std::span(tokens).subspan(prompt - 1, 1), cache->get(),
                                model::LogitsFor::kLast, &logits).ok());
  ASSERT_EQ(chosen.size(), 4u);
  const int width = b->router_logits.width;
  for (size_t row = 0; row < b->router_logits.layers.size(); ++row) {
    const float* l = b->router_logits.logits.data() + row * static_cast<size_t>(width);
    std::vector<int> order(static_cast<size_t>(width));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return l[x] > l[y]; });
    std::vector<int> top(order.begin(), order.begin() + 2);
    std::vector<int> routed = chosen[static_cast<size_t>(b->router_logits.layers[row])];
    std::sort(top.begin(), top.end());
    std::sort(routed.begin(), routed.end());
    EXPECT_EQ(top, routed) << "layer " << b->router_logits.layers[row];
  }
  // Evaluate the rest and compare the first layers' keys and values, bit for bit.
  const int evaluated = b->kv.positions;
  ASSERT_LE(static_cast<size_t>(evaluated), tokens.size());
  ASSERT_TRUE((*model)->Forward(std::span(tokens).subspan(prompt, static_cast<size_t>(evaluated) - prompt),
                                cache->get(), model::LogitsFor::kLast, &logits).ok());
  for (int layer = 0; layer < b->kv.layers; ++layer) {
    std::vector<float> keys, values;
    int64_t kw = 0, vw = 0;
    ASSERT_TRUE((*cache)->ReadF32(layer, evaluated, &keys, &values, &kw, &vw).ok());
    ASSERT_EQ(kw, b->kv.key_width);
    ASSERT_EQ(vw, b->kv.value_width);
    const size_t kn = keys.size(), vn = values.size();
    EXPECT_TRUE(std::equal(keys.begin(), keys.end(), b->kv.keys.begin() + static_cast<std::ptrdiff_t>(layer * kn)))
        << "layer " << layer;
    EXPECT_TRUE(std::equal(values.begin(), values.end(),
                           b->kv.values.begin() + static_cast<std::ptrdiff_t>(layer * vn)))
        << "layer " << layer;
  }
}

TEST_F(ReproTest, AFailedRequestWritesOneWhenAsked) {
  for (bool on : {false, true}) {
    RuntimeOptions options;
    options.repro_on_error = on;
    options.repro_dir = (dir_ / "errors").string();
    options.context_length = 16;
    auto runtime = Runtime(options);
    std::unique_ptr<Session> session;
    ASSERT_TRUE(runtime->CreateSession(&session).ok());
    GenerateRequest request = Greedy(4);
    request.prompt = std::string(400, 'a');  // past the 16 positions
    GenerateResult result;
    const Status status = session->Generate(request, {}, &result);
    ASSERT_EQ(status.code(), StatusCode::kOutOfRange);
    if (!on) {
      EXPECT_TRUE(result.repro_path.empty());
      EXPECT_TRUE(Bundles(dir_ / "errors").empty());
      continue;
    }
    ASSERT_FALSE(result.repro_path.empty());
    EXPECT_EQ(std::filesystem::path(result.repro_path).parent_path(), dir_ / "errors");
    EXPECT_THAT(result.repro_path, HasSubstr("-error.moert-repro"));
    absl::StatusOr<telemetry::ReproBundle> b = telemetry::ReadReproBundle(result.repro_path);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->trigger, "error");
    EXPECT_THAT(b->error, HasSubstr("OUT_OF_RANGE"));
    EXPECT_THAT(b->error, HasSubstr(status.message()));
    // The session stays usable.
    ASSERT_TRUE(session->Generate(Greedy(4), {}, &result).ok());
    EXPECT_TRUE(result.repro_path.empty());
  }
}

uint64_t FrozenClock() { return 1'000'000'000; }

TEST_F(ReproTest, ADegradedRequestWritesOneWhenAsked) {
  telemetry::SetClock(FrozenClock);
  RuntimeOptions options;
  options.degrade_policy = true;
  options.thermal_limit_c = 50;
  options.repro_on_degrade = true;
  auto runtime = Runtime(options);
  runtime->SetTemperature(80);
  GenerateResult result;
  ASSERT_TRUE(runtime->Generate(Greedy(8), {}, &result).ok());
  telemetry::SetClock(nullptr);
  ASSERT_TRUE(result.degraded);
  ASSERT_FALSE(result.repro_path.empty());
  EXPECT_EQ(std::filesystem::path(result.repro_path).parent_path(), dir_ / "cache" / "repro");
  absl::StatusOr<telemetry::ReproBundle> b = telemetry::ReadReproBundle(result.repro_path);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->trigger, "degrade");
  EXPECT_EQ(b->error, result.degrade_reason);
  EXPECT_THAT(b->error, HasSubstr("thermal: reduce_top_k"));
  EXPECT_EQ(telemetry::ReproValue(b->options, "thermal_limit_c"), "50");
}

TEST_F(ReproTest, TheCapLeavesTheKvCacheOut) {
  RuntimeOptions options;
  options.repro_max_bytes = 24 << 10;  // 2 layers of KV at 40 positions do not fit
  auto runtime = Runtime(options);
  std::unique_ptr<Session> session;
  ASSERT_TRUE(runtime->CreateSession(&session).ok());
  ASSERT_TRUE(session->Generate(Greedy(32)).ok());
  const std::string path = (dir_ / "capped.moert-repro").string();
  ASSERT_TRUE(session->WriteRepro(path).ok());
  EXPECT_LE(std::filesystem::file_size(path), uint64_t{24} << 10);
  absl::StatusOr<telemetry::ReproBundle> b = telemetry::ReadReproBundle(path);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dropped, std::vector<std::string>{"kv"});
  EXPECT_EQ(b->kv.layers, 0);
  EXPECT_EQ(b->tokens, session->context_tokens());
  EXPECT_EQ(b->router_logits.layers.size(), 4u);
}

TEST_F(ReproTest, BadPathsAndOptionsAreNamed) {
  RuntimeOptions options;
  options.repro_max_bytes = -1;
  std::unique_ptr<MoERuntime> runtime;
  const Status bad = MoERuntime::Create(options, &runtime);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("repro_max_bytes"));

  runtime = Runtime({});
  std::unique_ptr<Session> session;
  ASSERT_TRUE(runtime->CreateSession(&session).ok());
  const Status unwritable = session->WriteRepro("/proc/no/such/dir/x.moert-repro");
  EXPECT_FALSE(unwritable.ok());
  EXPECT_THAT(unwritable.message(), HasSubstr("/proc/no/such/dir"));
  // Still usable.
  EXPECT_TRUE(session->Generate(Greedy(2)).ok());
}


// The crash variant (telemetry/crash_repro.h): what the handler writes reads back as a
// bundle of trigger "crash", and any truncation of it is an error, not a crash.
TEST(CrashReproTest, ThePublishedRecordReadsBackAndTruncationsAreErrors) {
  const std::vector<int32_t> tokens = {5, -1, 7, 1000};
  telemetry::PublishCrashRecord("cpu=test", "path=m.gguf\nhash=fnv1a64:00", "threads=1", tokens);
  const std::string bytes = telemetry::CrashBundleBytesForTest(SIGSEGV);
  absl::StatusOr<telemetry::ReproBundle> b = telemetry::DecodeReproBundle(bytes);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->trigger, "crash");
  EXPECT_EQ(b->error, "signal " + std::to_string(SIGSEGV) + " (SIGSEGV)");
  EXPECT_EQ(b->fingerprint, "cpu=test");
  EXPECT_EQ(telemetry::ReproValue(b->model, "hash"), "fnv1a64:00");
  EXPECT_EQ(b->options, "threads=1");
  EXPECT_EQ(b->tokens, tokens);
  EXPECT_GT(b->created_ns, 0u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(telemetry::DecodeReproBundle(std::string_view(bytes).substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(telemetry::DecodeReproBundle(bytes + "x").ok());
}

// A process that aborts while a session generates leaves DIR/crash-<pid>.moert-repro with
// the session's context, and still dies of its signal.
TEST_F(ReproTest, ACrashWritesTheCrashVariantAndTheProcessStillDies) {
#if defined(MOERT_TEST_UNDER_EMULATOR)
  GTEST_SKIP() << "a death test re-executes the binary, which qemu-user cannot";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::filesystem::path dir = dir_ / "crashes";
  EXPECT_EXIT(
      {
        RuntimeOptions options;
        options.repro_on_crash = true;
        options.repro_dir = dir.string();
        auto runtime = Runtime(options);
        std::unique_ptr<Session> session;
        if (!runtime->CreateSession(&session).ok()) std::_Exit(3);
        GenerateResult result;
        if (!session->Generate(Greedy(4), {}, &result).ok()) std::_Exit(4);
        std::abort();
      },
      ::testing::KilledBySignal(SIGABRT), "");
  const std::vector<std::filesystem::path> files = Bundles(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_THAT(files[0].filename().string(), ::testing::StartsWith("crash-"));
  absl::StatusOr<telemetry::ReproBundle> b = telemetry::ReadReproBundle(files[0].string());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->trigger, "crash");
  EXPECT_THAT(b->error, HasSubstr("SIGABRT"));
  EXPECT_THAT(b->model, HasSubstr("hash="));
  EXPECT_THAT(b->options, HasSubstr("threads=1"));
  // The context of the last step: the prompt and the tokens decoded before it.
  EXPECT_GE(b->tokens.size(), 4u);
}

}  // namespace
}  // namespace moert
