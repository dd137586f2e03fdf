#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {

// DRAM read bandwidth in bytes per second with the pool's threads: each thread streams its slice of a buffer much
// larger than the last-level cache with the selected tier's stream reads (KernelTable::stream_sum: 32-byte loads on
// x86); the best of `repeats` passes counts. The buffer is allocated and first touched once, by the threads that read
// it, in 2 MB pages where transparent huge pages allow (as a model file's weights are mapped), so that a benchmark
// measuring after every run pays for the reads only, not for a gigabyte of page faults each time.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(ThreadPool& pool, size_t bytes = size_t{1} << 30);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  double measure(int repeats = 3);

 private:
  ThreadPool& pool_;
  uint64_t* words_ = nullptr;
  size_t n_words_ = 0;
};

// One probe, measured once.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 3);

}  // namespace hetmoe::cpu
