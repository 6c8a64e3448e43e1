// Benchmarks of the f32 GEMM kernels (the fp32 reference path's matmuls: the oracle
// models on the reference path, the vision encoder without XNNPACK): one thread's
// kernel call over a weight matrix and a batch of tokens, on the shapes those runs
// spend their time in (the MiniCPM-V resampler's 3584-wide key and value projections
// of a slice's patches, the oracle model's 256-wide layers over a 128-token chunk and
// one decode token), the dispatched kernel and every ISA variant. GOPS = 2 * rows *
// tokens * k per second. Each variant first checks its outputs against the scalar
// kernel bit for bit.
// Run: <build>/bin/moert-bench-f32-gemm
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench-utils.h"
#include "core/strings.h"

namespace {

using moert::StrCat;
namespace kernels = moert::kernels;
namespace bench = moert::bench;

struct GemmCase {
  moert_f32_gemm_ukernel_fn fn = nullptr;
  size_t rows = 0;
  size_t k = 0;
  size_t tokens = 0;
  std::string label;
};

void RunGemm(benchmark::State& state, const GemmCase& gc) {
  std::mt19937 rng(static_cast<uint32_t>(gc.rows + gc.k + gc.tokens));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> w(gc.rows * gc.k), x(gc.tokens * gc.k);
  for (float& v : w) v = uniform(rng);
  for (float& v : x) v = uniform(rng);
  std::vector<float> y(gc.tokens * gc.rows), want(y.size());
  gc.fn(gc.k, w.data(), gc.k, 0, gc.rows, x.data(), gc.tokens, y.data(), gc.rows);
  moert_f32_gemm_ukernel_2x2__scalar(gc.k, w.data(), gc.k, 0, gc.rows, x.data(), gc.tokens,
                                     want.data(), gc.rows);
  if (std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) != 0) {
    bench::Fail(state, "outputs differ from the scalar kernel's");
    return;
  }
  for (auto _ : state) {
    gc.fn(gc.k, w.data(), gc.k, 0, gc.rows, x.data(), gc.tokens, y.data(), gc.rows);
    benchmark::ClobberMemory();
  }
  state.counters["GOPS"] = benchmark::Counter(2.0 * static_cast<double>(gc.rows * gc.k * gc.tokens),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::OneK::kIs1000);
  state.SetLabel(gc.label);
}

void Register() {
  struct Shape {
    const char* name;
    size_t rows, k, tokens;
  };
  // 256 of the resampler's 1024 patches keep the working set to seconds per variant.
  const Shape shapes[] = {{"resampler_kv", 3584, 3584, 256},
                          {"oracle_ffn_chunk", 512, 256, 128},
                          {"oracle_ffn_decode", 512, 256, 1}};
  for (const auto& v : bench::FamilyVariants(&kernels::KernelConfig::f32_gemm)) {
    for (const Shape& s : shapes) {
      const GemmCase gc{v.config.gemm, s.rows, s.k, s.tokens, kernels::IsaName(v.config.isa)};
      const std::string name = StrCat("f32_gemm/", v.name, "/", s.name);
      benchmark::RegisterBenchmark(name.c_str(), [gc](benchmark::State& state) {
        RunGemm(state, gc);
      })->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  return bench::Main(argc, argv);
}
