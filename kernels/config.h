// Which microkernel each family uses on this machine. The CPU is inspected once
// (cpuinfo, getauxval for SME2) into a KernelConfig: per family a function pointer,
// its tile shape and the ISA it was written for. Operators read configs, never CPU
// flags. MOERT_ISA=scalar|avx2|avxvnni|avx512vnni|avx512vbmi|amx|neondot|neoni8mm|sme2
// forces a variant (a family without that variant takes the best one below it: amx >
// avx512vbmi > avx512vnni > avxvnni > avx2 > scalar, sme2 > neoni8mm > neondot > scalar);
// forcing an ISA the CPU or the build lacks falls back to the default with a warning on
// stderr.
#ifndef MOERT_KERNELS_CONFIG_H_
#define MOERT_KERNELS_CONFIG_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ukernel.h"

namespace moert::kernels {

enum class Isa {
  kScalar,
  kAvx2,
  kAvxVnni,
  kAvx512Vnni,
  kAvx512Vbmi,  // AVX512-VNNI + AVX512-VBMI
  kAmx,         // AMX-TILE + AMX-INT8 (prefill GEMMs), over the AVX-512 kernels
  kNeonDot,
  kNeonI8mm,
  kSme2
};

// "scalar", "avx2", "avxvnni", "avx512vnni", "avx512vbmi", "amx", "neondot", "neoni8mm",
// "sme2" (the MOERT_ISA spellings).
const char* IsaName(Isa isa);
absl::StatusOr<Isa> ParseIsa(std::string_view name);

// What this CPU can run (read once).
struct HardwareConfig {
  bool avx2 = false;         // AVX2 + FMA + F16C
  bool avx_vnni = false;     // AVX-VNNI (VEX vpdpbusd), with avx2
  bool avx512_vnni = false;  // AVX512 F + BW + VL + VNNI, with avx2
  bool avx512_vbmi = false;  // AVX512-VBMI, with avx512_vnni
  // AMX-TILE + AMX-INT8, and the OS lets this process use the tile state (XCR0 bits 17
  // and 18, and Linux's ARCH_REQ_XCOMP_PERM for XTILEDATA granted).
  bool amx_int8 = false;
  bool neon_dot = false;
  bool neon_i8mm = false;
  bool sme2 = false;
};
const HardwareConfig& GetHardwareConfig();

// Whether this build contains `isa`'s kernels and this CPU can run them.
bool IsaAvailable(Isa isa);
// Every ISA IsaAvailable says yes to, scalar first.
std::vector<Isa> AvailableIsas();

struct QuantConfig {
  moert_q8_quant_ukernel_fn quant = nullptr;
  Isa isa = Isa::kScalar;
};

// One weight format's kernels: the GEMV (one activation row) and the GEMM (up to `mr`
// rows at a time); both read tiles of `nr` (= MOERT_NR) rows.
struct GemmConfig {
  moert_qgemm_ukernel_fn gemv = nullptr;
  moert_qgemm_ukernel_fn gemm = nullptr;
  uint32_t mr = 1;
  uint32_t nr = MOERT_NR;
  Isa gemv_isa = Isa::kScalar;
  Isa gemm_isa = Isa::kScalar;
};

// The MoE router's top-k of the gate scores (ukernel.h, moert_f32_topk_ukernel_fn).
struct TopKConfig {
  moert_f32_topk_ukernel_fn topk = nullptr;
  Isa isa = Isa::kScalar;
};

// The fp32 reference path's matmuls (ukernel.h, moert_f32_gemm_ukernel_fn).
struct F32GemmConfig {
  moert_f32_gemm_ukernel_fn gemm = nullptr;
  Isa isa = Isa::kScalar;
};

// Attention's weighted sums of value rows (ukernel.h, moert_f32_wsum_ukernel_fn).
struct F32WsumConfig {
  moert_f32_wsum_ukernel_fn wsum = nullptr;
  Isa isa = Isa::kScalar;
};

// Typed KV cache rows widened to f32 (ukernel.h, moert_f16_widen_ukernel_fn and
// moert_q8_0_widen_ukernel_fn).
struct KvWidenConfig {
  moert_f16_widen_ukernel_fn f16 = nullptr;
  moert_q8_0_widen_ukernel_fn q8_0 = nullptr;
  Isa isa = Isa::kScalar;
};

struct KernelConfig {
  Isa isa = Isa::kScalar;  // what was asked for (the best available by default)
  QuantConfig q8_quant;
  GemmConfig q4;     // W4
  GemmConfig q4m;    // W4M
  GemmConfig q8;     // W8
  GemmConfig q4s24;  // W4S24
  TopKConfig topk;
  F32GemmConfig f32_gemm;
  F32WsumConfig f32_wsum;
  KvWidenConfig kv_widen;
};

// The process-wide config: MOERT_ISA if set and usable, else the best available.
const KernelConfig& GetKernelConfig();

// The config that uses `isa` wherever a family has it (tests and benchmarks run each
// variant through this). FailedPrecondition when the build or the CPU lacks `isa`.
absl::StatusOr<KernelConfig> KernelConfigFor(Isa isa);

}  // namespace moert::kernels

#endif  // MOERT_KERNELS_CONFIG_H_
