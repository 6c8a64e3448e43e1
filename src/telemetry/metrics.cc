// The registry's cells and its Prometheus text writer.
#include "telemetry/metrics.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <charconv>
#include <cmath>
#include <utility>

#include "core/strings.h"

namespace moert::telemetry {
namespace {

double FromBits(uint64_t bits) { return std::bit_cast<double>(bits); }
uint64_t ToBits(double value) { return std::bit_cast<uint64_t>(value); }

// Adds to a double kept as bits in an atomic (no fetch_add for doubles before C++20's
// atomic<double>, which not every standard library has lock-free).
void AddToBits(std::atomic<uint64_t>& bits, double delta) {
  uint64_t old = bits.load(std::memory_order_relaxed);
  while (
      !bits.compare_exchange_weak(old, ToBits(FromBits(old) + delta), std::memory_order_relaxed)) {
  }
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool ValidName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// A family whose samples a callback reports when the text is written.
class CallbackFamily final : public FamilyBase {
 public:
  CallbackFamily(std::string name, std::string help, MetricType type,
                 std::vector<std::string> label_names, MetricsCallback callback)
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names), 1),
        callback_(std::move(callback)) {}

  std::optional<double> Read(const std::vector<std::string>& label_values) const override {
    for (const CallbackSample& s : callback_()) {
      if (s.label_values == label_values) return s.value;
    }
    return std::nullopt;
  }

 private:
  void WriteSamples(std::string* out) const override {
    std::vector<CallbackSample> samples = callback_();
    std::sort(samples.begin(), samples.end(), [](const CallbackSample& a, const CallbackSample& b) {
      return a.label_values < b.label_values;
    });
    for (const CallbackSample& s : samples) {
      if (s.label_values.size() != label_names().size()) continue;  // the callback's bug
      WriteSample(out, "", s.label_values, {}, s.value);
    }
  }

  MetricsCallback callback_;
};

}  // namespace

void Gauge::Set(double value) { bits_.store(ToBits(value), std::memory_order_relaxed); }
void Gauge::Add(double delta) { AddToBits(bits_, delta); }
double Gauge::value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // Few buckets: a linear scan beats a binary search's branches.
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AddToBits(sum_bits_, value);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i < s.counts.size(); ++i)
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  s.sum = FromBits(sum_bits_.load(std::memory_order_relaxed));
  return s;
}

uint64_t Histogram::Snapshot::count() const {
  uint64_t n = 0;
  for (uint64_t c : counts) n += c;
  return n;
}

std::optional<double> HistogramQuantile(const std::vector<double>& bounds,
                                        const std::vector<uint64_t>& counts, double q) {
  uint64_t total = 0;
  for (uint64_t n : counts) total += n;
  if (total == 0 || bounds.empty()) return std::nullopt;
  const double rank = q * static_cast<double>(total);
  uint64_t below = 0;  // observations in the buckets before i
  for (size_t i = 0; i < counts.size(); ++i) {
    if (static_cast<double>(below + counts[i]) < rank) {
      below += counts[i];
      continue;
    }
    if (i >= bounds.size()) break;  // +Inf's bucket
    const double lower = i == 0 ? 0.0 : bounds[i - 1];
    const double within = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
    return lower + (bounds[i] - lower) * within;
  }
  return bounds.back();
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

namespace {

// Help text escapes backslash and newline; a label value the double quote as well.
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\' || (quote && c == '"')) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) { return Escape(value, /*quote=*/true); }
std::string EscapeHelp(std::string_view help) { return Escape(help, /*quote=*/false); }

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, result.ptr);
}

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names, double divisor)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      divisor_(divisor) {}

void FamilyBase::Write(std::string* out) const {
  StrAppend(out, "# HELP ", name_, " ", EscapeHelp(help_), "\n# TYPE ", name_, " ", TypeName(type_),
            "\n");
  WriteSamples(out);
}

void FamilyBase::WriteSample(std::string* out, std::string_view suffix,
                             const std::vector<std::string>& label_values, std::string_view le,
                             double value) const {
  StrAppend(out, name_, suffix);
  if (!label_values.empty() || !le.empty()) {
    *out += '{';
    for (size_t i = 0; i < label_values.size(); ++i) {
      if (i > 0) *out += ',';
      StrAppend(out, label_names_[i], "=\"", EscapeLabelValue(label_values[i]), "\"");
    }
    if (!le.empty()) StrAppend(out, label_values.empty() ? "" : ",", "le=\"", le, "\"");
    *out += '}';
  }
  StrAppend(out, " ", FormatValue(value), "\n");
}

template <typename T>
T& Family<T>::WithLabels(std::vector<std::string> values) {
  assert(values.size() == label_names().size());
  values.resize(label_names().size());
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = children_.find(values);
  if (it == children_.end()) {
    std::unique_ptr<T> child;
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<T>(bounds_);
    } else {
      child = std::make_unique<T>();
    }
    it = children_.emplace(std::move(values), std::move(child)).first;
  }
  return *it->second;
}

template <typename T>
std::vector<const T*> Family<T>::children() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<const T*> out;
  out.reserve(children_.size());
  for (const auto& [values, child] : children_) out.push_back(child.get());
  return out;
}

template <typename T>
double Family<T>::Exposed(const T& child) const {
  if constexpr (std::is_same_v<T, Counter>) {
    return static_cast<double>(child.value()) / divisor();
  } else if constexpr (std::is_same_v<T, Gauge>) {
    return child.value();
  } else {
    return static_cast<double>(child.snapshot().count());
  }
}

template <typename T>
std::optional<double> Family<T>::Read(const std::vector<std::string>& label_values) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = children_.find(label_values);
  if (it == children_.end()) return std::nullopt;
  return Exposed(*it->second);
}

template <>
void Family<Counter>::WriteSamples(std::string* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [values, child] : children_) WriteSample(out, "", values, {}, Exposed(*child));
}

template <>
void Family<Gauge>::WriteSamples(std::string* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [values, child] : children_) WriteSample(out, "", values, {}, Exposed(*child));
}

template <>
void Family<Histogram>::WriteSamples(std::string* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [values, child] : children_) {
    const Histogram::Snapshot s = child->snapshot();
    // _count is the buckets' total, so it equals the +Inf bucket even while observations
    // land during the read.
    uint64_t cumulative = 0;
    for (size_t i = 0; i < s.counts.size(); ++i) {
      cumulative += s.counts[i];
      const std::string le = i < bounds_.size() ? FormatValue(bounds_[i]) : "+Inf";
      WriteSample(out, "_bucket", values, le, static_cast<double>(cumulative));
    }
    WriteSample(out, "_sum", values, {}, s.sum);
    WriteSample(out, "_count", values, {}, static_cast<double>(cumulative));
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

template <typename T>
Family<T>& Registry::Add(std::string_view name, std::string_view help, MetricType type,
                         std::vector<std::string> label_names, double divisor,
                         std::vector<double> bounds) {
  assert(ValidName(name));
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    auto* family = dynamic_cast<Family<T>*>(it->second.get());
    if (family != nullptr && family->type() == type && family->label_names() == label_names) {
      return *family;
    }
    assert(false && "a metric registered again with another type or labels");
  } else if (ValidName(name)) {
    auto family = std::make_unique<Family<T>>(std::string(name), std::string(help), type,
                                              std::move(label_names), divisor, std::move(bounds));
    Family<T>& ref = *family;
    families_.emplace(std::string(name), std::move(family));
    return ref;
  }
  auto family = std::make_unique<Family<T>>(std::string(name), std::string(help), type,
                                            std::move(label_names), divisor, std::move(bounds));
  Family<T>& ref = *family;
  detached_.push_back(std::move(family));
  return ref;
}

CounterFamily& Registry::AddCounter(std::string_view name, std::string_view help,
                                    std::vector<std::string> label_names, double divisor) {
  return Add<Counter>(name, help, MetricType::kCounter, std::move(label_names), divisor, {});
}

GaugeFamily& Registry::AddGauge(std::string_view name, std::string_view help,
                                std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, MetricType::kGauge, std::move(label_names), 1, {});
}

HistogramFamily& Registry::AddHistogram(std::string_view name, std::string_view help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds) {
  assert(std::is_sorted(bounds.begin(), bounds.end()));
  return Add<Histogram>(name, help, MetricType::kHistogram, std::move(label_names), 1,
                        std::move(bounds));
}

void Registry::SetCallback(std::string_view name, std::string_view help, MetricType type,
                           std::vector<std::string> label_names, MetricsCallback callback) {
  assert(ValidName(name) && type != MetricType::kHistogram);
  auto family = std::make_unique<CallbackFamily>(std::string(name), std::string(help), type,
                                                 std::move(label_names), std::move(callback));
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    families_.emplace(std::string(name), std::move(family));
  } else if (dynamic_cast<CallbackFamily*>(it->second.get()) != nullptr) {
    it->second = std::move(family);
  } else {
    assert(false && "a callback named like a family with cells");
  }
}

void Registry::RemoveCallback(std::string_view name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = families_.find(name);
  if (it != families_.end() && dynamic_cast<CallbackFamily*>(it->second.get()) != nullptr) {
    families_.erase(it);
  }
}

std::optional<double> Registry::Read(std::string_view name,
                                     const std::vector<std::string>& label_values) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = families_.find(name);
  if (it == families_.end()) return std::nullopt;
  return it->second->Read(label_values);
}

std::string Registry::PrometheusText() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, family] : families_) family->Write(&out);
  return out;
}

}  // namespace moert::telemetry
