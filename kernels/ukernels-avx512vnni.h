// The x86-64 AVX512-VNNI (EVEX vpdpbusd; 512-bit registers for W4 and W4M) microkernels and how
// they fill a KernelConfig. kernels/config.cc includes this when MOERT_KERNELS_AVX512VNNI is
// defined and expands MOERT_APPLY_AVX512VNNI_KERNELS in Apply(), over a config that already holds
// the AVX2 kernels: the families without a VNNI variant (q8 quantization, top-k, f32 GEMM)
// keep those.
#ifndef MOERT_KERNELS_UKERNELS_AVX512VNNI_H_
#define MOERT_KERNELS_UKERNELS_AVX512VNNI_H_

#include "kernels/ukernel.h"

MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__avx512vnni);
MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__avx512vnni);
MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__avx512vnni);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__avx512vnni);
MOERT_DECLARE_QGEMM(moert_q8_gemv_ukernel_1x8__avx512vnni);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__avx512vnni);
MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__avx512vnni);
MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__avx512vnni);

#define MOERT_APPLY_AVX512VNNI_KERNELS(c)                                                         \
  do {                                                                                            \
    SetGemm((c).q4, moert_q4_gemv_ukernel_1x8__avx512vnni, moert_q4_gemm_ukernel_4x8__avx512vnni, \
            4, Isa::kAvx512Vnni);                                                                 \
    SetGemm((c).q4m, moert_q4m_gemv_ukernel_1x8__avx512vnni,                                      \
            moert_q4m_gemm_ukernel_4x8__avx512vnni, 4, Isa::kAvx512Vnni);                         \
    SetGemm((c).q8, moert_q8_gemv_ukernel_1x8__avx512vnni, moert_q8_gemm_ukernel_4x8__avx512vnni, \
            4, Isa::kAvx512Vnni);                                                                 \
    SetGemm((c).q4s24, moert_q4s24_gemv_ukernel_1x8__avx512vnni,                                     \
            moert_q4s24_gemm_ukernel_4x8__avx512vnni, 4, Isa::kAvx512Vnni);                             \
  } while (0)

#endif  // MOERT_KERNELS_UKERNELS_AVX512VNNI_H_
