// The AArch64 NEON microkernels (dotprod and i8mm) and how they fill a KernelConfig.
// kernels/config.cc includes this when MOERT_KERNELS_NEON is defined (the build has
// the sources) and expands MOERT_APPLY_NEONDOT_KERNELS / MOERT_APPLY_NEONI8MM_KERNELS
// in Apply(), where SetGemm and Isa are in scope. The i8mm layer only replaces the
// GEMMs: decode's GEMV stays the dotprod one (SMMLA needs two activation rows), and
// so does the q4s24 GEMM (its gather is per weight row, which a 2x2 SMMLA tile cannot
// share).
#ifndef MOERT_KERNELS_UKERNELS_NEON_H_
#define MOERT_KERNELS_UKERNELS_NEON_H_

#include "kernels/ukernel.h"

// +dotprod (the quantizer needs only base NEON and sdot for its sum).
void moert_q8_quant_ukernel__neon(size_t k, const float* x, moert_a8_block* a);
MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__neondot);
MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__neondot);
MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__neondot);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__neondot);
MOERT_DECLARE_QGEMM(moert_q8_gemv_ukernel_1x8__neondot);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__neondot);
MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__neondot);
MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__neondot);
// Base NEON only (built with the dotprod list, dispatched with it).
MOERT_DECLARE_TOPK(moert_f32_topk_ukernel__neon);
MOERT_DECLARE_KV_WIDEN(moert_f16_widen_ukernel__neon);
MOERT_DECLARE_KV_WIDEN(moert_q8_0_widen_ukernel__neon);

// +dotprod+i8mm.
MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__neoni8mm);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__neoni8mm);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__neoni8mm);

#define MOERT_APPLY_NEONDOT_KERNELS(c)                                                             \
  do {                                                                                             \
    (c).q8_quant = {moert_q8_quant_ukernel__neon, Isa::kNeonDot};                                  \
    SetGemm((c).q4, moert_q4_gemv_ukernel_1x8__neondot, moert_q4_gemm_ukernel_4x8__neondot, 4,     \
            Isa::kNeonDot);                                                                        \
    SetGemm((c).q4m, moert_q4m_gemv_ukernel_1x8__neondot, moert_q4m_gemm_ukernel_4x8__neondot, 4,  \
            Isa::kNeonDot);                                                                        \
    SetGemm((c).q8, moert_q8_gemv_ukernel_1x8__neondot, moert_q8_gemm_ukernel_4x8__neondot, 4,     \
            Isa::kNeonDot);                                                                        \
    SetGemm((c).q4s24, moert_q4s24_gemv_ukernel_1x8__neondot,                                      \
            moert_q4s24_gemm_ukernel_4x8__neondot, 4, Isa::kNeonDot);                              \
    (c).topk = {moert_f32_topk_ukernel__neon, Isa::kNeonDot};                                      \
    (c).kv_widen = {moert_f16_widen_ukernel__neon, moert_q8_0_widen_ukernel__neon, Isa::kNeonDot}; \
  } while (0)

#define MOERT_APPLY_NEONI8MM_KERNELS(c)                                                 \
  do {                                                                                  \
    SetGemm((c).q4, nullptr, moert_q4_gemm_ukernel_4x8__neoni8mm, 4, Isa::kNeonI8mm);   \
    SetGemm((c).q4m, nullptr, moert_q4m_gemm_ukernel_4x8__neoni8mm, 4, Isa::kNeonI8mm); \
    SetGemm((c).q8, nullptr, moert_q8_gemm_ukernel_4x8__neoni8mm, 4, Isa::kNeonI8mm);   \
  } while (0)

#endif  // MOERT_KERNELS_UKERNELS_NEON_H_
