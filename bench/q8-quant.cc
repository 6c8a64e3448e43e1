// Benchmarks of the A8 activation quantizers (q8-quant): K floats per row, K the input
// width of each expert matrix, for one row (decode) and 128 rows (prefill, split over 1
// and 2 threads), the dispatched kernel and every ISA variant side by side.
// The input is reused every iteration, so it comes from cache: this is a compute
// figure, reported as GB/s of float input and Gvalues/s; no bw_fraction (it would
// compare a cache-resident op with DRAM bandwidth).
// Run: <build>/bin/moert-bench-q8-quant
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench-utils.h"
#include "core/strings.h"

namespace {

using moert::StrCat;
namespace kernels = moert::kernels;
namespace bench = moert::bench;

struct QuantCase {
  moert_q8_quant_ukernel_fn fn = nullptr;
  size_t k = 0;
  size_t m = 1;
  int threads = 1;
  std::string label;
};

void RunQuant(benchmark::State& state, const QuantCase& qc) {
  std::vector<float> x(qc.m * qc.k);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001u) - 1000) * 1e-3f;
  }
  const size_t kb = qc.k / MOERT_QK;
  std::vector<moert_a8_block> a(qc.m * kb);
  // The variant must give the scalar quantizer's bytes (tests/kernels checks it fully).
  std::vector<moert_a8_block> expected(kb);
  moert_q8_quant_ukernel__scalar(qc.k, x.data(), expected.data());
  qc.fn(qc.k, x.data(), a.data());
  if (std::memcmp(a.data(), expected.data(), kb * sizeof(moert_a8_block)) != 0) {
    bench::Fail(state, "output differs from the scalar quantizer's");
    return;
  }
  pthreadpool_t pool = bench::ThreadPool(qc.threads);
  const size_t task_rows =
      qc.threads <= 1 ? qc.m : std::max<size_t>(1, qc.m / (static_cast<size_t>(qc.threads) * 4));
  bench::LoopTimer timer;
  for (auto _ : state) {
    pthreadpool_parallelize_1d_tile_1d(
        pool,
        [&](size_t m0, size_t rows) {
          for (size_t i = m0; i < m0 + rows; ++i) {
            qc.fn(qc.k, x.data() + i * qc.k, a.data() + i * kb);
          }
        },
        qc.m, task_rows);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
    timer.Lap();
  }
  const double seconds = timer.WallSeconds();
  const double values = static_cast<double>(state.iterations()) * static_cast<double>(qc.m * qc.k);
  state.SetBytesProcessed(static_cast<int64_t>(values * sizeof(float)));
  if (seconds > 0.0) {
    state.counters["GB/s"] = values * sizeof(float) / seconds * 1e-9;
    state.counters["Gvalues/s"] = values / seconds * 1e-9;
  }
  if (timer.BestLapSeconds() > 0.0) {  // the fastest iteration (bench-utils.h)
    state.counters["Gvalues/s_best"] =
        static_cast<double>(qc.m * qc.k) / timer.BestLapSeconds() * 1e-9;
  }
  state.SetLabel(qc.label);
}

void Register() {
  const auto variants = bench::FamilyVariants(&kernels::KernelConfig::q8_quant);
  // The distinct input widths of the expert matrices (bench-utils.h kExpertShapes).
  static constexpr size_t kWidths[] = {1024, 1408, 2048, 4096, 14336};
  for (const auto& v : variants) {
    for (size_t k : kWidths) {
      for (size_t m : {size_t{1}, size_t{128}}) {
        for (int threads : bench::kThreadCounts) {
          if (m == 1 && threads > 1) continue;  // one row is one call
          QuantCase qc{v.config.quant, k, m, threads, kernels::IsaName(v.config.isa)};
          const std::string name =
              StrCat("q8_quant/", v.name, "/k:", k, "/m:", m, "/threads:", threads);
          bench::Configure(benchmark::RegisterBenchmark(
              name.c_str(), [qc](benchmark::State& state) { RunQuant(state, qc); }));
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  return bench::Main(argc, argv);
}
