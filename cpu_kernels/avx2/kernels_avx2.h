#pragma once

#include "cpu_kernels/kernel_table.h"

namespace hetmoe::cpu::avx2 {

// Puts the AVX2+FMA+F16C dot products into `table`. Compiled with those flags; call only when the CPU has them.
void install(KernelTable& table);
// Puts the 256-bit SwiGLU (KernelTable::swiglu) into `table`: AVX2 without FMA and without contraction, so that each
// lane is cpu::silu_times's float.
void install_swiglu(KernelTable& table);

}  // namespace hetmoe::cpu::avx2
