#include "cpu_kernels/isa.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
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
    case Isa::kRef: return "ref";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

Isa detect_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
    return Isa::kRef;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")))
    return Isa::kAvx2;
  if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") && os_grants_amx()) return Isa::kAmx;
  return Isa::kAvx512;
#else
  return Isa::kRef;
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
        throw std::runtime_error("HETMOE_ISA=" + want + " asks for more than this CPU has (" + std::string(isa_name(have)) + ")");
      return isa;
    }
    throw std::runtime_error("HETMOE_ISA=" + want + ": unknown tier (use ref, avx2, avx512 or amx)");
  }();
  return selected;
}

}  // namespace hetmoe::cpu
