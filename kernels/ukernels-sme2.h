// The SME2 microkernels (built only where clang 19 is found: cmake/MoertKernels.cmake)
// and the config macro kernels/config.cc expands when MOERT_KERNELS_SME2 is defined.
// They are ordinary functions: each enters streaming mode and takes a fresh ZA
// itself (__arm_locally_streaming, __arm_new("za")), so GCC-built callers need no
// SME attributes. Only a CPU with SME2 may call them (config.cc checks HWCAP2).
#ifndef MOERT_KERNELS_UKERNELS_SME2_H_
#define MOERT_KERNELS_UKERNELS_SME2_H_

#include "kernels/ukernel.h"

// MR of the GEMM kernels: 16 rows, one za32 tile at SVL = 512 (any SVL works).
#define MOERT_SME2_GEMM_MR 16

MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__sme2);
MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_16x8__sme2);
MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__sme2);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_16x8__sme2);
MOERT_DECLARE_QGEMM(moert_q8_gemv_ukernel_1x8__sme2);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_16x8__sme2);

// No SME2 variant of W4S24 (sparse) or of the A8 quantizer: the NEON ones stay.
#define MOERT_APPLY_SME2_KERNELS(c)                                                       \
  do {                                                                                    \
    SetGemm((c).q4, moert_q4_gemv_ukernel_1x8__sme2, moert_q4_gemm_ukernel_16x8__sme2,    \
            MOERT_SME2_GEMM_MR, Isa::kSme2);                                              \
    SetGemm((c).q4m, moert_q4m_gemv_ukernel_1x8__sme2, moert_q4m_gemm_ukernel_16x8__sme2, \
            MOERT_SME2_GEMM_MR, Isa::kSme2);                                              \
    SetGemm((c).q8, moert_q8_gemv_ukernel_1x8__sme2, moert_q8_gemm_ukernel_16x8__sme2,    \
            MOERT_SME2_GEMM_MR, Isa::kSme2);                                              \
  } while (0)

#endif  // MOERT_KERNELS_UKERNELS_SME2_H_
