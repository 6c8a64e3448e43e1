// The degrade policy's rule parser, default rules, evaluation, cooldowns and latch.
#include "pipeline/degrade_policy.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "telemetry/platform.h"

namespace moert::pipeline {
namespace {

constexpr size_t kKeptEvents = 64;  // events() keeps the newest this many

struct ActionName {
  DegradeAction action;
  const char* name;
};
constexpr ActionName kActionNames[] = {
    {DegradeAction::kDefragment, "defragment"},
    {DegradeAction::kReduceTopK, "reduce_top_k"},
    {DegradeAction::kShrinkPool, "shrink_pool"},
    {DegradeAction::kShorterContext, "shorter_context"},
    {DegradeAction::kCpuBackend, "cpu_backend"},
    {DegradeAction::kDenseFallback, "dense_fallback"},
};

// Actions a recover can take back (DegradeActuator::Undo).
bool CanUndo(DegradeAction action) {
  return action != DegradeAction::kDefragment && action != DegradeAction::kCpuBackend;
}

const char* ComparisonName(Comparison c) {
  switch (c) {
    case Comparison::kGreater:
      return ">";
    case Comparison::kGreaterEqual:
      return ">=";
    case Comparison::kLess:
      return "<";
    case Comparison::kLessEqual:
      return "<=";
  }
  return "?";
}

bool Holds(Comparison c, double value, double bound) {
  switch (c) {
    case Comparison::kGreater:
      return value > bound;
    case Comparison::kGreaterEqual:
      return value >= bound;
    case Comparison::kLess:
      return value < bound;
    case Comparison::kLessEqual:
      return value <= bound;
  }
  return false;
}

std::optional<double> ParseNumber(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool IsMetricName(const std::string& s) {
  if (s.empty()) return false;
  const char c = s[0];
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

// w[i] is "cooldown" or "recover": its count and unit, into *steps or *ns.
absl::Status ParseDuration(const std::vector<std::string>& w, size_t i, int64_t* steps,
                           uint64_t* ns) {
  const std::string& what = w[i];
  if (i + 2 >= w.size()) {
    return absl::InvalidArgumentError(
        StrCat(what, " needs a count and a unit (steps, s or ms)"));
  }
  const std::optional<double> n = ParseNumber(w[i + 1]);
  if (!n || *n < 0 || *n > 1e12) {
    return absl::InvalidArgumentError(
        StrCat("the ", what, " \"", w[i + 1], "\" is not a number in [0, 1e12]"));
  }
  const std::string& unit = w[i + 2];
  if (unit == "steps" || unit == "step") {
    if (*n != std::floor(*n)) {
      return absl::InvalidArgumentError(StrCat("a ", what, " in steps must be whole, got ", *n));
    }
    *steps = static_cast<int64_t>(*n);
  } else if (unit == "s") {
    *ns = static_cast<uint64_t>(*n * 1e9);
  } else if (unit == "ms") {
    *ns = static_cast<uint64_t>(*n * 1e6);
  } else {
    return absl::InvalidArgumentError(
        StrCat("unknown ", what, " unit \"", unit, "\" (expected steps, s or ms)"));
  }
  return absl::OkStatus();
}

// One rule line's words (comment already stripped) -> a rule; errors say what, the
// caller adds where.
absl::StatusOr<DegradeRule> ParseRuleWords(const std::vector<std::string>& w) {
  if (w.size() < 5) {
    return absl::InvalidArgumentError(
        "expected METRIC OP BOUND -> ACTION [cooldown N steps|s|ms] [recover N steps|s|ms] "
        "[reason NAME]");
  }
  DegradeRule rule;
  if (!IsMetricName(w[0])) {
    return absl::InvalidArgumentError(StrCat("\"", w[0], "\" is not a metric name"));
  }
  rule.metric = w[0];
  if (w[1] == ">") {
    rule.comparison = Comparison::kGreater;
  } else if (w[1] == ">=") {
    rule.comparison = Comparison::kGreaterEqual;
  } else if (w[1] == "<") {
    rule.comparison = Comparison::kLess;
  } else if (w[1] == "<=") {
    rule.comparison = Comparison::kLessEqual;
  } else {
    return absl::InvalidArgumentError(
        StrCat("unknown comparison \"", w[1], "\" (expected >, >=, < or <=)"));
  }
  if (std::optional<double> number = ParseNumber(w[2])) {
    rule.bound = *number;
  } else if (IsMetricName(w[2])) {
    rule.bound_metric = w[2];
  } else {
    return absl::InvalidArgumentError(
        StrCat("the bound \"", w[2], "\" is neither a finite number nor a metric name"));
  }
  if (w[3] != "->") {
    return absl::InvalidArgumentError(StrCat("expected -> after the bound, got \"", w[3], "\""));
  }
  absl::StatusOr<DegradeAction> action = ParseDegradeAction(w[4]);
  if (!action.ok()) return action.status();
  rule.action = *action;
  for (size_t i = 5; i < w.size();) {
    if (w[i] == "cooldown" || w[i] == "recover") {
      const bool cooldown = w[i] == "cooldown";
      MOERT_RETURN_IF_ERROR(ParseDuration(w, i, cooldown ? &rule.cooldown_steps : &rule.recover_steps,
                                          cooldown ? &rule.cooldown_ns : &rule.recover_ns));
      i += 3;
    } else if (w[i] == "reason") {
      if (i + 1 >= w.size()) return absl::InvalidArgumentError("reason needs a name");
      rule.reason = w[i + 1];
      i += 2;
    } else {
      return absl::InvalidArgumentError(
          StrCat("unexpected \"", w[i], "\" after the action (expected cooldown, recover or reason)"));
    }
  }
  if (rule.recovers() && !CanUndo(rule.action)) {
    return absl::InvalidArgumentError(
        StrCat(DegradeActionName(rule.action), " cannot be undone: a recover on it has no effect"));
  }
  return rule;
}

constexpr char kDefaultRules[] =
    "# The default degrade rules (docs/degrade.md).\n"
    "moert_pool_fragmentation_ratio > 0.4 -> defragment cooldown 32 steps reason fragmentation\n"
    "moert_cpu_temperature_celsius > moert_cpu_temperature_limit_celsius -> reduce_top_k "
    "cooldown 30 s recover 30 s reason thermal\n"
    "moert_router_latency_seconds{quantile=\"0.99\"} > 0.002 -> dense_fallback cooldown 64 steps "
    "recover 512 steps reason router_latency\n"
    "moert_stall_seconds_per_token > 0.05 -> dense_fallback cooldown 64 steps recover 512 steps "
    "reason stall\n";

}  // namespace

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kExhausted:
      return "exhausted";
    case FailureKind::kIoError:
      return "io_error";
    case FailureKind::kTimeout:
      return "timeout";
    case FailureKind::kDeviceLost:
      return "device_lost";
  }
  return "unknown";
}

std::optional<FailureKind> ClassifyFailure(const absl::Status& status, bool on_device) {
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
      return FailureKind::kExhausted;
    case absl::StatusCode::kDataLoss:
      return FailureKind::kIoError;
    case absl::StatusCode::kUnavailable:
      return on_device ? FailureKind::kDeviceLost : FailureKind::kIoError;
    case absl::StatusCode::kDeadlineExceeded:
      return FailureKind::kTimeout;
    default:
      return std::nullopt;
  }
}

const std::vector<DegradeAction>& DegradePolicyOptions::RetryOrder(FailureKind kind) const {
  switch (kind) {
    case FailureKind::kExhausted:
      return retry_exhausted;
    case FailureKind::kIoError:
      return retry_io_error;
    case FailureKind::kTimeout:
      return retry_timeout;
    case FailureKind::kDeviceLost:
      break;
  }
  return retry_device_lost;
}

std::optional<double> MetricSnapshot::Value(std::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

const char* DegradeActionName(DegradeAction action) {
  for (const ActionName& a : kActionNames) {
    if (a.action == action) return a.name;
  }
  return "unknown";
}

absl::StatusOr<DegradeAction> ParseDegradeAction(std::string_view name) {
  std::string choices;
  for (const ActionName& a : kActionNames) {
    if (name == a.name) return a.action;
    StrAppend(&choices, choices.empty() ? "" : ", ", a.name);
  }
  return absl::InvalidArgumentError(
      StrCat("unknown degrade action \"", name, "\" (expected one of ", choices, ")"));
}

std::string RuleReason(const DegradeRule& rule) {
  return rule.reason.empty() ? std::string(DegradeActionName(rule.action)) : rule.reason;
}

absl::StatusOr<std::vector<DegradeRule>> ParseDegradeRules(std::string_view text,
                                                           std::string_view source) {
  std::vector<DegradeRule> rules;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words_in(line);
    std::vector<std::string> words;
    for (std::string word; words_in >> word;) words.push_back(std::move(word));
    if (words.empty()) continue;
    absl::StatusOr<DegradeRule> rule = ParseRuleWords(words);
    if (!rule.ok()) {
      return absl::InvalidArgumentError(StrCat(source, ":", number, ": ", rule.status().message()));
    }
    rules.push_back(std::move(*rule));
  }
  return rules;
}

absl::StatusOr<std::vector<DegradeRule>> ReadDegradeRulesFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(StrCat("cannot read the degrade rules file ", path));
  std::ostringstream text;
  text << file.rdbuf();
  return ParseDegradeRules(text.str(), path);
}

std::string_view DefaultDegradeRulesText() { return kDefaultRules; }

std::vector<DegradeRule> DefaultDegradeRules() {
  // The defaults are tested to parse (pipeline_test), so a failure here is a bug.
  absl::StatusOr<std::vector<DegradeRule>> rules = ParseDegradeRules(kDefaultRules, "defaults");
  return rules.ok() ? *std::move(rules) : std::vector<DegradeRule>();
}

absl::Status ValidateDegradePolicyOptions(const DegradePolicyOptions& options) {
  if (options.latch_degrades < 0) {
    return absl::InvalidArgumentError(
        StrCat("degrade latch_degrades must be >= 0 (0: never), got ", options.latch_degrades));
  }
  if (options.latch_window_steps < 1) {
    return absl::InvalidArgumentError(
        StrCat("degrade latch_window_steps must be >= 1, got ", options.latch_window_steps));
  }
  for (size_t i = 0; i < options.rules.size(); ++i) {
    const DegradeRule& r = options.rules[i];
    if (!IsMetricName(r.metric) || (!r.bound_metric.empty() && !IsMetricName(r.bound_metric)) ||
        !std::isfinite(r.bound) || r.cooldown_steps < 0 || r.recover_steps < 0) {
      return absl::InvalidArgumentError(
          StrCat("degrade rule ", i, " (", r.metric, " -> ", DegradeActionName(r.action),
                 ") needs metric names, a finite bound, a cooldown and a recover >= 0"));
    }
    if (r.recovers() && !CanUndo(r.action)) {
      return absl::InvalidArgumentError(StrCat("degrade rule ", i, ": ", DegradeActionName(r.action),
                                               " cannot be undone, so it takes no recover"));
    }
  }
  return absl::OkStatus();
}

absl::Status DegradeActuator::Undo(DegradeAction action) {
  return absl::FailedPreconditionError(
      StrCat(DegradeActionName(action), ": this actuator undoes nothing"));
}

DegradePolicy::DegradePolicy(DegradePolicyOptions options)
    : options_(std::move(options)),
      last_(options_.rules.size()),
      recovery_(options_.rules.size()) {}

std::optional<DegradeEvent> DegradePolicy::Recover(size_t rule, int64_t step, uint64_t now_ns,
                                                   DegradeActuator& actuator) {
  RuleRecovery& r = recovery_[rule];
  if (!r.clear) {
    r.clear = true;
    r.step = step;
    r.ns = now_ns;
    return std::nullopt;
  }
  const DegradeRule& d = options_.rules[rule];
  if (r.applied == 0 || r.gave_up || !d.recovers()) return std::nullopt;
  if (step - r.step < d.recover_steps || now_ns - r.ns < d.recover_ns) return std::nullopt;
  DegradeEvent event;
  event.step = step;
  event.reason = RuleReason(d);
  event.action = d.action;
  event.undo = true;
  event.status = actuator.Undo(d.action);
  if (event.status.ok()) {
    --r.applied;
    ++counters_.undone;
  } else {
    r.gave_up = true;
  }
  r.step = step;  // the next undo waits as long again
  r.ns = now_ns;
  telemetry::Log(event.status.ok() ? telemetry::LogLevel::kInfo : telemetry::LogLevel::kWarning,
                 StrCat("degrade policy: step ", step, ": ", d.metric, " clear for its recover -> undo ",
                        DegradeActionName(d.action), " (", event.reason, "): ",
                        event.status.ok() ? std::string("undone")
                                          : std::string(event.status.message())));
  return event;
}

void DegradePolicy::Keep(const DegradeEvent& event) {
  events_.push_back(event);
  if (events_.size() > kKeptEvents) events_.erase(events_.begin());
}

bool DegradePolicy::CoolingDown(size_t rule, int64_t step, uint64_t now_ns) const {
  const LastFiring& last = last_[rule];
  if (!last.fired) return false;
  const DegradeRule& r = options_.rules[rule];
  if (r.cooldown_steps > 0 && step - last.step < r.cooldown_steps) return true;
  if (r.cooldown_ns > 0 && now_ns - last.ns < r.cooldown_ns) return true;
  return false;
}

void DegradePolicy::CountTowardLatch(int64_t step) {
  recent_.push_back(step);
  const int64_t window = options_.latch_window_steps;
  std::erase_if(recent_, [&](int64_t s) { return step - s >= window; });
  if (options_.latch_degrades > 0 && !latched_ &&
      recent_.size() > static_cast<size_t>(options_.latch_degrades)) {
    latched_ = true;
    latch_reason_ = StrCat("stays degraded for the session: ", recent_.size(), " degrades within ",
                           window, " steps (more than ", options_.latch_degrades, ")");
    telemetry::Log(telemetry::LogLevel::kWarning, StrCat("degrade policy: ", latch_reason_));
  }
}

void DegradePolicy::NoteDegrade(int64_t step, std::string_view reason) {
  ++counters_.fired;
  ++counters_.fired_by_reason[std::string(reason)];
  CountTowardLatch(step);
}

std::vector<DegradeEvent> DegradePolicy::Step(int64_t step, const MetricSource& metrics,
                                              DegradeActuator& actuator) {
  std::vector<DegradeEvent> fired;
  if (latched_) return fired;
  ++counters_.steps;
  const uint64_t now_ns = telemetry::NowNs();
  for (size_t i = 0; i < options_.rules.size() && !latched_; ++i) {
    const DegradeRule& rule = options_.rules[i];
    const std::optional<double> value = metrics.Value(rule.metric);
    std::optional<double> bound = rule.bound;
    if (!rule.bound_metric.empty()) bound = metrics.Value(rule.bound_metric);
    if (!value || !bound) {
      recovery_[i].clear = false;  // clear means known and false
      continue;
    }
    if (!Holds(rule.comparison, *value, *bound)) {
      if (std::optional<DegradeEvent> undo = Recover(i, step, now_ns, actuator)) {
        Keep(*undo);
        fired.push_back(*std::move(undo));
      }
      continue;
    }
    recovery_[i].clear = false;
    if (CoolingDown(i, step, now_ns)) continue;
    last_[i] = {true, step, now_ns};
    DegradeEvent event;
    event.step = step;
    event.reason = RuleReason(rule);
    event.action = rule.action;
    event.value = *value;
    event.bound = *bound;
    event.status = actuator.Apply(rule.action);
    if (!event.status.ok()) ++counters_.failed;
    telemetry::Log(
        event.status.ok() ? telemetry::LogLevel::kInfo : telemetry::LogLevel::kWarning,
        StrCat("degrade policy: step ", step, ": ", rule.metric, " = ", *value, " ",
               ComparisonName(rule.comparison), " ", *bound, " -> ", DegradeActionName(rule.action),
               " (", event.reason, "): ",
               event.status.ok() ? std::string("applied") : std::string(event.status.message())));
    // Only an applied action is a degrade the latch counts.
    ++counters_.fired;
    ++counters_.fired_by_reason[event.reason];
    if (event.status.ok()) {
      CountTowardLatch(step);
      ++recovery_[i].applied;
    }
    Keep(event);
    fired.push_back(std::move(event));
  }
  return fired;
}

}  // namespace moert::pipeline
