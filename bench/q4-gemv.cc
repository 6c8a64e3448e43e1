// Benchmarks of the q4 GEMV kernels: W4 (symmetric int4) weights times one A8 activation
// row (decode), on the expert shapes of OLMoE, Qwen1.5-MoE and Mixtral, 1 and 2 threads,
// the dispatched kernel and every ISA variant side by side. Decode is memory-bound, so
// the figure that matters is GB/s of weight bytes and its fraction of the measured read
// bandwidth (bench-utils.h). Run: <build>/bin/moert-bench-q4-gemv
#include "bench/bench-utils.h"

int main(int argc, char** argv) {
  using moert::kernels::KernelConfig;
  moert::bench::RegisterQGemmBenchmarks("q4_gemv", &KernelConfig::q4, moert::bench::Op::kGemv,
                                        sizeof(moert_w4_block),
                                        moert::bench::WeightArena<moert_w4_block>);
  return moert::bench::Main(argc, argv);
}
