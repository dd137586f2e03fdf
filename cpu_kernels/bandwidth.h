#pragma once

#include <cstddef>

#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {

// DRAM read bandwidth in bytes per second with the pool's threads: each thread streams its slice of a buffer
// much larger than the last-level cache; the best of `repeats` passes counts. Allocates and touches `bytes`.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 3);

}  // namespace hetmoe::cpu
