#pragma once

#include "cpu_kernels/kernel_table.h"

namespace hetmoe::cpu::avx512 {

// Puts the AVX-512 (F, BW, VL, VNNI) dot products into `table`, over the AVX2 ones. Compiled with those flags;
// call only when the CPU and the OS support them (detect_isa() >= Isa::kAvx512).
void install(KernelTable& table);
// Puts the AVX-512 attention head-group kernels (dot_heads, sum_heads) into `table`; the same conditions.
void install_attention(KernelTable& table);
// Puts the AVX-512 weight quantizers (the split formats' W^Q fit) into `table`; the same conditions.
void install_quantize(KernelTable& table);
// Puts the seven IQ grid formats' dots with VBMI and BITALG (iq_vbmi.cpp) into `table`, over the tier's. Call only when
// the AVX-512 tier runs and has_avx512_vbmi_bitalg() is true.
void install_iq_vbmi(KernelTable& table);
// Puts the AMX tile kernels (Q4_K, Q8_0, Q5_0 tiles for batches) over those; the rest of the AMX tier is AVX-512.
// Call only when detect_isa() returned Isa::kAmx (CPU support and the OS's permission for tile state).
void install_amx(KernelTable& table);
// The same AMX kernels with every tile instruction computed in scalar code instead: runs on any AVX-512 host, so
// tests check the kernels' packing and scaling where no AMX exists. Slow; tests only.
void install_amx_emulated(KernelTable& table);

}  // namespace hetmoe::cpu::avx512
