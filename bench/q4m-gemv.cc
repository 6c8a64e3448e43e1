// Benchmarks of the q4m GEMV kernels: W4M (asymmetric int4) weights times one A8 activation
// row (decode), on the expert shapes of OLMoE, Qwen1.5-MoE and Mixtral, 1 and 2 threads,
// the dispatched kernel and every ISA variant side by side. Decode is memory-bound, so
// the figure that matters is GB/s of weight bytes and its fraction of the measured read
// bandwidth (bench-utils.h). Run: <build>/bin/moert-bench-q4m-gemv
#include "bench/bench-utils.h"

int main(int argc, char** argv) {
  using moert::kernels::KernelConfig;
  moert::bench::RegisterQGemmBenchmarks("q4m_gemv", &KernelConfig::q4m, moert::bench::Op::kGemv,
                                        sizeof(moert_w4m_block),
                                        moert::bench::WeightArena<moert_w4m_block>);
  return moert::bench::Main(argc, argv);
}
