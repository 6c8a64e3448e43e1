// The AMX GEMMs (kernels/amx-qgemm.h) over the scalar model of the tile instructions
// (kernels/amx-tile-emulator.h): the same loop and B packing as the *-amx.cc kernels,
// runnable on any AVX-512 machine. Built only for x86-64 (with AVX-512 flags, in a file
// of its own so that nothing else is compiled for AVX-512); call only where the CPU has
// AVX512-VNNI.
#ifndef MOERT_TESTS_KERNELS_AMX_EMULATED_GEMM_H_
#define MOERT_TESTS_KERNELS_AMX_EMULATED_GEMM_H_

#include "kernels/ukernel.h"

MOERT_DECLARE_QGEMM(moert_q4_gemm_ukernel_16x8__amx_emulated);
MOERT_DECLARE_QGEMM(moert_q4m_gemm_ukernel_16x8__amx_emulated);
MOERT_DECLARE_QGEMM(moert_q8_gemm_ukernel_16x8__amx_emulated);

#endif  // MOERT_TESTS_KERNELS_AMX_EMULATED_GEMM_H_
