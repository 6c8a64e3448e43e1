// The x86-64 AVX512-VBMI microkernels (on top of AVX512-VNNI: Ice Lake, Sapphire Rapids,
// Zen 4 and later) and how they fill a KernelConfig. kernels/config.cc includes this when
// MOERT_KERNELS_AVX512VBMI is defined and expands MOERT_APPLY_AVX512VBMI_KERNELS in
// Apply(), over a config that already holds the AVX512-VNNI kernels: only W4S24, whose
// pair codes VBMI's byte permutes expand in far fewer steps, has a variant of its own.
#ifndef MOERT_KERNELS_UKERNELS_AVX512VBMI_H_
#define MOERT_KERNELS_UKERNELS_AVX512VBMI_H_

#include "kernels/ukernel.h"

MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__avx512vbmi);
MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__avx512vbmi);

#define MOERT_APPLY_AVX512VBMI_KERNELS(c)                                 \
  do {                                                                    \
    SetGemm((c).q4s24, moert_q4s24_gemv_ukernel_1x8__avx512vbmi,          \
            moert_q4s24_gemm_ukernel_4x8__avx512vbmi, 4, Isa::kAvx512Vbmi); \
  } while (0)

#endif  // MOERT_KERNELS_UKERNELS_AVX512VBMI_H_
