// Router latency per token-layer (docs/routing.md): for E = 8, 64, 128 experts over a
// hidden size of 2048,
//   whole    the gate logits (fp32 router weights [E][2048] times one hidden state,
//            model::MatMul on one thread) plus router::Router::Route (softmax, top-k,
//            weights), as a decode step runs it;
//   route    Route alone (the logits given);
//   topk     the dispatched top-k kernel alone.
// Each reports its time per token-layer and, for `whole`, the gate weights' bytes per
// second: the router should be bounded by reading them. Under pressure (`pressure`
// variants: half the experts resident, alpha 1) Route also scores the adjusted
// logits. Run: <build>/bin/moert-bench-router
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/config.h"
#include "model/layers.h"
#include "router/resource_monitor.h"
#include "router/router.h"

namespace {

namespace router = moert::router;
constexpr int64_t kHidden = 2048;
constexpr int kK = 8;

struct Inputs {
  moert::model::Matrix gate;
  std::vector<float> x;
  std::vector<float> logits;
  std::vector<uint64_t> resident;

  explicit Inputs(int n_expert) : x(kHidden), logits(static_cast<size_t>(n_expert)) {
    std::mt19937 rng(static_cast<uint32_t>(n_expert));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    gate.rows = n_expert;
    gate.cols = kHidden;
    gate.data.resize(static_cast<size_t>(n_expert * kHidden));
    for (float& v : gate.data) v = normal(rng) * 0.02f;
    for (float& v : x) v = normal(rng);
    for (float& v : logits) v = normal(rng);
    resident.assign(static_cast<size_t>((n_expert + 63) / 64), 0);
    for (int e = 0; e < n_expert; e += 2) resident[static_cast<size_t>(e / 64)] |= uint64_t{1} << (e % 64);
  }
};

void Whole(benchmark::State& state, bool pressure) {
  const int n_expert = static_cast<int>(state.range(0));
  Inputs in(n_expert);
  moert::model::ThreadPool pool(1);
  router::ResourceMonitor monitor;
  if (pressure) monitor.OverridePressure(1.0f);
  router::Router r(moert::kernels::GetKernelConfig(), router::RouterOptions{}, 1, n_expert, &monitor);
  r.BeginStep();
  const int k = std::min(kK, n_expert);
  std::vector<int> experts(static_cast<size_t>(k));
  std::vector<float> weights(static_cast<size_t>(k));
  for (auto _ : state) {
    moert::model::MatMul(pool, in.gate, in.x.data(), 1, in.logits.data());
    r.Route(0, in.logits.data(), 1, k, true, in.resident, experts.data(), weights.data());
    benchmark::DoNotOptimize(experts.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n_expert * kHidden * 4);
}

void RouteOnly(benchmark::State& state, bool pressure) {
  const int n_expert = static_cast<int>(state.range(0));
  Inputs in(n_expert);
  router::ResourceMonitor monitor;
  if (pressure) monitor.OverridePressure(1.0f);
  router::Router r(moert::kernels::GetKernelConfig(), router::RouterOptions{}, 1, n_expert, &monitor);
  r.BeginStep();
  const int k = std::min(kK, n_expert);
  std::vector<int> experts(static_cast<size_t>(k));
  std::vector<float> weights(static_cast<size_t>(k));
  for (auto _ : state) {
    r.Route(0, in.logits.data(), 1, k, true, in.resident, experts.data(), weights.data());
    benchmark::DoNotOptimize(experts.data());
  }
}

void TopKOnly(benchmark::State& state) {
  const int n_expert = static_cast<int>(state.range(0));
  Inputs in(n_expert);
  const auto& config = moert::kernels::GetKernelConfig();
  const size_t k = static_cast<size_t>(std::min(kK, n_expert));
  std::vector<uint32_t> idx(k);
  for (auto _ : state) {
    config.topk.topk(static_cast<size_t>(n_expert), in.logits.data(), k, idx.data());
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetLabel(moert::kernels::IsaName(config.topk.isa));
}

BENCHMARK_CAPTURE(Whole, plain, false)->ArgName("E")->Arg(8)->Arg(64)->Arg(128);
BENCHMARK_CAPTURE(Whole, pressure, true)->ArgName("E")->Arg(8)->Arg(64)->Arg(128);
BENCHMARK_CAPTURE(RouteOnly, plain, false)->ArgName("E")->Arg(8)->Arg(64)->Arg(128);
BENCHMARK_CAPTURE(RouteOnly, pressure, true)->ArgName("E")->Arg(8)->Arg(64)->Arg(128);
BENCHMARK(TopKOnly)->ArgName("E")->Arg(8)->Arg(64)->Arg(128);

}  // namespace

BENCHMARK_MAIN();
