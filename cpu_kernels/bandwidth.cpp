#include "cpu_kernels/bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "cpu_kernels/kernel_table.h"

namespace hetmoe::cpu {

HugePageBuffer::HugePageBuffer(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  size_ = std::max(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kHugePage, size_)));
  if (!data_) throw std::bad_alloc();
  (void)::madvise(data_.get(), size_, MADV_HUGEPAGE);  // a hint: without huge pages the buffer is in 4 KB pages
}

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool& pool, size_t bytes)
    : pool_(pool),
      buffer_(bytes),
      words_(reinterpret_cast<uint64_t*>(buffer_.data())),
      n_words_(buffer_.size() / sizeof(uint64_t)) {
  // First touch from the pool's threads, so each slice's pages sit where the thread that reads it runs. Distinct
  // words, so that no page of the buffer equals another.
  pool_.parallel_for(static_cast<int64_t>(n_words_), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) words_[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL;
  });
}

double ReadBandwidthProbe::measure(int repeats) {
  double best = 0;
  std::atomic<uint64_t> sink{0};
  const StreamSumFn stream_sum = kernels().stream_sum;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    pool_.parallel_for(static_cast<int64_t>(n_words_), 1 << 16, [&](int64_t b, int64_t e) {
      sink += stream_sum(words_ + b, static_cast<size_t>(e - b));  // keeps the reads from being optimised away
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(n_words_ * sizeof(uint64_t)) / seconds);
  }
  volatile uint64_t keep = sink.load();
  (void)keep;
  return best;
}

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeats) {
  return ReadBandwidthProbe(pool, bytes).measure(repeats);
}

}  // namespace hetmoe::cpu
