#include "cpu_kernels/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>

namespace hetmoe::cpu {
namespace {

// Sums 64-bit words with four independent accumulators so the loop is bound by loads, not by the add chain.
uint64_t read_slice(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

}  // namespace

double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeats) {
  const size_t words = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[words]);
  // First touch from the pool's threads, so each slice's pages sit where the thread that reads it runs.
  pool.parallel_for(static_cast<int64_t>(words), 1 << 16, [&](int64_t b, int64_t e) {
    std::memset(buffer.get() + b, 1, static_cast<size_t>(e - b) * sizeof(uint64_t));
  });
  double best = 0;
  std::atomic<uint64_t> sink{0};
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(words), 1 << 16, [&](int64_t b, int64_t e) {
      sink += read_slice(buffer.get() + b, static_cast<size_t>(e - b));  // keeps the reads from being optimised away
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds);
  }
  volatile uint64_t keep = sink.load();
  (void)keep;
  return best;
}

}  // namespace hetmoe::cpu
