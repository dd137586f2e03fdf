#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {

// `bytes` rounded up to whole 2 MB pages (one at least), 2 MB aligned and advised into transparent huge pages where
// they are allowed, as a model file's weights are mapped: a stream through it pays no TLB miss every 4 kB. Not
// touched. Throws std::bad_alloc.
class HugePageBuffer {
 public:
  explicit HugePageBuffer(size_t bytes);
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<uint8_t, decltype(&std::free)> data_{nullptr, &std::free};
  size_t size_ = 0;
};

// DRAM read bandwidth in bytes per second with the pool's threads: each thread streams its slice of a buffer much
// larger than the last-level cache with the selected tier's stream reads (KernelTable::stream_sum: 32-byte loads on
// x86); the best of `repeats` passes counts. The buffer is allocated and first touched once, by the threads that read
// it, in 2 MB pages where transparent huge pages allow (as a model file's weights are mapped), so that a benchmark
// measuring after every run pays for the reads only, not for a gigabyte of page faults each time.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(ThreadPool& pool, size_t bytes = size_t{1} << 30);

  double measure(int repeats = 3);

 private:
  ThreadPool& pool_;
  HugePageBuffer buffer_;
  uint64_t* words_ = nullptr;
  size_t n_words_ = 0;
};

// One probe, measured once.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 3);

}  // namespace hetmoe::cpu
