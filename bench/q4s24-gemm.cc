// Benchmarks of the q4s24 GEMM kernels: W4S24 (2:4-sparse int4) weights times M = 16, 128, 512
// A8 activation rows (prefill), on OLMoE's expert shapes, 1 and 2 threads, the
// dispatched kernel and every ISA variant side by side; reports GOPS (2*M*N*K per
// second) next to GB/s of weight bytes (bench-utils.h). Run: <build>/bin/moert-bench-q4s24-gemm
#include "bench/bench-utils.h"

int main(int argc, char** argv) {
  using moert::kernels::KernelConfig;
  moert::bench::RegisterQGemmBenchmarks("q4s24_gemm", &KernelConfig::q4s24, moert::bench::Op::kGemm,
                                        sizeof(moert_w4s24_block),
                                        moert::bench::WeightArena<moert_w4s24_block>);
  return moert::bench::Main(argc, argv);
}
