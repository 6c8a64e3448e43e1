// Benchmarks of the q4s24 GEMV kernels: W4S24 (2:4-sparse int4) weights times one A8 activation
// row (decode), on the expert shapes of OLMoE, Qwen1.5-MoE and Mixtral, 1 and 2 threads,
// the dispatched kernel and every ISA variant side by side. Decode is memory-bound, so
// the figure that matters is GB/s of weight bytes and its fraction of the measured read
// bandwidth (bench-utils.h). Run: <build>/bin/moert-bench-q4s24-gemv
#include "bench/bench-utils.h"

int main(int argc, char** argv) {
  using moert::kernels::KernelConfig;
  moert::bench::RegisterQGemmBenchmarks("q4s24_gemv", &KernelConfig::q4s24, moert::bench::Op::kGemv,
                                        sizeof(moert_w4s24_block),
                                        moert::bench::WeightArena<moert_w4s24_block>);
  return moert::bench::Main(argc, argv);
}
