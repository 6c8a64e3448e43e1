// The metrics registry the runtime's modules publish to, and its Prometheus text
// exposition (format 0.0.4). A family (one metric name) has label names; its children,
// one per tuple of label values, are the cells code updates. Getting a child takes the
// family's lock; updating one afterwards is a relaxed atomic, so a module looks its
// children up once (at construction) and keeps the reference. Figures that already live
// elsewhere may instead be callback families, read when the text is written.
//
// Names follow Prometheus: a `moert_` prefix, base units (seconds, bytes), `_total` on
// counters, no colons. Every function here is thread-safe.
#ifndef MOERT_TELEMETRY_METRICS_H_
#define MOERT_TELEMETRY_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moert::telemetry {

enum class MetricType { kCounter, kGauge, kHistogram };

// A monotonic count. Integer cells keep increments exact and lock-free; a family's divisor
// turns them into the exposed unit (nanoseconds counted, seconds exposed: 1e9).
class Counter {
 public:
  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value);
  void Add(double delta);
  double value() const;

 private:
  std::atomic<uint64_t> bits_{0};  // the double's bits (all zero: 0.0)
};

// Observations counted into fixed buckets (upper bounds, ascending; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  struct Snapshot {
    std::vector<uint64_t> counts;  // per bucket, not cumulative; the last is +Inf's
    double sum = 0;
    uint64_t count() const;
  };
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> sum_bits_{0};
};

// `count` bounds from `start`, each `factor` times the one before.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

// The q-quantile (0 < q < 1) of the observations counted in `counts` (per bucket, the
// last +Inf's) over `bounds`, as Prometheus's histogram_quantile estimates it: linear
// within the bucket that holds it, from 0 for the first bucket; the largest finite
// bound when it falls in +Inf's. nullopt when nothing was counted.
std::optional<double> HistogramQuantile(const std::vector<double>& bounds,
                                        const std::vector<uint64_t>& counts, double q);

// What families share: the name, help, type and label names.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names, double divisor);
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Appends the family's # HELP and # TYPE lines and its samples.
  void Write(std::string* out) const;
  // The value of the child with these label values as the text would show it (a
  // histogram's: its count); nullopt when there is no such child.
  virtual std::optional<double> Read(const std::vector<std::string>& label_values) const = 0;

 protected:
  // One sample line: the family's name + suffix, its labels (plus le= for buckets).
  void WriteSample(std::string* out, std::string_view suffix,
                   const std::vector<std::string>& label_values, std::string_view le,
                   double value) const;
  virtual void WriteSamples(std::string* out) const = 0;
  double divisor() const { return divisor_; }

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const double divisor_;
};

// A family of children of type T (Counter, Gauge or Histogram).
template <typename T>
class Family final : public FamilyBase {
 public:
  // Histogram families pass their bounds; others leave them empty.
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         double divisor, std::vector<double> bounds)
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names), divisor),
        bounds_(std::move(bounds)) {}

  // The child with these label values (one per label name), made on first use. The
  // reference stays valid as long as the registry.
  T& WithLabels(std::initializer_list<std::string_view> values) {
    return WithLabels(std::vector<std::string>(values.begin(), values.end()));
  }
  T& WithLabels(std::vector<std::string> values);
  // The child of a family without labels.
  T& Get() { return WithLabels(std::vector<std::string>{}); }
  // Every child made so far, in label-value order (each valid as long as the registry).
  std::vector<const T*> children() const;
  std::optional<double> Read(const std::vector<std::string>& label_values) const override;

 private:
  void WriteSamples(std::string* out) const override;
  double Exposed(const T& child) const;

  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
};

template <>
void Family<Counter>::WriteSamples(std::string* out) const;
template <>
void Family<Gauge>::WriteSamples(std::string* out) const;
template <>
void Family<Histogram>::WriteSamples(std::string* out) const;
extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// A sample a callback family reports: its label values and value.
struct CallbackSample {
  std::vector<std::string> label_values;
  double value = 0;
};
using MetricsCallback = std::function<std::vector<CallbackSample>()>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The family of this name, made on first use. Asking again with the same type and
  // label names returns the same family (a model loaded again keeps counting); another
  // type or label names is a programmer error (asserts; a detached family in release
  // builds, never exposed). A counter's cells are divided by `divisor` when exposed
  // (1e9: nanoseconds counted, seconds exposed).
  CounterFamily& AddCounter(std::string_view name, std::string_view help,
                            std::vector<std::string> label_names = {}, double divisor = 1);
  GaugeFamily& AddGauge(std::string_view name, std::string_view help,
                        std::vector<std::string> label_names = {});
  HistogramFamily& AddHistogram(std::string_view name, std::string_view help,
                                std::vector<std::string> label_names, std::vector<double> bounds);
  // A family read by calling `callback` when the text is written (kCounter or kGauge);
  // replaces a callback family of the same name. The callback runs on the writing thread
  // and must not call the registry.
  void SetCallback(std::string_view name, std::string_view help, MetricType type,
                   std::vector<std::string> label_names, MetricsCallback callback);
  void RemoveCallback(std::string_view name);

  // Every family in name order, children in label-value order: the Prometheus text
  // exposition format 0.0.4.
  std::string PrometheusText() const;
  // One child's value as the text shows it (a histogram's count); nullopt when the
  // family or child does not exist.
  std::optional<double> Read(std::string_view name,
                             const std::vector<std::string>& label_values = {}) const;

 private:
  template <typename T>
  Family<T>& Add(std::string_view name, std::string_view help, MetricType type,
                 std::vector<std::string> label_names, double divisor, std::vector<double> bounds);

  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<FamilyBase>, std::less<>> families_;
  std::vector<std::unique_ptr<FamilyBase>> detached_;  // misuse in release builds
};

// Prometheus text escaping of a label value (\, ", newline) and of help text (\, newline).
std::string EscapeLabelValue(std::string_view value);
std::string EscapeHelp(std::string_view help);
// A sample value as the text format writes it: shortest round-trip decimal, +Inf, -Inf, NaN.
std::string FormatValue(double value);

}  // namespace moert::telemetry

#endif  // MOERT_TELEMETRY_METRICS_H_
