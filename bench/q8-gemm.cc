// Benchmarks of the q8 GEMM kernels: W8 (int8) weights times M = 16, 128, 512
// A8 activation rows (prefill), on OLMoE's expert shapes, 1 and 2 threads, the
// dispatched kernel and every ISA variant side by side; reports GOPS (2*M*N*K per
// second) next to GB/s of weight bytes (bench-utils.h). Run: <build>/bin/moert-bench-q8-gemm
#include "bench/bench-utils.h"

int main(int argc, char** argv) {
  using moert::kernels::KernelConfig;
  moert::bench::RegisterQGemmBenchmarks("q8_gemm", &KernelConfig::q8, moert::bench::Op::kGemm,
                                        sizeof(moert_w8_block),
                                        moert::bench::WeightArena<moert_w8_block>);
  return moert::bench::Main(argc, argv);
}
