// See amx_emulated_gemm.h. Only the kernel loop is compiled here (AVX-512 flags).
#include "kernels/amx_emulated_gemm.h"

#include "kernels/amx-tile-emulator.h"

MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_16x8__amx_emulated) {
  moert::kernels::amx::Gemm<moert::kernels::amx::EmulatedTiles, moert::kernels::amx::W4>(
      m, nc, kb, a, a_stride, w, c, c_stride);
}

MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_16x8__amx_emulated) {
  moert::kernels::amx::Gemm<moert::kernels::amx::EmulatedTiles, moert::kernels::amx::W4M>(
      m, nc, kb, a, a_stride, w, c, c_stride);
}

MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_16x8__amx_emulated) {
  moert::kernels::amx::Gemm<moert::kernels::amx::EmulatedTiles, moert::kernels::amx::W8>(
      m, nc, kb, a, a_stride, w, c, c_stride);
}
