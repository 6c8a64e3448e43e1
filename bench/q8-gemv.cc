// Benchmarks of the q8 GEMV kernels: W8 (int8) weights times one A8 activation
// row (decode), on the expert shapes of OLMoE, Qwen1.5-MoE and Mixtral, 1 and 2 threads,
// the dispatched kernel and every ISA variant side by side. Decode is memory-bound, so
// the figure that matters is GB/s of weight bytes and its fraction of the measured read
// bandwidth (bench-utils.h). Run: <build>/bin/moert-bench-q8-gemv
#include "bench/bench-utils.h"

int main(int argc, char** argv) {
  using moert::kernels::KernelConfig;
  moert::bench::RegisterQGemmBenchmarks("q8_gemv", &KernelConfig::q8, moert::bench::Op::kGemv,
                                        sizeof(moert_w8_block),
                                        moert::bench::WeightArena<moert_w8_block>);
  return moert::bench::Main(argc, argv);
}
