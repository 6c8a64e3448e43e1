// The degrade policy: each default rule fires under its injected condition and keeps
// its cooldown (in steps and in seconds, on a frozen clock), the latch, and the rule
// file parser's errors.
#include "pipeline/degrade_policy.h"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "telemetry/platform.h"

namespace moert::pipeline {
namespace {

using ::testing::HasSubstr;

std::atomic<uint64_t> g_now_ns{1'000'000'000};
uint64_t FakeClock() { return g_now_ns.load(); }

// Records what it was asked to do; fails the actions in `refuse`.
class RecordingActuator : public DegradeActuator {
 public:
  absl::Status Apply(DegradeAction action) override {
    applied.push_back(action);
    for (DegradeAction r : refuse) {
      if (r == action) return absl::FailedPreconditionError("refused");
    }
    return absl::OkStatus();
  }
  absl::Status Undo(DegradeAction action) override {
    undone.push_back(action);
    for (DegradeAction r : refuse_undo) {
      if (r == action) return absl::FailedPreconditionError("cannot undo");
    }
    return absl::OkStatus();
  }
  std::vector<DegradeAction> applied;
  std::vector<DegradeAction> refuse;
  std::vector<DegradeAction> undone;
  std::vector<DegradeAction> refuse_undo;
};

class DegradePolicyTest : public ::testing::Test {
 protected:
  void SetUp() override { telemetry::SetClock(FakeClock); }
  void TearDown() override { telemetry::SetClock(nullptr); }

  // Runs steps [from, to) and returns how many times the policy fired.
  int Run(DegradePolicy& policy, int64_t from, int64_t to) {
    int fired = 0;
    for (int64_t s = from; s < to; ++s) {
      fired += static_cast<int>(policy.Step(s, metrics, actuator).size());
    }
    return fired;
  }

  // A policy of the one rule `text` over moert_x, without a latch: fired at step 0,
  // moert_x clear (0) after.
  DegradePolicy FiredThenClear(std::string_view text) {
    DegradePolicyOptions options;
    options.latch_degrades = 0;
    options.rules = *ParseDegradeRules(text);
    DegradePolicy policy(options);
    metrics.Set("moert_x", 2);
    EXPECT_EQ(Run(policy, 0, 1), 1);
    metrics.Set("moert_x", 0);
    return policy;
  }

  MetricSnapshot metrics;
  RecordingActuator actuator;
};

DegradePolicyOptions NoLatch() {
  DegradePolicyOptions options;
  options.latch_degrades = 0;
  return options;
}

TEST_F(DegradePolicyTest, DefaultRulesParse) {
  const std::vector<DegradeRule> rules = DefaultDegradeRules();
  ASSERT_EQ(rules.size(), 4u);
  EXPECT_EQ(rules[0].metric, kPoolFragmentationMetric);
  EXPECT_EQ(rules[1].bound_metric, kCpuTemperatureLimitMetric);
  EXPECT_EQ(rules[2].metric, kRouterLatencyP99Metric);
  EXPECT_EQ(rules[3].metric, kStallPerTokenMetric);
}

TEST_F(DegradePolicyTest, NothingFiresWithoutMetricsOrBelowTheBounds) {
  DegradePolicy policy(NoLatch());
  EXPECT_EQ(Run(policy, 0, 10), 0);
  metrics.Set(kPoolFragmentationMetric, 0.4);  // not above 0.4
  metrics.Set(kCpuTemperatureMetric, 90);      // no limit known
  metrics.Set(kRouterLatencyP99Metric, 0.001);
  metrics.Set(kStallPerTokenMetric, 0.01);
  EXPECT_EQ(Run(policy, 10, 20), 0);
  EXPECT_TRUE(actuator.applied.empty());
  EXPECT_EQ(policy.counters().steps, 20u);
}

TEST_F(DegradePolicyTest, FragmentationDefragmentsWithA32StepCooldown) {
  DegradePolicy policy(NoLatch());
  metrics.Set(kPoolFragmentationMetric, 0.6);
  EXPECT_EQ(Run(policy, 0, 1), 1);
  EXPECT_EQ(Run(policy, 1, 32), 0);  // cooling down
  EXPECT_EQ(Run(policy, 32, 33), 1);
  ASSERT_EQ(actuator.applied.size(), 2u);
  EXPECT_EQ(actuator.applied[0], DegradeAction::kDefragment);
  EXPECT_EQ(policy.counters().fired_by_reason.at("fragmentation"), 2u);
  ASSERT_EQ(policy.events().size(), 2u);
  EXPECT_EQ(policy.events()[0].value, 0.6);
  EXPECT_EQ(policy.events()[0].bound, 0.4);
}

TEST_F(DegradePolicyTest, TemperatureAboveTheLimitReducesTopKWithA30SecondCooldown) {
  DegradePolicy policy(NoLatch());
  metrics.Set(kCpuTemperatureLimitMetric, 70);
  metrics.Set(kCpuTemperatureMetric, 69);
  EXPECT_EQ(Run(policy, 0, 5), 0);
  metrics.Set(kCpuTemperatureMetric, 75);
  EXPECT_EQ(Run(policy, 5, 6), 1);
  EXPECT_EQ(actuator.applied.back(), DegradeAction::kReduceTopK);
  // Steps alone do not end a cooldown in seconds.
  EXPECT_EQ(Run(policy, 6, 1000), 0);
  g_now_ns += 29'000'000'000ull;
  EXPECT_EQ(Run(policy, 1000, 1001), 0);
  g_now_ns += 1'000'000'000ull;
  EXPECT_EQ(Run(policy, 1001, 1002), 1);
  EXPECT_EQ(policy.counters().fired_by_reason.at("thermal"), 2u);
}

TEST_F(DegradePolicyTest, RouterLatencyAndStallTakeTheDenseFallback) {
  DegradePolicy policy(NoLatch());
  metrics.Set(kRouterLatencyP99Metric, 0.005);
  EXPECT_EQ(Run(policy, 0, 64), 1);
  EXPECT_EQ(actuator.applied.back(), DegradeAction::kDenseFallback);
  EXPECT_EQ(Run(policy, 64, 65), 1);  // the 64-step cooldown is over
  metrics.Erase(kRouterLatencyP99Metric);
  metrics.Set(kStallPerTokenMetric, 0.2);
  EXPECT_EQ(Run(policy, 65, 129), 1);
  EXPECT_EQ(Run(policy, 129, 130), 1);
  EXPECT_EQ(policy.counters().fired_by_reason.at("router_latency"), 2u);
  EXPECT_EQ(policy.counters().fired_by_reason.at("stall"), 2u);
}

TEST_F(DegradePolicyTest, AFailedActionIsCountedAndStillCoolsDown) {
  DegradePolicy policy(NoLatch());
  actuator.refuse = {DegradeAction::kDenseFallback};
  metrics.Set(kStallPerTokenMetric, 1);
  EXPECT_EQ(Run(policy, 0, 64), 1);
  EXPECT_EQ(policy.counters().failed, 1u);
  ASSERT_EQ(policy.events().size(), 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition(policy.events()[0].status));
}

TEST_F(DegradePolicyTest, MoreThanFiveDegradesInAWindowLatchForTheSession) {
  DegradePolicyOptions options;
  options.rules = *ParseDegradeRules("moert_x > 1 -> shrink_pool cooldown 2 steps");
  DegradePolicy policy(options);
  metrics.Set("moert_x", 2);
  // Fires at steps 0, 2, 4, 6, 8: five in the 64-step window, not yet latched.
  EXPECT_EQ(Run(policy, 0, 10), 5);
  EXPECT_FALSE(policy.latched());
  EXPECT_TRUE(policy.latch_reason().empty());
  EXPECT_EQ(Run(policy, 10, 11), 1);  // the sixth
  EXPECT_TRUE(policy.latched());
  EXPECT_THAT(policy.latch_reason(), HasSubstr("stays degraded for the session"));
  EXPECT_EQ(Run(policy, 11, 200), 0);  // nothing more is applied
  EXPECT_EQ(actuator.applied.size(), 6u);
}

TEST_F(DegradePolicyTest, DegradesSpreadWiderThanTheWindowDoNotLatch) {
  DegradePolicyOptions options;
  options.rules = *ParseDegradeRules("moert_x > 1 -> shrink_pool cooldown 20 steps");
  DegradePolicy policy(options);
  metrics.Set("moert_x", 2);
  EXPECT_EQ(Run(policy, 0, 400), 20);  // at most 4 in any 64 steps
  EXPECT_FALSE(policy.latched());
}

TEST_F(DegradePolicyTest, GuardRetriesCountTowardTheLatch) {
  DegradePolicyOptions options;
  options.rules = {};
  DegradePolicy policy(options);
  for (int i = 0; i < 6; ++i) policy.NoteDegrade(0, "exhausted");
  EXPECT_TRUE(policy.latched());
  EXPECT_EQ(policy.counters().fired_by_reason.at("exhausted"), 6u);
}

// Undos are events too: the ones among `events`.
int Undos(const std::vector<DegradeEvent>& events) {
  int n = 0;
  for (const DegradeEvent& e : events) n += e.undo ? 1 : 0;
  return n;
}

TEST_F(DegradePolicyTest, ARecoveringRuleUndoesEachFiringOnceClearForItsRecoverTime) {
  DegradePolicyOptions options = NoLatch();
  options.rules = *ParseDegradeRules("moert_x > 1 -> reduce_top_k cooldown 2 steps recover 10 steps");
  DegradePolicy policy(options);
  metrics.Set("moert_x", 2);
  EXPECT_EQ(Run(policy, 0, 3), 2);  // steps 0 and 2
  metrics.Set("moert_x", 0);
  // Clear from step 3: nothing is undone before step 13, then one firing, then the
  // other 10 steps later, then nothing more.
  EXPECT_EQ(Run(policy, 3, 13), 0);
  std::vector<DegradeEvent> events = policy.Step(13, metrics, actuator);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].undo);
  EXPECT_EQ(events[0].action, DegradeAction::kReduceTopK);
  EXPECT_TRUE(events[0].status.ok());
  EXPECT_EQ(Run(policy, 14, 23), 0);
  EXPECT_EQ(Undos(policy.Step(23, metrics, actuator)), 1);
  EXPECT_EQ(Run(policy, 24, 200), 0);
  EXPECT_EQ(actuator.undone.size(), 2u);
  EXPECT_EQ(policy.counters().undone, 2u);
  EXPECT_EQ(policy.counters().fired, 2u);  // undos are not firings
}

TEST_F(DegradePolicyTest, TheConditionMustStayClearAndKnownForTheWholeRecoverTime) {
  DegradePolicy policy =
      FiredThenClear("moert_x > 1 -> dense_fallback cooldown 100 steps recover 10 steps");
  EXPECT_EQ(Run(policy, 1, 9), 0);
  metrics.Set("moert_x", 5);  // holds again (cooling down: no firing) and resets the count
  EXPECT_EQ(Run(policy, 9, 10), 0);
  metrics.Set("moert_x", 0);
  EXPECT_EQ(Run(policy, 10, 19), 0);
  metrics.Erase("moert_x");  // unknown: not clear either
  EXPECT_EQ(Run(policy, 19, 40), 0);
  metrics.Set("moert_x", 0);
  EXPECT_EQ(Run(policy, 40, 50), 0);  // clear since 40
  EXPECT_EQ(Undos(policy.Step(50, metrics, actuator)), 1);
  EXPECT_EQ(actuator.undone, std::vector<DegradeAction>{DegradeAction::kDenseFallback});
}

TEST_F(DegradePolicyTest, RecoverInSecondsWaitsOnTheClock) {
  DegradePolicy policy = FiredThenClear("moert_x > 1 -> reduce_top_k recover 30 s");
  EXPECT_EQ(Run(policy, 1, 1000), 0);  // steps alone do not end it
  g_now_ns += 30'000'000'000ull;
  EXPECT_EQ(Undos(policy.Step(1000, metrics, actuator)), 1);
}

TEST_F(DegradePolicyTest, AFailedUndoIsReportedOnceAndNotRetried) {
  actuator.refuse_undo = {DegradeAction::kShrinkPool};
  DegradePolicy policy = FiredThenClear("moert_x > 1 -> shrink_pool recover 1 steps");
  EXPECT_EQ(Run(policy, 1, 100), 1);  // the failed undo's event, once
  EXPECT_EQ(actuator.undone.size(), 1u);
  EXPECT_EQ(policy.counters().undone, 0u);
  ASSERT_FALSE(policy.events().empty());
  EXPECT_TRUE(policy.events().back().undo);
  EXPECT_TRUE(absl::IsFailedPrecondition(policy.events().back().status));
}

TEST_F(DegradePolicyTest, AFailedFiringIsNotUndoneAndALatchedPolicyUndoesNothing) {
  DegradePolicyOptions options;
  options.rules = *ParseDegradeRules(
      "moert_x > 1 -> reduce_top_k cooldown 1 steps recover 1 steps\n"
      "moert_y > 1 -> dense_fallback recover 1 steps");
  DegradePolicy policy(options);
  actuator.refuse = {DegradeAction::kDenseFallback};
  metrics.Set("moert_y", 2);
  EXPECT_EQ(Run(policy, 0, 1), 1);  // refused: nothing applied
  metrics.Set("moert_y", 0);
  EXPECT_EQ(Run(policy, 1, 10), 0);
  metrics.Set("moert_x", 2);
  EXPECT_EQ(Run(policy, 10, 16), 6);  // the sixth applied firing latches
  ASSERT_TRUE(policy.latched());
  metrics.Set("moert_x", 0);
  EXPECT_EQ(Run(policy, 16, 100), 0);
  EXPECT_TRUE(actuator.undone.empty());
}

TEST_F(DegradePolicyTest, TheDefaultThermalAndDenseFallbackRulesRecover) {
  const std::vector<DegradeRule> rules = DefaultDegradeRules();
  EXPECT_FALSE(rules[0].recovers());  // defragment has nothing to undo
  EXPECT_EQ(rules[1].recover_ns, 30'000'000'000u);
  EXPECT_EQ(rules[2].recover_steps, 512);
  EXPECT_EQ(rules[3].recover_steps, 512);
  DegradePolicy policy(NoLatch());
  metrics.Set(kCpuTemperatureLimitMetric, 70);
  metrics.Set(kCpuTemperatureMetric, 80);
  EXPECT_EQ(Run(policy, 0, 1), 1);
  metrics.Set(kCpuTemperatureMetric, 60);
  EXPECT_EQ(Run(policy, 1, 2), 0);  // clear from here
  g_now_ns += 30'000'000'000ull;
  EXPECT_EQ(Undos(policy.Step(2, metrics, actuator)), 1);
  EXPECT_EQ(actuator.undone, std::vector<DegradeAction>{DegradeAction::kReduceTopK});
}

TEST(DegradeRulesParserTest, ReadsEveryPart) {
  absl::StatusOr<std::vector<DegradeRule>> rules = ParseDegradeRules(
      "# comment line\n"
      "\n"
      "  moert_a <= -2.5 -> cpu_backend   # trailing comment\n"
      "moert_b >= moert_c -> shorter_context cooldown 250 ms reason hot\n"
      "moert_d < 1e-3 -> reduce_top_k cooldown 3 steps cooldown 1 s recover 7 steps\n");
  ASSERT_TRUE(rules.ok()) << rules.status();
  ASSERT_EQ(rules->size(), 3u);
  EXPECT_EQ((*rules)[0].comparison, Comparison::kLessEqual);
  EXPECT_EQ((*rules)[0].bound, -2.5);
  EXPECT_EQ((*rules)[0].action, DegradeAction::kCpuBackend);
  EXPECT_EQ(RuleReason((*rules)[0]), "cpu_backend");
  EXPECT_EQ((*rules)[1].bound_metric, "moert_c");
  EXPECT_EQ((*rules)[1].cooldown_ns, 250'000'000u);
  EXPECT_EQ((*rules)[1].reason, "hot");
  EXPECT_EQ((*rules)[2].cooldown_steps, 3);
  EXPECT_EQ((*rules)[2].cooldown_ns, 1'000'000'000u);
  EXPECT_EQ((*rules)[2].recover_steps, 7);
  EXPECT_FALSE((*rules)[0].recovers());
}

TEST(DegradeRulesParserTest, ErrorsNameTheLineAndWhatIsWrong) {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"moert_a > 1 -> explode", "r:1: unknown degrade action \"explode\""},
      {"\nmoert_a ~ 1 -> defragment", "r:2: unknown comparison \"~\""},
      {"moert_a > 1 defragment", "r:1: expected METRIC OP BOUND"},
      {"moert_a > 1 => defragment", "r:1: expected -> after the bound"},
      {"moert_a > 1x -> defragment", "r:1: the bound \"1x\""},
      {"9a > 1 -> defragment", "r:1: \"9a\" is not a metric name"},
      {"moert_a > 1 -> defragment cooldown 5", "r:1: cooldown needs a count and a unit"},
      {"moert_a > 1 -> defragment cooldown 5 hours", "r:1: unknown cooldown unit \"hours\""},
      {"moert_a > 1 -> defragment cooldown -1 s", "r:1: the cooldown \"-1\""},
      {"moert_a > 1 -> defragment cooldown 1.5 steps", "r:1: a cooldown in steps must be whole"},
      {"moert_a > 1 -> defragment reason", "r:1: reason needs a name"},
      {"moert_a > 1 -> defragment soon", "r:1: unexpected \"soon\""},
      {"moert_a > 1 -> reduce_top_k recover 5", "r:1: recover needs a count and a unit"},
      {"moert_a > 1 -> reduce_top_k recover 2 days", "r:1: unknown recover unit \"days\""},
      {"moert_a > 1 -> defragment recover 5 steps", "r:1: defragment cannot be undone"},
      {"moert_a > 1 -> cpu_backend recover 1 s", "r:1: cpu_backend cannot be undone"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<DegradeRule>> rules = ParseDegradeRules(c.text, "r");
    ASSERT_FALSE(rules.ok()) << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(rules.status()));
    EXPECT_THAT(std::string(rules.status().message()), HasSubstr(c.error)) << c.text;
  }
}

TEST(DegradeRulesParserTest, ReadsAFileAndNamesAMissingOne) {
  const std::string path = ::testing::TempDir() + "/degrade_rules.txt";
  {
    std::ofstream out(path);
    out << "moert_a > 1 -> defragment\nmoert_a > -> defragment\n";
  }
  absl::StatusOr<std::vector<DegradeRule>> rules = ReadDegradeRulesFile(path);
  ASSERT_FALSE(rules.ok());
  EXPECT_THAT(std::string(rules.status().message()), HasSubstr(path + ":2: "));
  std::remove(path.c_str());
  rules = ReadDegradeRulesFile(path);
  EXPECT_TRUE(absl::IsNotFound(rules.status()));
  EXPECT_THAT(std::string(rules.status().message()), HasSubstr(path));
}

TEST(DegradePolicyOptionsTest, BadOptionsNameTheField) {
  DegradePolicyOptions options;
  options.latch_window_steps = 0;
  EXPECT_THAT(std::string(ValidateDegradePolicyOptions(options).message()),
              HasSubstr("latch_window_steps"));
  options = {};
  options.rules[0].metric = "";
  EXPECT_THAT(std::string(ValidateDegradePolicyOptions(options).message()),
              HasSubstr("degrade rule 0"));
  EXPECT_TRUE(ValidateDegradePolicyOptions({}).ok());
}

}  // namespace
}  // namespace moert::pipeline
