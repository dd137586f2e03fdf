#include "cpu_kernels/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "cpu_kernels/numa/topology.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hetmoe::cpu {
namespace {

// Spinning lasts about 100 microseconds before a thread sleeps: longer than the gap between two loops of one
// decode step, far shorter than a step.
constexpr auto kSpinTime = std::chrono::microseconds(100);

// Spins until done() or the spin time is over; returns done().
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return done();
  }
}

void chunk_range(int64_t n, int chunks, int index, int64_t* begin, int64_t* end) {
  const int64_t base = n / chunks, extra = n % chunks;
  *begin = index * base + std::min<int64_t>(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

}  // namespace

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

ThreadPool::ThreadPool(int n_threads, std::vector<int> pus) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) {
    const int pu = static_cast<size_t>(i) < pus.size() ? pus[static_cast<size_t>(i)] : -1;
    workers_.emplace_back([this, i, pu] { worker(i, pu); });
  }
}

ThreadPool::ThreadPool(ThreadPlacement placement) : ThreadPool(static_cast<int>(placement.pus.size()), placement.pus) {
  placement_ = std::move(placement);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) {
  if (index >= job_chunks_) return;
  int64_t begin, end;
  chunk_range(job_n_, job_chunks_, index, &begin, &end);
  try {
    (*job_)(begin, end);
  } catch (...) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::current_exception();
    failed_.store(true, std::memory_order_release);
  }
}

// Sleeping and waking without a lost wake-up, and without the mutex while both sides spin: a sleeper announces
// itself (sleeping_workers_, caller_sleeping_) under the mutex and then checks its condition; the other side changes
// the condition and then reads the announcement, all sequentially consistent, so at least one of them sees the
// other's store: either the sleeper finds its condition true, or the other side takes the mutex and notifies.
void ThreadPool::worker(int index, int pu) {
  if (pu >= 0) pin_current_thread(pu);  // refused pinning leaves the thread free, which still works
  uint64_t seen = 0;
  for (;;) {
    // Spin first, then sleep until a new loop is published or the pool stops.
    spin_until(
        [&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_relaxed); });
    uint64_t now = generation_.load(std::memory_order_acquire);
    if (now == seen) {
      std::unique_lock lock(mutex_);
      sleeping_workers_.fetch_add(1);
      start_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      sleeping_workers_.fetch_sub(1);
      now = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire) && now == seen) return;
    seen = now;
    run_chunk(index);
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int chunks = static_cast<int>(std::min<int64_t>(n_threads_, max_chunks));
  if (chunks == 1) {
    fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1);
  if (sleeping_workers_.load() > 0) {
    std::lock_guard lock(mutex_);
    start_cv_.notify_all();
  }

  std::exception_ptr own_error;
  try {
    run_chunk(0);
  } catch (...) {
    own_error = std::current_exception();
  }
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock lock(mutex_);
    caller_sleeping_.store(true);
    done_cv_.wait(lock, [&] { return pending_.load() == 0; });
    caller_sleeping_.store(false);
  }
  // A worker's error_ and failed_ were stored before its pending_ decrement, which the load above acquired.
  if (!own_error && !failed_.load(std::memory_order_acquire)) return;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = own_error ? own_error : error_;
    error_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
  }
  std::rethrow_exception(error);
}

void ThreadPool::parallel_for_balanced(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int chunks = static_cast<int>(std::min<int64_t>(n_threads_, std::max<int64_t>(1, n / grain)));
  if (chunks == 1 || n >= (int64_t{1} << 31)) return parallel_for(n, grain, fn);  // packed bounds take 32 bits
  if (!claims_) claims_ = std::make_unique<RangeClaim[]>(static_cast<size_t>(n_threads_));
  for (int t = 0; t < n_threads_; ++t) {
    int64_t begin = 0, end = 0;
    if (t < chunks) chunk_range(n, chunks, t, &begin, &end);
    claims_[t].reset(begin, end,
                     static_cast<size_t>(t) < placement_.nodes.size() ? placement_.nodes[static_cast<size_t>(t)] : 0);
  }
  // Pieces shrink with what is left of a chunk: its owner takes a quarter of it, a thread done with its own half
  // (at least `grain` either way), so the threads end within a small piece of each other.
  const std::span<RangeClaim> claims(claims_.get(), static_cast<size_t>(n_threads_));
  parallel_for(n_threads_, 1, [&](int64_t thread, int64_t) {
    run_claims(
        claims, thread,
        [grain](int64_t left, bool from_back) { return std::max(grain, from_back ? left / 2 : left / 4); }, fn);
  });
}

int resolve_threads(int requested) {
  if (requested >= 1) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace hetmoe::cpu
