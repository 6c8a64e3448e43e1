// Degrading instead of failing: InferenceGuard retries a step that fails with each
// injected reason (exhaustion, an I/O error, a timeout, a lost device) degraded, says so
// in the result, and leaves the session usable; each degrade action takes effect on a
// real model without a reload; the policy's rules fire in a running session; a request
// that succeeds first time is bit for bit the same with the guard on; bad rule files are
// named.
#include <deque>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/fake_backend.h"
#include "common/greedy_request.h"
#include "common/greedy_run.h"
#include "format/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "moert/runtime.h"
#include "pipeline/degrade_policy.h"
#include "runtime/degrade_actions.h"
#include "runtime/internal.h"
#include "telemetry/metrics.h"
#include "telemetry/platform.h"
#include "telemetry/runtime_metrics.h"
#include "tokenizer/tokenizer.h"

namespace moert {
namespace {

using pipeline::DegradeAction;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";
const std::string kF32 = kModels + "tiny-moe-shakespeare-f32.gguf";
const std::string kQ8 = kModels + "tiny-moe-shakespeare-q8_0.gguf";

// REFERENCE.md: the greedy continuation of "ROMEO:".
const std::vector<int32_t> kGreedyIds = {13, 2010, 270, 1999, 275, 2014, 277, 309};

using test_util::Greedy;

// The registry the test models publish to and their LoadedModels read (as a runtime
// shares one between its model and sessions).
std::shared_ptr<telemetry::Registry> TestRegistry() {
  static const auto registry = std::make_shared<telemetry::Registry>();
  return registry;
}

std::unique_ptr<model::Model> LoadModel(const std::string& path,
                                        model::ModelLoadOptions options = {}) {
  auto file = format::GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  options.kv_cache_positions = 64;
  if (options.metrics == nullptr) options.metrics = TestRegistry();
  auto model = model::Model::Load(**file, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// A model whose Forward fails as told (one injected Status per call, OK: run), with a
// pretend device (given up by UseCpuBackend) and a pretend pool to defragment.
class FaultModel final : public model::Model {
 public:
  explicit FaultModel(std::unique_ptr<model::Model> inner) : inner_(std::move(inner)) {}

  const format::ModelSpec& spec() const override { return inner_->spec(); }
  absl::StatusOr<std::unique_ptr<model::KvCache>> NewKvCache(int n_ctx) const override {
    return inner_->NewKvCache(n_ctx);
  }
  using model::Model::Forward;
  absl::Status Forward(const model::ForwardInput& input, model::KvCache* cache,
                       model::LogitsFor which, std::vector<float>* logits) override {
    ++forward_calls;
    if (!failures.empty()) {
      const absl::Status s = failures.front();
      failures.pop_front();
      if (!s.ok()) return s;
    }
    return inner_->Forward(input, cache, which, logits);
  }
  model::MemoryStats memory_stats() const override { return inner_->memory_stats(); }
  model::BackendStats backend_stats() const override {
    model::BackendStats stats = inner_->backend_stats();
    if (on_device) stats.backend = "Fake";
    return stats;
  }
  router::Router* router() override { return inner_->router(); }
  router::ResourceMonitor* resource_monitor() override { return inner_->resource_monitor(); }
  absl::Status Defragment() override {
    ++defragments;
    return absl::OkStatus();
  }
  absl::Status UseCpuBackend(std::string_view why) override {
    if (!on_device) return model::Model::UseCpuBackend(why);
    on_device = false;
    return absl::OkStatus();
  }
  bool has_dense_fallback() const override { return fake_dense_fallback; }
  absl::Status SetDenseFallback(bool on) override {
    if (!fake_dense_fallback) return model::Model::SetDenseFallback(on);
    dense_fallback_on = on;
    ++dense_fallback_switches;
    return absl::OkStatus();
  }

  std::deque<absl::Status> failures;  // for the next Forward calls, in order
  int forward_calls = 0;
  int defragments = 0;
  bool on_device = false;
  bool fake_dense_fallback = false;  // pretend to have one: SetDenseFallback records
  bool dense_fallback_on = false;
  int dense_fallback_switches = 0;

 private:
  std::unique_ptr<model::Model> inner_;
};

// A LoadedModel over `model` with the f32 model's tokenizer.
std::shared_ptr<runtime::LoadedModel> Loaded(std::unique_ptr<model::Model> model, bool guard = true,
                                             bool rules = false,
                                             pipeline::DegradePolicyOptions degrade = {}) {
  auto file = format::GgufFile::Open(kF32);
  EXPECT_TRUE(file.ok()) << file.status();
  auto tokenizer = tokenizer::Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto loaded = std::make_shared<runtime::LoadedModel>(std::move(model), std::move(*tokenizer),
                                                       TestRegistry());
  loaded->inference_guard = guard;
  loaded->degrade_rules = rules;
  loaded->degrade = std::move(degrade);
  return loaded;
}

std::unique_ptr<Session::Impl> NewSession(const std::shared_ptr<runtime::LoadedModel>& loaded) {
  auto cache = loaded->model->NewKvCache(64);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::make_unique<Session::Impl>(loaded, loaded->model, std::move(*cache),
                                         /*stateless=*/true);
}

struct InjectionCase {
  const char* name;
  absl::Status failure;
  bool on_device;
  const char* degrade;  // what the result must say
  bool lasts;           // the degrade stays in force for the next request
  bool same_tokens;     // the action does not change the output
};

class GuardInjectionTest : public ::testing::TestWithParam<InjectionCase> {};

TEST_P(GuardInjectionTest, TheStepIsRetriedDegradedAndTheSessionStaysUsable) {
  const InjectionCase& c = GetParam();
  auto fault = std::make_unique<FaultModel>(LoadModel(kF32));
  FaultModel* model = fault.get();
  model->on_device = c.on_device;
  auto loaded = Loaded(std::move(fault));
  auto session = NewSession(loaded);
  // The prefill runs; the first decode step fails once.
  model->failures = {absl::OkStatus(), c.failure};
  GenerateResult result;
  Status status = session->Generate(Greedy(8), {}, &result);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(result.tokens.size(), 8u);
  if (c.same_tokens) {
    EXPECT_EQ(result.tokens, kGreedyIds);
  }
  EXPECT_TRUE(result.degraded);
  EXPECT_THAT(result.degrade_reason, HasSubstr(c.degrade));
  EXPECT_THAT(result.degrade_reason, HasSubstr(std::string(c.failure.message())));
  EXPECT_TRUE(session->stats().degraded);
  EXPECT_EQ(session->stats().degrade_reason, result.degrade_reason);

  // The next request runs without a failure.
  status = session->Generate(Greedy(8), {}, &result);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(result.tokens.size(), 8u);
  EXPECT_EQ(result.degraded, c.lasts);
  if (c.lasts) {
    EXPECT_THAT(result.degrade_reason, HasSubstr("in force: "));
  } else {
    EXPECT_EQ(result.tokens, kGreedyIds);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EachReason, GuardInjectionTest,
    ::testing::Values(InjectionCase{"exhausted",
                                    absl::ResourceExhaustedError("injected: the pool is full"),
                                    false, "exhausted: defragment", false, true},
                      InjectionCase{"io_error", absl::DataLossError("injected: a short read"),
                                    false, "io_error: reduce_top_k", true, false},
                      InjectionCase{"io_unavailable", absl::UnavailableError("injected: EIO"),
                                    false, "io_error: reduce_top_k", true, false},
                      InjectionCase{"timeout", absl::DeadlineExceededError("injected: too slow"),
                                    false, "timeout: reduce_top_k", true, false},
                      InjectionCase{"device_lost",
                                    absl::UnavailableError("injected: CL_DEVICE_NOT_AVAILABLE"),
                                    true, "device_lost: cpu_backend", true, true}),
    [](const ::testing::TestParamInfo<InjectionCase>& test) { return test.param.name; });

TEST(InferenceGuardTest, ReduceTopKRetryLowersK) {
  auto fault = std::make_unique<FaultModel>(LoadModel(kF32));
  FaultModel* model = fault.get();
  ASSERT_NE(model->router(), nullptr);
  auto loaded = Loaded(std::move(fault));
  auto session = NewSession(loaded);
  model->failures = {absl::DataLossError("injected")};  // the prefill
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy(4), {}, &result).ok());
  EXPECT_EQ(model->router()->options().k_reduction, 1);
  EXPECT_EQ(session->stats().average_experts_per_token,
            static_cast<double>(model->spec().n_expert_used) - 1);
  // Counted in the registry by its reason.
  EXPECT_GE(TestRegistry()->Read("moert_degrade_events_total", {"io_error"}).value_or(0), 1.0);
}

TEST(InferenceGuardTest, AnOrderSpentFailsNamingWhatWasTriedThenTheNextRequestRuns) {
  auto fault = std::make_unique<FaultModel>(LoadModel(kF32));
  FaultModel* model = fault.get();
  auto loaded = Loaded(std::move(fault));
  auto session = NewSession(loaded);
  model->failures.assign(3, absl::DataLossError("injected: the file changed"));
  GenerateResult result;
  Status status = session->Generate(Greedy(4), {}, &result);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("injected: the file changed"));
  EXPECT_THAT(status.message(), HasSubstr("InferenceGuard retried after: reduce_top_k, "
                                          "dense_fallback (not applied: "));
  EXPECT_THAT(status.message(), HasSubstr("no dense fallback FFN"));
  EXPECT_TRUE(result.degraded);
  model->failures.clear();
  status = session->Generate(Greedy(4), {}, &result);
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(result.tokens.size(), 4u);
}

TEST(InferenceGuardTest, OffTheFailureComesBackAsItWas) {
  auto fault = std::make_unique<FaultModel>(LoadModel(kF32));
  FaultModel* model = fault.get();
  auto loaded = Loaded(std::move(fault), /*guard=*/false);
  auto session = NewSession(loaded);
  model->failures = {absl::ResourceExhaustedError("injected")};
  GenerateResult result;
  const Status status = session->Generate(Greedy(4), {}, &result);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), Not(HasSubstr("InferenceGuard")));
  EXPECT_EQ(model->defragments, 0);
  EXPECT_FALSE(result.degraded);
  EXPECT_TRUE(result.degrade_reason.empty());
}

TEST(InferenceGuardTest, OtherFailuresAreNotRetried) {
  auto fault = std::make_unique<FaultModel>(LoadModel(kF32));
  FaultModel* model = fault.get();
  auto loaded = Loaded(std::move(fault));
  auto session = NewSession(loaded);
  model->failures = {absl::InvalidArgumentError("injected: a bad token")};
  GenerateResult result;
  const Status status = session->Generate(Greedy(4), {}, &result);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model->forward_calls, 1);
  EXPECT_FALSE(result.degraded);
}

TEST(InferenceGuardTest, SixRetriesLatchTheSessionDegraded) {
  auto fault = std::make_unique<FaultModel>(LoadModel(kF32));
  FaultModel* model = fault.get();
  auto loaded = Loaded(std::move(fault));
  auto session = NewSession(loaded);
  // Exhaustion at every other step: each retried after a defragment.
  for (int i = 0; i < 6; ++i) {
    model->failures.push_back(absl::OkStatus());
    model->failures.push_back(absl::ResourceExhaustedError("injected"));
  }
  GenerateResult result;
  ASSERT_TRUE(session->Generate(Greedy(12), {}, &result).ok());
  EXPECT_EQ(model->defragments, 6);
  EXPECT_THAT(result.degrade_reason, HasSubstr("stays degraded for the session"));
  // And says so later.
  ASSERT_TRUE(session->Generate(Greedy(2), {}, &result).ok());
  EXPECT_TRUE(result.degraded);
  EXPECT_THAT(result.degrade_reason, HasSubstr("stays degraded for the session"));
}

// --- The actions, each on a real model.

TEST(DegradeActionsTest, ReduceTopKTakesOneExpertFewerUntilOne) {
  auto model = LoadModel(kF32);
  ASSERT_NE(model->router(), nullptr);
  const int k = static_cast<int>(model->spec().n_expert_used);
  ASSERT_GE(k, 2);
  runtime::ModelActuator actuator(model.get(), {});
  ASSERT_TRUE(actuator.Apply(DegradeAction::kReduceTopK).ok());
  model->router()->ResetStats();
  test_util::RunGreedy(*model, 8, 2);
  EXPECT_EQ(model->router()->stats().average_k(), k - 1);
  for (int i = 2; i < k; ++i) ASSERT_TRUE(actuator.Apply(DegradeAction::kReduceTopK).ok());
  const absl::Status s = actuator.Apply(DegradeAction::kReduceTopK);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("one expert"));
}

TEST(DegradeActionsTest, ShrinkPoolHalvesThePoolUntilItsFloor) {
  model::ModelLoadOptions options;
  options.expert_pool_fraction = 1;
  options.router.alpha = 0;  // routing does not follow residency
  auto model = LoadModel(kQ8, options);
  ASSERT_TRUE(model->memory_stats().expert_pool);
  const test_util::GreedyRun want = test_util::RunGreedy(*model, 8, 4);
  const uint64_t before = model->memory_stats().pool.pool_bytes;
  runtime::ModelActuator actuator(model.get(), {});
  ASSERT_TRUE(actuator.Apply(DegradeAction::kShrinkPool).ok());
  const model::MemoryStats after = model->memory_stats();
  EXPECT_LE(after.ledger.pool_bytes, before / 2 + after.ledger.pool_floor_bytes);
  EXPECT_LT(after.ledger.pool_bytes, before);
  EXPECT_LE(after.pool.used_bytes, after.ledger.pool_bytes);
  // The output of a pool is that of resident experts, at any size.
  EXPECT_EQ(test_util::RunGreedy(*model, 8, 4).tokens, want.tokens);
  absl::Status s;
  for (int i = 0; i < 64 && s.ok(); ++i) s = actuator.Apply(DegradeAction::kShrinkPool);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("at its floor"));
}

TEST(DegradeActionsTest, CpuInsteadOfTheDevice) {
  model::ModelLoadOptions options;
  options.router.alpha = 0;
  auto cpu = LoadModel(kF32, options);
  auto counts = std::make_shared<backend::testing::FakeCounts>();
  options.backend = model::Backend::kOpenCl;
  options.device_backend = [&]() -> absl::StatusOr<std::unique_ptr<backend::Backend>> {
    return std::unique_ptr<backend::Backend>(std::make_unique<backend::testing::FakeBackend>(
        std::set<backend::Op>{backend::Op::kMatMul, backend::Op::kRmsNorm, backend::Op::kAdd},
        counts));
  };
  auto device = LoadModel(kF32, options);
  ASSERT_EQ(device->backend_stats().backend, "Fake");
  runtime::ModelActuator actuator(device.get(), {});
  EXPECT_TRUE(actuator.on_device());
  ASSERT_TRUE(actuator.Apply(DegradeAction::kCpuBackend).ok());
  EXPECT_FALSE(actuator.on_device());
  const model::BackendStats stats = device->backend_stats();
  EXPECT_EQ(stats.backend, "CPU");
  EXPECT_THAT(stats.cpu_reason, HasSubstr("degrade policy"));
  const uint64_t ops = counts->ops;
  EXPECT_EQ(test_util::RunGreedy(*device, 8, 4).tokens, test_util::RunGreedy(*cpu, 8, 4).tokens);
  EXPECT_EQ(counts->ops, ops);  // the device runs nothing more
  EXPECT_TRUE(absl::IsFailedPrecondition(actuator.Apply(DegradeAction::kCpuBackend)));
}

TEST(DegradeActionsTest, WithoutWhatTheyNeedActionsSaySo) {
  auto model = LoadModel(kF32);  // no pool, no dense fallback, on the CPU
  runtime::ModelActuator actuator(model.get(), {});
  struct Case {
    DegradeAction action;
    const char* message;
  };
  for (const Case& c : {Case{DegradeAction::kDenseFallback, "no dense fallback FFN"},
                        Case{DegradeAction::kDefragment, "no expert pool"},
                        Case{DegradeAction::kShrinkPool, "no expert pool"},
                        Case{DegradeAction::kCpuBackend, "already runs on the CPU"},
                        Case{DegradeAction::kShorterContext, "no session"}}) {
    const absl::Status s = actuator.Apply(c.action);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << pipeline::DegradeActionName(c.action);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

TEST(DegradeActionsTest, UndoingReduceTopKGivesTheExpertBack) {
  auto model = LoadModel(kF32);
  const int k = static_cast<int>(model->spec().n_expert_used);
  const test_util::GreedyRun want = test_util::RunGreedy(*model, 8, 2);
  std::vector<std::string> in_force;
  runtime::ModelActuator actuator(model.get(), {}, &in_force);
  EXPECT_TRUE(absl::IsFailedPrecondition(actuator.Undo(DegradeAction::kReduceTopK)));
  ASSERT_TRUE(actuator.Apply(DegradeAction::kReduceTopK).ok());
  EXPECT_EQ(in_force, std::vector<std::string>{"reduce_top_k"});
  ASSERT_TRUE(actuator.Undo(DegradeAction::kReduceTopK).ok());
  EXPECT_TRUE(in_force.empty());
  EXPECT_EQ(model->router()->options().k_reduction, 0);
  model->router()->ResetStats();
  // The model's k again, and its output.
  EXPECT_EQ(test_util::RunGreedy(*model, 8, 2).tokens, want.tokens);
  EXPECT_EQ(model->router()->stats().average_k(), k);
}

TEST(DegradeActionsTest, UndoingShrinkPoolDoublesTheLimitBack) {
  model::ModelLoadOptions options;
  options.expert_pool_fraction = 1;
  auto model = LoadModel(kQ8, options);
  std::vector<std::string> in_force;
  runtime::ModelActuator actuator(model.get(), {}, &in_force);
  EXPECT_TRUE(absl::IsFailedPrecondition(actuator.Undo(DegradeAction::kShrinkPool)));
  ASSERT_TRUE(actuator.Apply(DegradeAction::kShrinkPool).ok());
  ASSERT_TRUE(actuator.Apply(DegradeAction::kShrinkPool).ok());
  EXPECT_EQ(model->budget()->stats().trim_fraction, 0.25);
  ASSERT_TRUE(actuator.Undo(DegradeAction::kShrinkPool).ok());
  EXPECT_EQ(model->budget()->stats().trim_fraction, 0.5);
  EXPECT_EQ(in_force, std::vector<std::string>{"shrink_pool"});
  ASSERT_TRUE(actuator.Undo(DegradeAction::kShrinkPool).ok());
  EXPECT_EQ(model->budget()->stats().trim_fraction, 1);
  EXPECT_TRUE(in_force.empty());
}

TEST(DegradeActionsTest, TheDenseFallbackEndsWhenItsLastApplicationIsUndone) {
  auto fault = std::make_unique<FaultModel>(LoadModel(kF32));
  fault->fake_dense_fallback = true;
  std::vector<std::string> in_force;
  runtime::ModelActuator actuator(fault.get(), {}, &in_force);
  ASSERT_TRUE(actuator.Apply(DegradeAction::kDenseFallback).ok());  // two rules fired
  ASSERT_TRUE(actuator.Apply(DegradeAction::kDenseFallback).ok());
  ASSERT_TRUE(actuator.Undo(DegradeAction::kDenseFallback).ok());
  EXPECT_TRUE(fault->dense_fallback_on);  // the other still holds it
  ASSERT_TRUE(actuator.Undo(DegradeAction::kDenseFallback).ok());
  EXPECT_FALSE(fault->dense_fallback_on);
  EXPECT_TRUE(in_force.empty());
}

TEST(DegradeActionsTest, DefragmentAndTheCpuBackendCannotBeUndone) {
  auto model = LoadModel(kF32);
  runtime::ModelActuator actuator(model.get(), {});
  EXPECT_THAT(std::string(actuator.Undo(DegradeAction::kDefragment).message()),
              HasSubstr("nothing to undo"));
  EXPECT_THAT(std::string(actuator.Undo(DegradeAction::kCpuBackend).message()),
              HasSubstr("stays given up"));
  EXPECT_THAT(std::string(actuator.Undo(DegradeAction::kShorterContext).message()),
              HasSubstr("no session"));
}

TEST(DegradeActionsTest, DefragmentCompactsAModelsPool) {
  model::ModelLoadOptions options;
  options.expert_pool_fraction = 0.5;
  auto model = LoadModel(kQ8, options);
  test_util::RunGreedy(*model, 16, 4);
  const double before = model->memory_stats().pool.fragmentation;
  runtime::ModelActuator actuator(model.get(), {});
  ASSERT_TRUE(actuator.Apply(DegradeAction::kDefragment).ok());
  const experts::ExpertCacheStats s = model->memory_stats().pool;
  EXPECT_LE(s.fragmentation, before);
  EXPECT_LE(s.fragmentation, 0.5);  // the largest free block is at least half the free bytes
}

TEST(ModelMetricsTest, ReadsTheFiguresTheDefaultRulesUse) {
  model::ModelLoadOptions options;
  options.expert_pool_fraction = 0.5;
  options.resource_monitor.thermal_limit_c = 60;
  auto model = LoadModel(kQ8, options);
  model->resource_monitor()->SetTemperature(72.5f);
  runtime::ModelMetrics metrics(model.get());
  const pipeline::MetricSource& first = metrics.Read(1);
  EXPECT_EQ(first.Value(pipeline::kCpuTemperatureMetric), 72.5);
  EXPECT_EQ(first.Value(pipeline::kCpuTemperatureLimitMetric), 60.0);
  EXPECT_TRUE(first.Value(pipeline::kPoolFragmentationMetric).has_value());
  EXPECT_FALSE(first.Value(pipeline::kStallPerTokenMetric).has_value());     // no earlier read
  EXPECT_FALSE(first.Value(pipeline::kRouterLatencyP99Metric).has_value());  // not measured
  const uint64_t stall_before = model->memory_stats().pool.stall_ns;
  test_util::RunGreedy(*model, 8, 1);
  const uint64_t stall_after = model->memory_stats().pool.stall_ns;
  ASSERT_GT(model->memory_stats().pool.misses, 0u);  // half the experts: loads happened
  const pipeline::MetricSource& second = metrics.Read(9);
  ASSERT_TRUE(second.Value(pipeline::kStallPerTokenMetric).has_value());
  // The pool's stall over those 9 tokens, per token, in seconds.
  EXPECT_DOUBLE_EQ(*second.Value(pipeline::kStallPerTokenMetric),
                   static_cast<double>(stall_after - stall_before) / 1e9 / 9);
}

TEST(ModelMetricsTest, TheRoutersP99IsOverTheDecodeStepsRoutings) {
  auto model = LoadModel(kF32);
  telemetry::Registry& registry = *TestRegistry();
  runtime::ModelMetrics metrics(model.get(), &registry);
  auto cache = model->NewKvCache(64);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {1, 2010, 270, 1999};
  ASSERT_TRUE(model->Forward(prompt, cache->get(), model::LogitsFor::kLast, &logits).ok());
  EXPECT_FALSE(metrics.Read(4).Value(pipeline::kRouterLatencyP99Metric).has_value());
  // A prefill's routings are left out.
  ASSERT_TRUE(model->Forward(prompt, cache->get(), model::LogitsFor::kLast, &logits).ok());
  EXPECT_FALSE(metrics.Read(4).Value(pipeline::kRouterLatencyP99Metric).has_value());
  const std::vector<uint64_t> before = telemetry::RouterLatencyCounts(registry);
  for (int i = 0; i < 3; ++i) {
    const int32_t token = 275;
    ASSERT_TRUE(model->Forward({&token, 1}, cache->get(), model::LogitsFor::kLast, &logits).ok());
    (void)metrics.Read(1);
  }
  const std::vector<uint64_t> after = telemetry::RouterLatencyCounts(registry);
  std::vector<uint64_t> window(after.size());
  uint64_t routings = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    window[i] = after[i] - before[i];
    routings += window[i];
  }
  EXPECT_EQ(routings, 3 * model->spec().n_layer);  // one routing per MoE layer and token
  const std::optional<double> p99 = metrics.Read(1).Value(pipeline::kRouterLatencyP99Metric);
  ASSERT_TRUE(p99.has_value());
  // The read after the last step added no routings; the three steps' are the window.
  EXPECT_DOUBLE_EQ(*p99, *telemetry::HistogramQuantile(telemetry::RouterLatencyBounds(), window,
                                                        0.99));
}

// --- The policy in a running session.

TEST(DegradePolicySessionTest, ARuleShortensTheContextMidGeneration) {
  model::ModelLoadOptions options;
  auto model = LoadModel(kF32, options);
  model->resource_monitor()->SetTemperature(80.f);
  pipeline::DegradePolicyOptions degrade;
  degrade.rules = *pipeline::ParseDegradeRules(
      "moert_cpu_temperature_celsius > 50 -> shorter_context cooldown 1000 steps reason hot");
  auto loaded = Loaded(std::move(model), true, /*rules=*/true, degrade);
  auto session = NewSession(loaded);
  GenerateResult result;
  const Status status = session->Generate(Greedy(40), {}, &result);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(result.tokens.size(), 40u);
  EXPECT_EQ(result.finish_reason, FinishReason::kMaxTokens);
  EXPECT_GE(session->stats().context_slides, 1);  // 32 positions, not 64
  EXPECT_THAT(result.degrade_reason, HasSubstr("hot: shorter_context"));
}

TEST(DegradePolicySessionTest, AThermalDegradeIsUndoneOnceItCools) {
  model::ModelLoadOptions options;
  auto model = LoadModel(kF32, options);
  model::Model* m = model.get();
  m->resource_monitor()->SetTemperature(80.f);
  pipeline::DegradePolicyOptions degrade;
  degrade.rules = *pipeline::ParseDegradeRules(
      "moert_cpu_temperature_celsius > 50 -> reduce_top_k cooldown 1000 steps recover 4 steps "
      "reason hot");
  auto loaded = Loaded(std::move(model), true, /*rules=*/true, degrade);
  auto session = NewSession(loaded);
  GenerateResult result;
  int streamed = 0;
  const Status status = session->Generate(
      Greedy(20), [&](std::string_view, int32_t) {
        if (++streamed == 5) m->resource_monitor()->SetTemperature(40.f);
        return true;
      },
      &result);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(result.tokens.size(), 20u);
  EXPECT_THAT(result.degrade_reason, HasSubstr("hot: reduce_top_k"));
  EXPECT_THAT(result.degrade_reason, HasSubstr("hot: undid reduce_top_k"));
  EXPECT_THAT(result.degrade_reason, Not(HasSubstr("in force")));
  EXPECT_EQ(m->router()->options().k_reduction, 0);
  EXPECT_EQ(TestRegistry()->Read("moert_degrade_recoveries_total", {"hot"}), 1);
  // The next request runs with the model's k, not degraded.
  ASSERT_TRUE(session->Generate(Greedy(4), {}, &result).ok());
  EXPECT_FALSE(result.degraded) << result.degrade_reason;
}

uint64_t FrozenClock() { return 1'000'000'000; }

TEST(DegradePolicySessionTest, ThroughTheApiTheThermalRuleFiresOnceInItsCooldown) {
  telemetry::SetClock(FrozenClock);  // the 30 s cooldown never ends
  RuntimeOptions options;
  options.threads = 1;
  options.degrade_policy = true;
  options.thermal_limit_c = 50;
  std::unique_ptr<MoERuntime> runtime;
  ASSERT_TRUE(MoERuntime::Create(options, &runtime).ok());
  ASSERT_TRUE(runtime->LoadModel(kF32).ok());
  runtime->SetTemperature(80);
  GenerateResult result;
  ASSERT_TRUE(runtime->Generate(Greedy(16), {}, &result).ok());
  EXPECT_TRUE(result.degraded);
  EXPECT_THAT(result.degrade_reason, HasSubstr("thermal: reduce_top_k"));
  EXPECT_EQ(result.degrade_reason.find("thermal:"), result.degrade_reason.rfind("thermal:"));
  EXPECT_TRUE(runtime->Stats().degraded);
  telemetry::SetClock(nullptr);
}

TEST(DegradePolicySessionTest, WithTheGuardOnASuccessfulRequestIsBitIdentical) {
  std::vector<int32_t> tokens[2];
  for (bool guard : {false, true}) {
    RuntimeOptions options;
    options.threads = 1;
    options.inference_guard = guard;
    std::unique_ptr<MoERuntime> runtime;
    ASSERT_TRUE(MoERuntime::Create(options, &runtime).ok());
    ASSERT_TRUE(runtime->LoadModel(kF32).ok());
    GenerateResult result;
    ASSERT_TRUE(runtime->Generate(Greedy(8), {}, &result).ok());
    EXPECT_FALSE(result.degraded);
    EXPECT_TRUE(result.degrade_reason.empty());
    tokens[guard] = result.tokens;
  }
  EXPECT_EQ(tokens[0], kGreedyIds);
  EXPECT_EQ(tokens[1], kGreedyIds);
}

TEST(DegradePolicySessionTest, ABadRulesFileFailsTheLoadNamingTheLine) {
  const std::string path = ::testing::TempDir() + "/bad.rules";
  {
    std::ofstream out(path);
    out << "# ok\nmoert_pool_fragmentation_ratio > 0.4 -> defrag\n";
  }
  RuntimeOptions options;
  options.threads = 1;
  options.degrade_policy = true;
  options.degrade_rules_path = path;
  std::unique_ptr<MoERuntime> runtime;
  ASSERT_TRUE(MoERuntime::Create(options, &runtime).ok());
  Status status = runtime->LoadModel(kF32);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(path + ":2: unknown degrade action \"defrag\""));
  EXPECT_FALSE(runtime->model_loaded());
  options.degrade_rules_path = path + ".missing";
  ASSERT_TRUE(runtime->SetOptions(options).ok());
  status = runtime->LoadModel(kF32);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(".missing"));
}

}  // namespace
}  // namespace moert
