// Prefetch of predicted experts (the ping-pong pipeline): while layer L's experts
// compute, the loader reads the experts layer L + depth will need, as predicted by
// applying that layer's router to layer L's feed-forward input (speculative routing).
//
// The model computes the predicted layer's gate logits from layer L's input and hands
// them to Predict; the top-k experts of every token (their union for a batch: prefill
// streams experts layer by layer) are the prediction, most probable first (summed
// routing probability over the batch). Issue starts the loads of the predicted experts
// that are not resident (ExpertCache::Prefetch, which never evicts what is pinned or in
// use) once layer L's experts are pinned. When the layer reaches its routing, OnRouted
// scores the prediction against the experts really chosen: precision (predicted and
// used / predicted) and recall (predicted and used / used).
//
// Two slots: a layer's experts are computing while the next one's are filling, so the
// pool must hold twice a token's k experts; below that, prefetch backs off entirely
// (counted) rather than evict what the current layer is about to use. A batch's union
// is capped at the pool's share of one slot (capacity / (depth + 1)).
//
// A wrong prediction costs a load at the layer (and a wasted read, unless the read had
// not started: the model then cancels it when the layer routes elsewhere), never a
// different output: the experts computed are the ones the router chose.
//
// Speculation narrowed while the reads are busy (SpeculationGate): when the loader's
// threads were busy for most of the last step, the disk is what a token waits for, and
// a wrong prediction (about a quarter of them) only adds bytes to it. Issue then keeps
// to the leading ranks whose predictions have been nearly always right (RankPrecision:
// at least 90% over their scored predictions; the top two of eight on the OLMoE-shaped
// router, none under uniform routing), at most k / 4 of them, which fill the reads' idle
// gap between two layers' misses (counted: io_busy), until the reads leave room again.
// The misses of a layer still stream (the MoE scheduler's StartLoad), which is where
// most of prefetch's gain lies on a slow disk.
//
// The other half of the pipeline is the MoE scheduler (pipeline/moe_scheduler.h,
// RunPooledHost): with prefetch on, a layer's misses all start loading at once
// (ExpertCache::StartLoad, ahead of the prefetches) and each expert computes as soon as
// its weights are in, while the ones after it still load.
//
// Not thread-safe: the model's forward pass (the expert cache's owner) calls it.
#ifndef MOERT_PIPELINE_PREFETCHER_H_
#define MOERT_PIPELINE_PREFETCHER_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "experts/expert_cache.h"
#include "telemetry/runtime_metrics.h"

namespace moert::pipeline {

struct PrefetchStats {
  uint64_t predictions = 0;  // (layer, step) predictions scored
  uint64_t predicted = 0;    // experts predicted, over scored predictions
  uint64_t correct = 0;      // of those, chosen by the router at the layer
  uint64_t used = 0;         // experts the router chose at scored layers
  uint64_t issued = 0;       // prefetch loads started
  uint64_t backed_off = 0;   // layers whose prefetch stopped: pool too small for two
                             // slots, or no block the cache would give
  uint64_t io_busy = 0;      // layers whose prefetch the busy reads narrowed to its top
                             // ranks (or held back, for k < 4)

  double precision() const {
    return predicted == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(predicted);
  }
  double recall() const {
    return used == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(used);
  }
};

// Whether speculative loads may go out, from how busy the loader's threads were over
// the last step (busy time / (wall time * threads), in [0, 1]): closed at close_at and
// above, open again only below open_below (hysteresis: the speculation's own reads
// raise the figure, and without it the gate would flap every other step).
class SpeculationGate {
 public:
  explicit SpeculationGate(double close_at = 0.9, double open_below = 0.6)
      : close_at_(close_at), open_below_(open_below) {}
  // Takes one step's utilization; returns open().
  bool Update(double utilization) {
    if (open_ && utilization >= close_at_) open_ = false;
    if (!open_ && utilization < open_below_) open_ = true;
    return open_;
  }
  bool open() const { return open_; }

 private:
  double close_at_;
  double open_below_;
  bool open_ = true;
};

// How often the prediction at each rank (0: the most probable) was right, from the
// scored predictions; counts are halved past 4096 so that the figures follow the
// routing. Ranks past kMaxRanks are not tracked.
class RankPrecision {
 public:
  static constexpr int kMaxRanks = 64;
  void Record(int rank, bool correct) {
    if (rank < 0 || rank >= kMaxRanks) return;
    Counts& c = counts_[static_cast<size_t>(rank)];
    c.predicted += 1;
    c.correct += correct ? 1 : 0;
    if (c.predicted > 4096) {
      c.predicted /= 2;
      c.correct /= 2;
    }
  }
  // The leading ranks, up to `limit`, each with at least `min_samples` scored predictions
  // and a precision of at least `min_precision`.
  int Trusted(int limit, double min_precision, uint64_t min_samples) const {
    int n = 0;
    while (n < std::min(limit, kMaxRanks)) {
      const Counts& c = counts_[static_cast<size_t>(n)];
      if (c.predicted < min_samples ||
          static_cast<double>(c.correct) < min_precision * static_cast<double>(c.predicted)) {
        break;
      }
      ++n;
    }
    return n;
  }

 private:
  struct Counts {
    uint64_t predicted = 0;
    uint64_t correct = 0;
  };
  std::array<Counts, kMaxRanks> counts_{};
};

class Prefetcher {
 public:
  // `cache` (and `metrics`, may be null: none published) must outlive the prefetcher;
  // depth >= 1 (layers ahead).
  Prefetcher(experts::ExpertCache* cache, int n_layer, int n_expert, int n_used, int depth,
             telemetry::Registry* metrics = nullptr);

  int depth() const { return depth_; }

  // A new forward pass: predictions of the last one are dropped unscored, and the last
  // step's read utilization updates the speculation gate.
  void BeginStep();
  // Scores the prediction made for `layer` in this pass (if any) against the experts
  // its router chose: n tokens of `slots` experts (-1: an empty slot).
  void OnRouted(int layer, int64_t n, int slots, const int* experts);
  // Records the prediction for `layer` from its gate logits [n][n_expert].
  void Predict(int layer, const float* logits, int64_t n);
  // Starts loading the predicted experts of `layer` that are not resident.
  void Issue(int layer);

  const PrefetchStats& stats() const { return stats_; }

 private:
  experts::ExpertCache* cache_;
  int n_layer_;
  int n_expert_;
  int n_used_;
  int depth_;
  std::vector<std::vector<int>> predicted_;  // per layer, most probable first
  std::vector<bool> has_prediction_;
  std::vector<float> score_;  // scratch, n_expert
  SpeculationGate gate_;
  RankPrecision ranks_;
  uint64_t step_start_ns_ = 0;  // 0: no step yet
  uint64_t step_start_busy_ns_ = 0;
  PrefetchStats stats_;
  std::optional<telemetry::PrefetchMetrics> metrics_;
};

}  // namespace moert::pipeline

#endif  // MOERT_PIPELINE_PREFETCHER_H_
