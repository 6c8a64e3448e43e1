// Fills the per-family kernel configs from the CPU's features (see config.h).
#include "kernels/config.h"

#include <cpuinfo.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <span>
#include <string>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "absl/status/status.h"
#include "core/strings.h"
#include "telemetry/platform.h"

#if defined(MOERT_KERNELS_AVX2)
#include "kernels/ukernels-avx2.h"
#endif
#if defined(MOERT_KERNELS_AVXVNNI)
#include "kernels/ukernels-avxvnni.h"
#endif
#if defined(MOERT_KERNELS_AVX512VNNI)
#include "kernels/ukernels-avx512vnni.h"
#endif
#if defined(MOERT_KERNELS_AVX512VBMI)
#include "kernels/ukernels-avx512vbmi.h"
#endif
#if defined(MOERT_KERNELS_AMX)
#include "kernels/ukernels-amx.h"
#endif
#if defined(MOERT_KERNELS_NEON)
#include "kernels/ukernels-neon.h"
#endif
#if defined(MOERT_KERNELS_SME2)
#include "kernels/ukernels-sme2.h"
#endif

namespace moert::kernels {
namespace {

// Every ISA, each architecture's from the reference up (AvailableIsas' order).
constexpr Isa kAllIsas[] = {Isa::kScalar,     Isa::kAvx2,       Isa::kAvxVnni,
                            Isa::kAvx512Vnni, Isa::kAvx512Vbmi, Isa::kAmx,
                            Isa::kNeonDot,    Isa::kNeonI8mm,   Isa::kSme2};

#if defined(__x86_64__)
// Whether this process may run AMX tile instructions: the OS saves the tile state
// (XCR0 bits 17 and 18) and, on Linux (5.16+), grants XTILEDATA to the process
// (arch_prctl ARCH_REQ_XCOMP_PERM; without it the first tile instruction faults).
bool AmxUsable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 27)) == 0) {
    return false;  // no OSXSAVE: xgetbv would fault
  }
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  constexpr unsigned kTileState = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
  if ((xcr0_lo & kTileState) != kTileState) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return true;
}
#endif

HardwareConfig DetectHardware() {
  HardwareConfig hw;
  if (!cpuinfo_initialize()) return hw;
#if defined(__x86_64__) || defined(__i386__)
  hw.avx2 = cpuinfo_has_x86_avx2() && cpuinfo_has_x86_fma3() && cpuinfo_has_x86_f16c();
  // cpuinfo checks that the OS saves the AVX and AVX-512 state; Debian 12's predates
  // AVX-VNNI and AMX, which CPUID leaf 7 reports (subleaf 1 EAX bit 4; subleaf 0 EDX
  // bits 24 and 25). AVX-VNNI uses only the AVX state that avx2 already needs.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool leaf7_1 = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0;
  hw.avx_vnni = hw.avx2 && leaf7_1 && (eax & (1u << 4)) != 0;
  hw.avx512_vnni = hw.avx2 && cpuinfo_has_x86_avx512f() && cpuinfo_has_x86_avx512bw() &&
                   cpuinfo_has_x86_avx512vl() && cpuinfo_has_x86_avx512vnni();
  hw.avx512_vbmi = hw.avx512_vnni && cpuinfo_has_x86_avx512vbmi();
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0) {
    hw.amx_int8 = (edx & (1u << 24)) != 0 && (edx & (1u << 25)) != 0;
  }
#if defined(__x86_64__)
  hw.amx_int8 = hw.amx_int8 && AmxUsable();
#else
  hw.amx_int8 = false;
#endif
#endif
#if defined(__aarch64__)
  hw.neon_dot = cpuinfo_has_arm_neon_dot();
#if defined(__linux__)
  // Debian 12's cpuinfo predates i8mm and SME2; the kernel reports them in HWCAP2.
  constexpr unsigned long kHwcap2I8mm = 1UL << 13;
  constexpr unsigned long kHwcap2Sme2 = 1UL << 37;
  const unsigned long hwcap2 = getauxval(AT_HWCAP2);
  hw.neon_i8mm = hw.neon_dot && (hwcap2 & kHwcap2I8mm) != 0;
  hw.sme2 = (hwcap2 & kHwcap2Sme2) != 0;
#endif
#endif
  return hw;
}

bool IsaBuilt(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
#if defined(MOERT_KERNELS_AVX2)
      return true;
#else
      return false;
#endif
    case Isa::kAvxVnni:
#if defined(MOERT_KERNELS_AVXVNNI)
      return true;
#else
      return false;
#endif
    case Isa::kAvx512Vnni:
#if defined(MOERT_KERNELS_AVX512VNNI)
      return true;
#else
      return false;
#endif
    case Isa::kAvx512Vbmi:
#if defined(MOERT_KERNELS_AVX512VBMI)
      return true;
#else
      return false;
#endif
    case Isa::kAmx:
#if defined(MOERT_KERNELS_AMX)
      return true;
#else
      return false;
#endif
    case Isa::kNeonDot:
    case Isa::kNeonI8mm:
#if defined(MOERT_KERNELS_NEON)
      return true;
#else
      return false;
#endif
    case Isa::kSme2:
#if defined(MOERT_KERNELS_SME2)
      return true;
#else
      return false;
#endif
  }
  return false;
}

bool CpuRuns(Isa isa) {
  const HardwareConfig& hw = GetHardwareConfig();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return hw.avx2;
    case Isa::kAvxVnni:
      return hw.avx_vnni;
    case Isa::kAvx512Vnni:
      return hw.avx512_vnni;
    case Isa::kAvx512Vbmi:
      return hw.avx512_vbmi;
    case Isa::kAmx:
      return hw.amx_int8 && hw.avx512_vnni;  // the kernels pack with AVX-512
    case Isa::kNeonDot:
      return hw.neon_dot;
    case Isa::kNeonI8mm:
      return hw.neon_i8mm;
    case Isa::kSme2:
      return hw.sme2;
  }
  return false;
}

void SetGemm(GemmConfig& g, moert_qgemm_ukernel_fn gemv, moert_qgemm_ukernel_fn gemm,
             uint32_t mr, Isa isa) {
  if (gemv != nullptr) {
    g.gemv = gemv;
    g.gemv_isa = isa;
  }
  if (gemm != nullptr) {
    g.gemm = gemm;
    g.mr = mr;
    g.gemm_isa = isa;
  }
}

KernelConfig ScalarConfig() {
  KernelConfig c;
  c.isa = Isa::kScalar;
  c.q8_quant = {moert_q8_quant_ukernel__scalar, Isa::kScalar};
  SetGemm(c.q4, moert_q4_gemv_ukernel_1x8__scalar, moert_q4_gemm_ukernel_4x8__scalar, 4,
          Isa::kScalar);
  SetGemm(c.q4m, moert_q4m_gemv_ukernel_1x8__scalar, moert_q4m_gemm_ukernel_4x8__scalar, 4,
          Isa::kScalar);
  SetGemm(c.q8, moert_q8_gemv_ukernel_1x8__scalar, moert_q8_gemm_ukernel_4x8__scalar, 4,
          Isa::kScalar);
  SetGemm(c.q4s24, moert_q4s24_gemv_ukernel_1x8__scalar,
          moert_q4s24_gemm_ukernel_4x8__scalar, 4, Isa::kScalar);
  c.topk = {moert_f32_topk_ukernel__scalar, Isa::kScalar};
  c.f32_gemm = {moert_f32_gemm_ukernel_2x2__scalar, Isa::kScalar};
  c.f32_wsum = {moert_f32_wsum_ukernel__scalar, Isa::kScalar};
  c.kv_widen = {moert_f16_widen_ukernel__scalar, moert_q8_0_widen_ukernel__scalar, Isa::kScalar};
  return c;
}

// Layers `isa`'s kernels over `c` (which holds the ISAs below it).
void Apply(Isa isa, KernelConfig& c) {
  switch (isa) {
    case Isa::kScalar:
      break;
    case Isa::kAvx2:
#if defined(MOERT_KERNELS_AVX2)
      MOERT_APPLY_AVX2_KERNELS(c);
#endif
      break;
    case Isa::kAvxVnni:
#if defined(MOERT_KERNELS_AVXVNNI)
      MOERT_APPLY_AVXVNNI_KERNELS(c);
#endif
      break;
    case Isa::kAvx512Vnni:
#if defined(MOERT_KERNELS_AVX512VNNI)
      MOERT_APPLY_AVX512VNNI_KERNELS(c);
#endif
      break;
    case Isa::kAvx512Vbmi:
#if defined(MOERT_KERNELS_AVX512VBMI)
      MOERT_APPLY_AVX512VBMI_KERNELS(c);
#endif
      break;
    case Isa::kAmx:
#if defined(MOERT_KERNELS_AMX)
      MOERT_APPLY_AMX_KERNELS(c);
#endif
      break;
    case Isa::kNeonDot:
#if defined(MOERT_KERNELS_NEON)
      MOERT_APPLY_NEONDOT_KERNELS(c);
#endif
      break;
    case Isa::kNeonI8mm:
#if defined(MOERT_KERNELS_NEON)
      MOERT_APPLY_NEONI8MM_KERNELS(c);
#endif
      break;
    case Isa::kSme2:
#if defined(MOERT_KERNELS_SME2)
      MOERT_APPLY_SME2_KERNELS(c);
#endif
      break;
  }
  c.isa = isa;
}

KernelConfig BuildConfig(Isa isa) {
  KernelConfig c = ScalarConfig();
  // Each architecture's ISAs build on each other: a config for `isa` layers every
  // available step up to it (a CPU with AVX512-VNNI but not AVX-VNNI skips that step).
  static constexpr Isa kX86Chain[] = {Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512Vnni, Isa::kAvx512Vbmi,
                                      Isa::kAmx};
  static constexpr Isa kArmChain[] = {Isa::kNeonDot, Isa::kNeonI8mm, Isa::kSme2};
  const bool x86 =
      std::find(std::begin(kX86Chain), std::end(kX86Chain), isa) != std::end(kX86Chain);
  if (isa != Isa::kScalar) {  // scalar is the reference: nothing layered on it
    for (Isa step : x86 ? std::span<const Isa>(kX86Chain) : std::span<const Isa>(kArmChain)) {
      if (IsaAvailable(step)) Apply(step, c);
      if (step == isa) break;
    }
  }
  c.isa = isa;
  return c;
}

Isa BestIsa() {
  Isa best = Isa::kScalar;
  for (Isa isa : AvailableIsas()) best = isa;
  return best;
}

KernelConfig DefaultConfig() {
  const char* forced = std::getenv("MOERT_ISA");
  if (forced != nullptr && forced[0] != '\0') {
    absl::StatusOr<Isa> isa = ParseIsa(forced);
    if (!isa.ok()) {
      telemetry::Log(telemetry::LogLevel::kWarning,
                     StrCat("ignoring MOERT_ISA: ", isa.status().message()));
    } else if (!IsaAvailable(*isa)) {
      telemetry::Log(telemetry::LogLevel::kWarning,
                     StrCat("ignoring MOERT_ISA=", forced, ": ",
                            IsaBuilt(*isa) ? "this CPU cannot run it" : "not in this build"));
    } else {
      return BuildConfig(*isa);
    }
  }
  return BuildConfig(BestIsa());
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvxVnni:
      return "avxvnni";
    case Isa::kAvx512Vnni:
      return "avx512vnni";
    case Isa::kAvx512Vbmi:
      return "avx512vbmi";
    case Isa::kAmx:
      return "amx";
    case Isa::kNeonDot:
      return "neondot";
    case Isa::kNeonI8mm:
      return "neoni8mm";
    case Isa::kSme2:
      return "sme2";
  }
  return "?";
}

absl::StatusOr<Isa> ParseIsa(std::string_view name) {
  for (Isa isa : kAllIsas) {
    if (name == IsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown ISA \"", name,
             "\" (expected scalar, avx2, avxvnni, avx512vnni, avx512vbmi, amx, neondot, neoni8mm "
             "or sme2)"));
}

const HardwareConfig& GetHardwareConfig() {
  static const HardwareConfig hw = DetectHardware();
  return hw;
}

bool IsaAvailable(Isa isa) { return IsaBuilt(isa) && CpuRuns(isa); }

std::vector<Isa> AvailableIsas() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas) {
    if (IsaAvailable(isa)) out.push_back(isa);
  }
  return out;
}

const KernelConfig& GetKernelConfig() {
  static const KernelConfig config = DefaultConfig();
  return config;
}

absl::StatusOr<KernelConfig> KernelConfigFor(Isa isa) {
  if (!IsaBuilt(isa)) {
    return absl::FailedPreconditionError(StrCat("ISA ", IsaName(isa), " is not in this build"));
  }
  if (!CpuRuns(isa)) {
    return absl::FailedPreconditionError(StrCat("this CPU cannot run ", IsaName(isa)));
  }
  return BuildConfig(isa);
}

}  // namespace moert::kernels
