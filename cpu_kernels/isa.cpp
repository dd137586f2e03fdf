#include "cpu_kernels/isa.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace hetmoe::cpu {
namespace {

#if defined(__x86_64__)
// Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18).
bool os_grants_amx() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kRef:
      return "ref";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

Isa detect_isa() {
#if defined(__x86_64__)
  // CPUID, and XGETBV for what the OS saves on a context switch: a CPU feature is usable only when both agree.
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return Isa::kRef;
  const bool osxsave = ecx & (1u << 27), fma = ecx & (1u << 12), f16c = ecx & (1u << 29);
  if (!osxsave) return Isa::kRef;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool os_avx = (xcr0_lo & 0x6) == 0x6;       // XMM and YMM state
  const bool os_avx512 = (xcr0_lo & 0xe6) == 0xe6;  // plus opmask and ZMM state
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return Isa::kRef;
  const bool avx2 = ebx & (1u << 5);
  // F, DQ, BW, VL, VNNI, and BMI2 (the tier's packing; every CPU with the others has it).
  const bool avx512 = (ebx & (1u << 16)) && (ebx & (1u << 17)) && (ebx & (1u << 30)) && (ebx & (1u << 31)) &&
                      (ecx & (1u << 11)) && (ebx & (1u << 8));
  const bool amx = (edx & (1u << 24)) && (edx & (1u << 25));  // AMX-TILE, AMX-INT8
  if (!(os_avx && avx2 && fma && f16c)) return Isa::kRef;
  if (!(os_avx512 && avx512)) return Isa::kAvx2;
  if (amx && os_grants_amx()) return Isa::kAmx;
  return Isa::kAvx512;
#else
  return Isa::kRef;
#endif
}

bool has_avx512_vbmi_bitalg() {
#if defined(__x86_64__)
  unsigned eax, ebx, ecx, edx;
  if (detect_isa() < Isa::kAvx512 || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & (1u << 1)) && (ecx & (1u << 12));  // AVX512_VBMI, AVX512_BITALG
#else
  return false;
#endif
}

Isa selected_isa() {
  static const Isa selected = [] {
    Isa have = detect_isa();
    const char* env = std::getenv("HETMOE_ISA");
    if (!env || !*env) return have;
    std::string want = env;
    for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
      if (want != isa_name(isa)) continue;
      if (isa > have)
        throw std::runtime_error("HETMOE_ISA=" + want + " asks for more than this CPU has (" +
                                 std::string(isa_name(have)) + ")");
      return isa;
    }
    throw std::runtime_error("HETMOE_ISA=" + want + ": unknown tier (use ref, avx2, avx512 or amx)");
  }();
  return selected;
}

}  // namespace hetmoe::cpu
