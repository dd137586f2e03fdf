#pragma once

#include <string_view>

namespace hetmoe::cpu {

// Instruction-set tiers, lowest first. A tier implies the ones before it.
enum class Isa { kRef = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

std::string_view isa_name(Isa isa);

// What this CPU supports: AVX2 needs AVX2+FMA+F16C; AVX-512 needs F/BW/VL/VNNI; AMX needs AMX-TILE/INT8/BF16 with
// the OS having granted the tile state.
Isa detect_isa();

// Whether the CPU has AVX-512 VBMI and BITALG (Ice Lake and later, Zen 4), which some kernels of the AVX-512 tier
// use where present (the tier itself needs neither: Skylake-X and Cascade Lake lack them).
bool has_avx512_vbmi_bitalg();

// The tier the kernels use: detect_isa(), lowered by HETMOE_ISA=ref|avx2|avx512|amx when that names a lower tier.
// A request above what the CPU has is refused with an error rather than executed into SIGILL.
Isa selected_isa();

}  // namespace hetmoe::cpu
