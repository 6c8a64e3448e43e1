// The x86-64 AVX-VNNI (VEX vpdpbusd, 256-bit) microkernels and how they fill a
// KernelConfig. kernels/config.cc includes this when MOERT_KERNELS_AVXVNNI is defined and
// expands MOERT_APPLY_AVXVNNI_KERNELS in Apply(), over a config that already holds the
// AVX2 kernels: the families without a VNNI variant (q8 quantization, top-k,
// f32 GEMM) keep those.
#ifndef MOERT_KERNELS_UKERNELS_AVXVNNI_H_
#define MOERT_KERNELS_UKERNELS_AVXVNNI_H_

#include "kernels/ukernel.h"

MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__avxvnni);
MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__avxvnni);
MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__avxvnni);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__avxvnni);
MOERT_DECLARE_QGEMM(moert_q8_gemv_ukernel_1x8__avxvnni);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__avxvnni);
MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__avxvnni);
MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__avxvnni);

#define MOERT_APPLY_AVXVNNI_KERNELS(c)                                                            \
  do {                                                                                            \
    SetGemm((c).q4, moert_q4_gemv_ukernel_1x8__avxvnni, moert_q4_gemm_ukernel_4x8__avxvnni, 4,    \
            Isa::kAvxVnni);                                                                       \
    SetGemm((c).q4m, moert_q4m_gemv_ukernel_1x8__avxvnni, moert_q4m_gemm_ukernel_4x8__avxvnni, 4, \
            Isa::kAvxVnni);                                                                       \
    SetGemm((c).q8, moert_q8_gemv_ukernel_1x8__avxvnni, moert_q8_gemm_ukernel_4x8__avxvnni, 4,    \
            Isa::kAvxVnni);                                                                       \
    SetGemm((c).q4s24, moert_q4s24_gemv_ukernel_1x8__avxvnni,                                     \
            moert_q4s24_gemm_ukernel_4x8__avxvnni, 4, Isa::kAvxVnni);                             \
  } while (0)

#endif  // MOERT_KERNELS_UKERNELS_AVXVNNI_H_
