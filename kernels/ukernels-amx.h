// The x86-64 AMX-INT8 microkernels (Sapphire Rapids and later: tdpbssd on 16x64-byte
// tiles) and how they fill a KernelConfig. kernels/config.cc includes this when
// MOERT_KERNELS_AMX is defined and expands MOERT_APPLY_AMX_KERNELS in Apply(), over a
// config that already holds the AVX-512 kernels: the W4, W4M and W8 GEMMs (prefill, 16
// activation rows a call) have AMX variants; decode's GEMVs and W4S24 stay AVX-512.
#ifndef MOERT_KERNELS_UKERNELS_AMX_H_
#define MOERT_KERNELS_UKERNELS_AMX_H_

#include "kernels/ukernel.h"

// Activation rows per GEMM call: the rows of an AMX tile.
#define MOERT_AMX_GEMM_ROWS 16

MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_16x8__amx);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_16x8__amx);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_16x8__amx);

#define MOERT_APPLY_AMX_KERNELS(c)                                                               \
  do {                                                                                           \
    SetGemm((c).q4, nullptr, moert_q4_gemm_ukernel_16x8__amx, MOERT_AMX_GEMM_ROWS, Isa::kAmx);   \
    SetGemm((c).q4m, nullptr, moert_q4m_gemm_ukernel_16x8__amx, MOERT_AMX_GEMM_ROWS, Isa::kAmx); \
    SetGemm((c).q8, nullptr, moert_q8_gemm_ukernel_16x8__amx, MOERT_AMX_GEMM_ROWS, Isa::kAmx);   \
  } while (0)

#endif  // MOERT_KERNELS_UKERNELS_AMX_H_
