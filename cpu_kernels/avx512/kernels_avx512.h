#pragma once

#include "cpu_kernels/kernel_table.h"

namespace hetmoe::cpu::avx512 {

// Puts the AVX-512 (F, BW, VL, VNNI) dot products into `table`, over the AVX2 ones. Compiled with those flags;
// call only when the CPU and the OS support them (detect_isa() >= Isa::kAvx512).
void install(KernelTable& table);

}  // namespace hetmoe::cpu::avx512
