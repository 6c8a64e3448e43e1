// The metrics registry: the exact Prometheus text of a small registry (families in
// name order, children in label order, cumulative buckets with +Inf, _sum and _count,
// a counter's divisor), escaping of label values and help, families asked for again, callback
// families, Read, and exact totals from increments on many threads.
#include "telemetry/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace moert::telemetry {
namespace {

TEST(MetricsTest, SmallRegistryText) {
  Registry registry;
  CounterFamily& loads = registry.AddCounter("moert_loads_total", "Loads by result.", {"result"});
  loads.WithLabels({"miss"}).Increment(3);
  loads.WithLabels({"hit"}).Increment();
  registry.AddCounter("moert_stall_seconds_total", "Stall.", {}, 1e9).Get().Increment(1500000000);
  registry.AddGauge("moert_used_bytes", "Used bytes.", {"tier"}).WithLabels({"expert"}).Set(4096);
  HistogramFamily& latency =
      registry.AddHistogram("moert_latency_seconds", "Latency.", {"layer"}, {0.25, 1});
  Histogram& h = latency.WithLabels({"0"});
  h.Observe(0.125);
  h.Observe(0.5);
  h.Observe(1);  // le is inclusive
  h.Observe(2);

  EXPECT_EQ(registry.PrometheusText(),
            "# HELP moert_latency_seconds Latency.\n"
            "# TYPE moert_latency_seconds histogram\n"
            "moert_latency_seconds_bucket{layer=\"0\",le=\"0.25\"} 1\n"
            "moert_latency_seconds_bucket{layer=\"0\",le=\"1\"} 3\n"
            "moert_latency_seconds_bucket{layer=\"0\",le=\"+Inf\"} 4\n"
            "moert_latency_seconds_sum{layer=\"0\"} 3.625\n"
            "moert_latency_seconds_count{layer=\"0\"} 4\n"
            "# HELP moert_loads_total Loads by result.\n"
            "# TYPE moert_loads_total counter\n"
            "moert_loads_total{result=\"hit\"} 1\n"
            "moert_loads_total{result=\"miss\"} 3\n"
            "# HELP moert_stall_seconds_total Stall.\n"
            "# TYPE moert_stall_seconds_total counter\n"
            "moert_stall_seconds_total 1.5\n"
            "# HELP moert_used_bytes Used bytes.\n"
            "# TYPE moert_used_bytes gauge\n"
            "moert_used_bytes{tier=\"expert\"} 4096\n");
}

TEST(MetricsTest, HistogramWithoutLabels) {
  Registry registry;
  registry.AddHistogram("moert_ttft_seconds", "TTFT.", {}, {1}).Get().Observe(1);
  EXPECT_EQ(registry.PrometheusText(),
            "# HELP moert_ttft_seconds TTFT.\n"
            "# TYPE moert_ttft_seconds histogram\n"
            "moert_ttft_seconds_bucket{le=\"1\"} 1\n"
            "moert_ttft_seconds_bucket{le=\"+Inf\"} 1\n"
            "moert_ttft_seconds_sum 1\n"
            "moert_ttft_seconds_count 1\n");
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
  Registry registry;
  registry.AddCounter("moert_x_total", "Line one\nline two.", {"reason"})
      .WithLabels({"say \"no\"\n"})
      .Increment();
  EXPECT_EQ(registry.PrometheusText(),
            "# HELP moert_x_total Line one\\nline two.\n"
            "# TYPE moert_x_total counter\n"
            "moert_x_total{reason=\"say \\\"no\\\"\\n\"} 1\n");
}

TEST(MetricsTest, FormatsSpecialValues) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e21), "1e+21");
}

TEST(MetricsTest, AskingAgainGivesTheSameFamilyAndChild) {
  Registry registry;
  Counter& a = registry.AddCounter("moert_a_total", "A.", {"k"}).WithLabels({"v"});
  Counter& b = registry.AddCounter("moert_a_total", "A.", {"k"}).WithLabels({"v"});
  EXPECT_EQ(&a, &b);
  a.Increment(2);
  b.Increment(3);
  EXPECT_EQ(a.value(), 5u);
}

TEST(MetricsTest, GaugeSetsAndAdds) {
  Gauge g;
  g.Set(2.5);
  g.Add(-1);
  EXPECT_EQ(g.value(), 1.5);
}

TEST(MetricsTest, CallbackFamiliesAreReadAtWriteTime) {
  Registry registry;
  double used = 1;
  registry.SetCallback("moert_pool_bytes", "Pool.", MetricType::kGauge, {"tier"}, [&] {
    return std::vector<CallbackSample>{{{"persistent"}, 2}, {{"expert"}, used}};
  });
  used = 7;
  const std::string text =
      "# HELP moert_pool_bytes Pool.\n"
      "# TYPE moert_pool_bytes gauge\n"
      "moert_pool_bytes{tier=\"expert\"} 7\n"
      "moert_pool_bytes{tier=\"persistent\"} 2\n";
  EXPECT_EQ(registry.PrometheusText(), text);
  registry.SetCallback("moert_pool_bytes", "Pool.", MetricType::kGauge, {"tier"}, [] {
    return std::vector<CallbackSample>{{{"expert"}, 1}};
  });
  EXPECT_EQ(registry.PrometheusText(),
            "# HELP moert_pool_bytes Pool.\n"
            "# TYPE moert_pool_bytes gauge\n"
            "moert_pool_bytes{tier=\"expert\"} 1\n");
  registry.RemoveCallback("moert_pool_bytes");
  EXPECT_EQ(registry.PrometheusText(), "");
}

TEST(MetricsTest, ReadGivesWhatTheTextShows) {
  Registry registry;
  registry.AddCounter("moert_ns_total", "N.", {"k"}, 1e9).WithLabels({"a"}).Increment(250000000);
  registry.AddGauge("moert_g", "G.").Get().Set(-2);
  registry.AddHistogram("moert_h", "H.", {}, {1}).Get().Observe(5);
  registry.SetCallback("moert_cb", "C.", MetricType::kGauge, {}, [] {
    return std::vector<CallbackSample>{{{}, 9}};
  });
  EXPECT_EQ(registry.Read("moert_ns_total", {"a"}), 0.25);
  EXPECT_EQ(registry.Read("moert_ns_total", {"b"}), std::nullopt);
  EXPECT_EQ(registry.Read("moert_g"), -2);
  EXPECT_EQ(registry.Read("moert_h"), 1);
  EXPECT_EQ(registry.Read("moert_cb"), 9);
  EXPECT_EQ(registry.Read("moert_none"), std::nullopt);
}

TEST(MetricsTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
}

TEST(MetricsTest, HistogramQuantileInterpolatesWithinTheBucketAsPrometheusDoes) {
  const std::vector<double> bounds = {1, 2, 4};
  EXPECT_EQ(HistogramQuantile(bounds, {0, 0, 0, 0}, 0.5), std::nullopt);
  // 10 observations in (0, 1]: the median is half way into the first bucket.
  EXPECT_DOUBLE_EQ(*HistogramQuantile(bounds, {10, 0, 0, 0}, 0.5), 0.5);
  // 50 in (0, 1], 50 in (2, 4]: the 0.99 rank (99) is 49/50 of the way from 2 to 4.
  EXPECT_DOUBLE_EQ(*HistogramQuantile(bounds, {50, 0, 50, 0}, 0.99), 2 + 2 * 49.0 / 50);
  // In +Inf's bucket: the largest finite bound.
  EXPECT_DOUBLE_EQ(*HistogramQuantile(bounds, {1, 0, 0, 99}, 0.99), 4);
}

TEST(MetricsTest, ChildrenListsEveryChildMade) {
  Registry registry;
  HistogramFamily& family = registry.AddHistogram("moert_h_seconds", "H.", {"layer"}, {1, 2});
  EXPECT_TRUE(family.children().empty());
  family.WithLabels({"1"}).Observe(0.5);
  family.WithLabels({"0"}).Observe(3);
  const std::vector<const Histogram*> children = family.children();
  ASSERT_EQ(children.size(), 2u);
  EXPECT_EQ(children[0]->snapshot().counts, (std::vector<uint64_t>{0, 0, 1}));  // layer 0
  EXPECT_EQ(children[1]->snapshot().counts, (std::vector<uint64_t>{1, 0, 0}));  // layer 1
}

TEST(MetricsTest, IncrementsFromManyThreadsAreExact) {
  Registry registry;
  CounterFamily& family = registry.AddCounter("moert_n_total", "N.", {"t"});
  Histogram& h = registry.AddHistogram("moert_h", "H.", {}, {0.5}).Get();
  Gauge& g = registry.AddGauge("moert_g", "G.").Get();
  constexpr int kThreads = 8;
  constexpr int kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Children looked up while others update theirs, and one shared by all.
      Counter& own = family.WithLabels({std::to_string(t % 2)});
      for (int i = 0; i < kEach; ++i) {
        own.Increment();
        h.Observe(i % 2 == 0 ? 0.25 : 1.0);
        g.Add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(family.WithLabels({"0"}).value(), uint64_t{kThreads / 2 * kEach});
  EXPECT_EQ(family.WithLabels({"1"}).value(), uint64_t{kThreads / 2 * kEach});
  const Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{kThreads * kEach / 2, kThreads * kEach / 2}));
  EXPECT_EQ(s.sum, 0.625 * kThreads * kEach);  // exact: every partial sum is a dyadic
  EXPECT_EQ(g.value(), double{kThreads * kEach});
}

}  // namespace
}  // namespace moert::telemetry
