// Benchmarks of the KV widening kernels (attention over an f16 or q8_0 KV cache widens
// a head's cached rows to f32 before the f32 kernels read them): the dispatched kernel
// and every ISA variant, over one head's slice of 128 positions (what a task widens at
// a time: kWidenRows in backend/cpu/f32_ops.cc) of head widths 64 and 128, OLMoE's and
// Mixtral's. The rows stay in L2; GB/s counts the cache bytes read.
// Run: <build>/bin/moert-bench-kv-widen
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

constexpr size_t kRows = 128;

void RunWiden(benchmark::State& state, moert_f16_widen_ukernel_fn fn, bool q8_0, size_t dim,
              const std::string& label) {
  // Bytes of one row of the head: halves, or q8_0 blocks of 32.
  const size_t row_bytes = q8_0 ? dim / 32 * 34 : dim * 2;
  std::vector<uint8_t> rows(kRows * row_bytes);
  std::mt19937 rng(7);
  for (uint8_t& b : rows) b = static_cast<uint8_t>(rng() & 0x3f);  // finite halves and scales
  std::vector<float> out(kRows * dim);
  for (auto _ : state) {
    for (size_t r = 0; r < kRows; ++r) {
      fn(q8_0 ? dim / 32 : dim, rows.data() + r * row_bytes, out.data() + r * dim);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * rows.size()));
  state.SetLabel(label);
}

void Register() {
  for (const auto& v : bench::FamilyVariants(&kernels::KernelConfig::kv_widen)) {
    for (size_t dim : {size_t{64}, size_t{128}}) {
      const std::string label = kernels::IsaName(v.config.isa);
      const moert_f16_widen_ukernel_fn f16 = v.config.f16;
      const moert_q8_0_widen_ukernel_fn q8 = v.config.q8_0;
      benchmark::RegisterBenchmark(
          StrCat("f16_widen/", v.name, "/dim:", dim).c_str(),
          [=](benchmark::State& state) { RunWiden(state, f16, false, dim, label); })
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(
          StrCat("q8_0_widen/", v.name, "/dim:", dim).c_str(),
          [=](benchmark::State& state) { RunWiden(state, q8, true, dim, label); })
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  return bench::Main(argc, argv);
}
