// Benchmarks of model-file handling: opening and validating a GGUF file, and reading
// its ModelSpec. Run: <build>/bin/moert-bench-gguf --model=FILE (default: the example
// model).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "format/gguf.h"
#include "format/model_spec.h"

namespace {

std::string g_model = MOERT_EXAMPLE_MODEL;

void BM_GgufOpen(benchmark::State& state) {
  for (auto _ : state) {
    auto file = moert::format::GgufFile::Open(g_model);
    if (!file.ok()) {
      state.SkipWithError(std::string(file.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(file->get());
  }
}
BENCHMARK(BM_GgufOpen)->Unit(benchmark::kMicrosecond);

void BM_ReadModelSpec(benchmark::State& state) {
  auto file = moert::format::GgufFile::Open(g_model);
  if (!file.ok()) {
    state.SkipWithError(std::string(file.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    auto spec = moert::format::ReadModelSpec(**file);
    benchmark::DoNotOptimize(spec);
  }
}
BENCHMARK(BM_ReadModelSpec)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--model=", 8) == 0) g_model = argv[i] + 8;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
