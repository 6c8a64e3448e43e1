// Speculative routing and the prefetch of predicted experts.
#include "pipeline/prefetcher.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "telemetry/platform.h"
#include "telemetry/trace.h"

namespace moert::pipeline {

Prefetcher::Prefetcher(experts::ExpertCache* cache, int n_layer, int n_expert, int n_used,
                       int depth, telemetry::Registry* metrics)
    : cache_(cache),
      n_layer_(n_layer),
      n_expert_(n_expert),
      n_used_(std::clamp(n_used, 1, std::max(1, n_expert))),
      depth_(std::max(1, depth)),
      predicted_(static_cast<size_t>(n_layer)),
      has_prediction_(static_cast<size_t>(n_layer), false),
      score_(static_cast<size_t>(n_expert)) {
  if (metrics != nullptr) metrics_.emplace(*metrics);
}

void Prefetcher::BeginStep() {
  std::fill(has_prediction_.begin(), has_prediction_.end(), false);
  const uint64_t now = telemetry::NowNs();
  const uint64_t busy = cache_->loader().stats().busy_ns;
  const uint64_t threads = std::max<uint64_t>(cache_->loader().io_threads(), 1);
  if (step_start_ns_ > 0 && now > step_start_ns_) {
    const double wall = static_cast<double>(now - step_start_ns_) * static_cast<double>(threads);
    gate_.Update(std::min(1.0, static_cast<double>(busy - step_start_busy_ns_) / wall));
  }
  step_start_ns_ = now;
  step_start_busy_ns_ = busy;
}

void Prefetcher::OnRouted(int layer, int64_t n, int slots, const int* experts) {
  if (layer < 0 || layer >= n_layer_ || !has_prediction_[static_cast<size_t>(layer)]) return;
  has_prediction_[static_cast<size_t>(layer)] = false;
  std::vector<bool> used(static_cast<size_t>(n_expert_), false);
  for (int64_t i = 0; i < n * slots; ++i) {
    if (experts[i] >= 0 && experts[i] < n_expert_) used[static_cast<size_t>(experts[i])] = true;
  }
  const std::vector<int>& predicted = predicted_[static_cast<size_t>(layer)];
  const uint64_t chosen = static_cast<uint64_t>(std::count(used.begin(), used.end(), true));
  uint64_t correct = 0;
  for (size_t r = 0; r < predicted.size(); ++r) {
    const bool right = used[static_cast<size_t>(predicted[r])];
    correct += right ? 1 : 0;
    ranks_.Record(static_cast<int>(r), right);
  }
  ++stats_.predictions;
  stats_.predicted += predicted.size();
  stats_.used += chosen;
  stats_.correct += correct;
  if (metrics_) {
    metrics_->predicted.Increment(predicted.size());
    metrics_->chosen.Increment(chosen);
    metrics_->correct.Increment(correct);
  }
}

void Prefetcher::Predict(int layer, const float* logits, int64_t n) {
  if (layer < 0 || layer >= n_layer_ || n <= 0) return;
  std::fill(score_.begin(), score_.end(), 0.0f);
  std::vector<int> order(static_cast<size_t>(n_expert_));
  std::vector<float> p(static_cast<size_t>(n_expert_));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * n_expert_;
    const float max = *std::max_element(l, l + n_expert_);
    double sum = 0;
    for (int e = 0; e < n_expert_; ++e) {
      p[static_cast<size_t>(e)] = std::exp(l[e] - max);
      sum += p[static_cast<size_t>(e)];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n_used_, order.end(),
                      [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int i = 0; i < n_used_; ++i) {
      const size_t e = static_cast<size_t>(order[static_cast<size_t>(i)]);
      // +1 marks a predicted expert even when its probability underflows.
      score_[e] += 1.0f + static_cast<float>(p[e] / sum);
    }
  }
  std::vector<int>& predicted = predicted_[static_cast<size_t>(layer)];
  predicted.clear();
  for (int e = 0; e < n_expert_; ++e) {
    if (score_[static_cast<size_t>(e)] > 0) predicted.push_back(e);
  }
  std::stable_sort(predicted.begin(), predicted.end(), [&](int a, int b) {
    return score_[static_cast<size_t>(a)] > score_[static_cast<size_t>(b)];
  });
  has_prediction_[static_cast<size_t>(layer)] = true;
}

void Prefetcher::Issue(int layer) {
  if (layer < 0 || layer >= n_layer_ || !has_prediction_[static_cast<size_t>(layer)]) return;
  telemetry::TraceInstant("prefetch", "layer", layer);
  const uint64_t capacity = cache_->capacity_experts();
  if (capacity < 2 * static_cast<uint64_t>(n_used_)) {
    telemetry::TraceInstant("prefetch backed off", "layer", layer);
    ++stats_.backed_off;  // no room for two slots: prefetch would evict the current layer's
    return;
  }
  uint64_t cap = capacity / static_cast<uint64_t>(depth_ + 1);
  if (!gate_.open()) {
    // The reads are what the steps wait for: only the leading ranks that are nearly
    // always right (at most a quarter of k) go on top of them.
    ++stats_.io_busy;
    cap = std::min(cap, static_cast<uint64_t>(ranks_.Trusted(n_used_ / 4, 0.9, 16)));
    if (cap == 0) {
      telemetry::TraceInstant("prefetch held back", "layer", layer);
      return;
    }
    telemetry::TraceInstant("prefetch narrowed", "layer", layer);
  }
  uint64_t taken = 0;
  for (int e : predicted_[static_cast<size_t>(layer)]) {
    if (taken >= cap) break;
    ++taken;
    const experts::ExpertCache::PrefetchResult r = cache_->Prefetch(layer, e);
    if (r == experts::ExpertCache::PrefetchResult::kStarted) ++stats_.issued;
    if (r == experts::ExpertCache::PrefetchResult::kBackedOff) {
      telemetry::TraceInstant("prefetch backed off", "layer", layer);
      ++stats_.backed_off;
      return;
    }
  }
}

}  // namespace moert::pipeline
