// Benchmarks of the f32 top-k kernels (the MoE router's expert choice): k of n gate
// scores per token, n the expert counts of the reference models and beyond (8:
// Mixtral, 64: OLMoE, 128 and 256: the larger routers), k = 2 (Mixtral) and 8
// (OLMoE, Qwen, DeepSeek), the dispatched kernel and every ISA variant. One call per
// iteration, cycling through kRows different rows of random scores (so that branch
// history does not learn one input); the time columns are ns per call (on a machine
// shared with other work, the CPU column is the one to read). The scores stay in L1.
// Run: <build>/bin/moert-bench-f32-topk
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/bench-utils.h"
#include "core/strings.h"

namespace {

using moert::StrCat;
namespace kernels = moert::kernels;
namespace bench = moert::bench;

constexpr size_t kRows = 64;

struct TopKCase {
  moert_f32_topk_ukernel_fn fn = nullptr;
  size_t n = 0;
  size_t k = 0;
  std::string label;
};

void RunTopK(benchmark::State& state, const TopKCase& tc) {
  std::mt19937 rng(static_cast<uint32_t>(tc.n * 100 + tc.k));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> scores(kRows * tc.n);
  for (float& v : scores) v = normal(rng);
  std::vector<uint32_t> indices(kRows * tc.k);
  // The variant must give the scalar kernel's indices (tests/kernels checks it fully).
  std::vector<uint32_t> expected(tc.k);
  for (size_t row = 0; row < kRows; ++row) {
    tc.fn(tc.n, scores.data() + row * tc.n, tc.k, indices.data() + row * tc.k);
    moert_f32_topk_ukernel__scalar(tc.n, scores.data() + row * tc.n, tc.k, expected.data());
    for (size_t i = 0; i < tc.k; ++i) {
      if (indices[row * tc.k + i] != expected[i]) {
        bench::Fail(state, StrCat("row ", row, ": indices differ from the scalar kernel's"));
        return;
      }
    }
  }
  size_t row = 0;
  for (auto _ : state) {
    tc.fn(tc.n, scores.data() + row * tc.n, tc.k, indices.data() + row * tc.k);
    row = row + 1 == kRows ? 0 : row + 1;
  }
  benchmark::DoNotOptimize(indices.data());
  benchmark::ClobberMemory();
  state.SetLabel(tc.label);
}

void Register() {
  for (const auto& v : bench::FamilyVariants(&kernels::KernelConfig::topk)) {
    for (size_t n : {size_t{8}, size_t{64}, size_t{128}, size_t{256}}) {
      for (size_t k : {size_t{2}, size_t{8}}) {
        const TopKCase tc{v.config.topk, n, k, kernels::IsaName(v.config.isa)};
        const std::string name = StrCat("f32_topk/", v.name, "/n:", n, "/k:", k);
        benchmark::RegisterBenchmark(name.c_str(), [tc](benchmark::State& state) {
          RunTopK(state, tc);
        })->Unit(benchmark::kNanosecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  return bench::Main(argc, argv);
}
