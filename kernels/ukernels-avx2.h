// The x86-64 AVX2 (+FMA +F16C) microkernels and how they fill a KernelConfig.
// kernels/config.cc includes this when MOERT_KERNELS_AVX2 is defined (the build has the
// sources) and expands MOERT_APPLY_AVX2_KERNELS in Apply(), where SetGemm and Isa are in
// scope. Every family has a GEMV (1x8) and a GEMM of MR = 4 rows (4x8).
#ifndef MOERT_KERNELS_UKERNELS_AVX2_H_
#define MOERT_KERNELS_UKERNELS_AVX2_H_

#include "kernels/ukernel.h"

void moert_q8_quant_ukernel__avx2(size_t k, const float* x, moert_a8_block* a);
MOERT_DECLARE_QGEMM(moert_q4_gemv_ukernel_1x8__avx2);
MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_4x8__avx2);
MOERT_DECLARE_QGEMM(moert_q4m_gemv_ukernel_1x8__avx2);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_4x8__avx2);
MOERT_DECLARE_QGEMM(moert_q8_gemv_ukernel_1x8__avx2);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_4x8__avx2);
MOERT_DECLARE_QGEMM(moert_q4s24_gemv_ukernel_1x8__avx2);
MOERT_DECLARE_QGEMM(moert_q4s24_gemm_ukernel_4x8__avx2);
MOERT_DECLARE_TOPK(moert_f32_topk_ukernel__avx2);
MOERT_DECLARE_F32_GEMM(moert_f32_gemm_ukernel_4x3__avx2);
MOERT_DECLARE_F32_WSUM(moert_f32_wsum_ukernel__avx2);
MOERT_DECLARE_KV_WIDEN(moert_f16_widen_ukernel__avx2);
MOERT_DECLARE_KV_WIDEN(moert_q8_0_widen_ukernel__avx2);

#define MOERT_APPLY_AVX2_KERNELS(c)                                                               \
  do {                                                                                            \
    (c).q8_quant = {moert_q8_quant_ukernel__avx2, Isa::kAvx2};                                    \
    SetGemm((c).q4, moert_q4_gemv_ukernel_1x8__avx2, moert_q4_gemm_ukernel_4x8__avx2, 4,          \
            Isa::kAvx2);                                                                          \
    SetGemm((c).q4m, moert_q4m_gemv_ukernel_1x8__avx2, moert_q4m_gemm_ukernel_4x8__avx2, 4,       \
            Isa::kAvx2);                                                                          \
    SetGemm((c).q8, moert_q8_gemv_ukernel_1x8__avx2, moert_q8_gemm_ukernel_4x8__avx2, 4,          \
            Isa::kAvx2);                                                                          \
    SetGemm((c).q4s24, moert_q4s24_gemv_ukernel_1x8__avx2, moert_q4s24_gemm_ukernel_4x8__avx2, 4, \
            Isa::kAvx2);                                                                          \
    (c).topk = {moert_f32_topk_ukernel__avx2, Isa::kAvx2};                                        \
    (c).f32_gemm = {moert_f32_gemm_ukernel_4x3__avx2, Isa::kAvx2};                                \
    (c).f32_wsum = {moert_f32_wsum_ukernel__avx2, Isa::kAvx2};                                    \
    (c).kv_widen = {moert_f16_widen_ukernel__avx2, moert_q8_0_widen_ukernel__avx2, Isa::kAvx2};   \
  } while (0)

#endif  // MOERT_KERNELS_UKERNELS_AVX2_H_
