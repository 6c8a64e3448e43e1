// The degrade policy's metrics over a model's stats and its actions on the model.
#include "runtime/degrade_actions.h"

#include <algorithm>
#include <optional>

#include "core/status.h"
#include "core/strings.h"
#include "memory/budget.h"
#include "router/resource_monitor.h"
#include "router/router.h"
#include "telemetry/runtime_metrics.h"

namespace moert::runtime {

const pipeline::MetricSource& ModelMetrics::Read(int64_t tokens) {
  snapshot_ = pipeline::MetricSnapshot();
  const model::MemoryStats memory = model_->memory_stats();
  if (memory.expert_pool) {
    snapshot_.Set(pipeline::kPoolFragmentationMetric, memory.pool.fragmentation);
    if (have_stall_ && tokens > 0) {
      snapshot_.Set(pipeline::kStallPerTokenMetric,
                    static_cast<double>(memory.pool.stall_ns - stall_ns_) / 1e9 /
                        static_cast<double>(tokens));
    }
    have_stall_ = true;
    stall_ns_ = memory.pool.stall_ns;
  }
  if (router::ResourceMonitor* monitor = model_->resource_monitor(); monitor != nullptr) {
    if (const std::optional<float> t = monitor->TemperatureC()) {
      snapshot_.Set(pipeline::kCpuTemperatureMetric, *t);
    }
    if (monitor->options().thermal_limit_c > 0) {
      snapshot_.Set(pipeline::kCpuTemperatureLimitMetric, monitor->options().thermal_limit_c);
    }
  }
  ReadRouterLatency(tokens);
  return snapshot_;
}

void ModelMetrics::ReadRouterLatency(int64_t tokens) {
  if (registry_ == nullptr) return;
  std::vector<uint64_t> now = telemetry::RouterLatencyCounts(*registry_);
  if (latency_counts_.size() == now.size() && tokens == 1) {
    std::vector<uint64_t> step(now.size());
    for (size_t i = 0; i < now.size(); ++i) step[i] = now[i] - latency_counts_[i];
    latency_steps_.push_back(std::move(step));
    if (latency_steps_.size() > kLatencyWindowSteps) latency_steps_.pop_front();
  }
  latency_counts_ = std::move(now);
  std::vector<uint64_t> window(latency_counts_.size(), 0);
  for (const std::vector<uint64_t>& step : latency_steps_) {
    for (size_t i = 0; i < window.size(); ++i) window[i] += step[i];
  }
  if (const std::optional<double> p99 =
          telemetry::HistogramQuantile(telemetry::RouterLatencyBounds(), window, 0.99)) {
    snapshot_.Set(pipeline::kRouterLatencyP99Metric, *p99);
  }
}

bool ModelActuator::on_device() const { return model_->backend_stats().backend != "CPU"; }

absl::Status ModelActuator::ReduceTopK() {
  router::Router* router = model_->router();
  if (router == nullptr) {
    return absl::FailedPreconditionError(
        "reduce_top_k: the model has no router (a dense model, or reference routing)");
  }
  router::RouterOptions options = router->options();
  const int model_k = static_cast<int>(model_->spec().n_expert_used);
  const int k = options.dynamic_k_p > 0 && options.k_max > 0 ? options.k_max : model_k;
  if (k - options.k_reduction <= 1) {
    return absl::FailedPreconditionError(
        StrCat("reduce_top_k: every token already takes one expert (the model's k is ", k, ")"));
  }
  ++options.k_reduction;
  router->set_options(options);
  return absl::OkStatus();
}

absl::Status ModelActuator::ShrinkPool() {
  memory::MemoryBudget* budget = model_->budget();
  if (budget == nullptr || !model_->memory_stats().expert_pool) {
    return absl::FailedPreconditionError("shrink_pool: the model has no expert pool");
  }
  const memory::BudgetStats before = budget->stats();
  budget->Trim(before.trim_fraction / 2);
  if (budget->pool_target() >= before.pool_bytes) {
    budget->Trim(before.trim_fraction);
    return absl::FailedPreconditionError(
        StrCat("shrink_pool: the expert pool is at its floor (", before.pool_bytes, " bytes)"));
  }
  model_->ApplyMemoryLimits(/*drop_unused=*/false);
  return absl::OkStatus();
}

absl::Status ModelActuator::Apply(pipeline::DegradeAction action) {
  MOERT_RETURN_IF_ERROR(ApplyOnce(action));
  const bool lasting = action != pipeline::DegradeAction::kDefragment &&
                       action != pipeline::DegradeAction::kShorterContext;
  if (lasting && in_force_ != nullptr) in_force_->push_back(pipeline::DegradeActionName(action));
  return absl::OkStatus();
}

size_t ModelActuator::Release(pipeline::DegradeAction action) {
  if (in_force_ == nullptr) return 0;
  const std::string name = pipeline::DegradeActionName(action);
  if (auto it = std::find(in_force_->begin(), in_force_->end(), name); it != in_force_->end()) {
    in_force_->erase(it);
  }
  return static_cast<size_t>(std::count(in_force_->begin(), in_force_->end(), name));
}

absl::Status ModelActuator::Undo(pipeline::DegradeAction action) {
  switch (action) {
    case pipeline::DegradeAction::kReduceTopK: {
      router::Router* router = model_->router();
      if (router == nullptr || router->options().k_reduction == 0) {
        return absl::FailedPreconditionError("reduce_top_k: no reduction of k to undo");
      }
      router::RouterOptions options = router->options();
      --options.k_reduction;
      router->set_options(options);
      Release(action);
      return absl::OkStatus();
    }
    case pipeline::DegradeAction::kShrinkPool: {
      memory::MemoryBudget* budget = model_->budget();
      const double trim = budget == nullptr ? 1 : budget->stats().trim_fraction;
      if (trim >= 1) return absl::FailedPreconditionError("shrink_pool: the expert pool is not shrunk");
      budget->Trim(std::min(1.0, trim * 2));
      model_->ApplyMemoryLimits(/*drop_unused=*/false);
      Release(action);
      return absl::OkStatus();
    }
    case pipeline::DegradeAction::kShorterContext:
      if (!shorten_context_) {
        return absl::FailedPreconditionError("shorter_context: no session to lengthen");
      }
      return shorten_context_(/*longer=*/true);
    case pipeline::DegradeAction::kDenseFallback:
      if (!model_->has_dense_fallback()) {
        return absl::FailedPreconditionError("dense_fallback: the model has none to leave");
      }
      // Another rule's (or session's) application still holds it: only the count drops.
      if (Release(action) > 0) return absl::OkStatus();
      return model_->SetDenseFallback(false);
    case pipeline::DegradeAction::kDefragment:
      return absl::FailedPreconditionError("defragment: a compaction has nothing to undo");
    case pipeline::DegradeAction::kCpuBackend:
      return absl::FailedPreconditionError(
          "cpu_backend: the OpenCL device, once given up, stays given up for the model's life");
  }
  return absl::InvalidArgumentError("unknown degrade action");
}

absl::Status ModelActuator::ApplyOnce(pipeline::DegradeAction action) {
  switch (action) {
    case pipeline::DegradeAction::kDefragment:
      return model_->Defragment();
    case pipeline::DegradeAction::kReduceTopK:
      return ReduceTopK();
    case pipeline::DegradeAction::kShrinkPool:
      return ShrinkPool();
    case pipeline::DegradeAction::kShorterContext:
      if (!shorten_context_) {
        return absl::FailedPreconditionError("shorter_context: no session to shorten");
      }
      return shorten_context_(/*longer=*/false);
    case pipeline::DegradeAction::kCpuBackend:
      return model_->UseCpuBackend("the degrade policy chose the CPU");
    case pipeline::DegradeAction::kDenseFallback:
      return model_->SetDenseFallback(true);
  }
  return absl::InvalidArgumentError("unknown degrade action");
}

}  // namespace moert::runtime
