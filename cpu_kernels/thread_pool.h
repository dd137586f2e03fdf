#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpu_kernels/numa/topology.h"

namespace hetmoe::cpu {

// A range of loop items [front, end) shared out between threads: its owner takes pieces from the front, threads done
// with their own take pieces from the back, by compare-exchange on one packed word (front << 32 | end, so items
// below 2^32); on a cache line of its own. A plain word under std::atomic_ref, so arrays of claims can live in
// reusable scratch memory.
struct alignas(64) RangeClaim {
  uint64_t range = 0;
  int64_t node = 0;  // the NUMA node whose threads take from it

  void reset(int64_t begin, int64_t end, int64_t on_node) {
    std::atomic_ref<uint64_t>(range).store(static_cast<uint64_t>(begin) << 32 | static_cast<uint64_t>(end),
                                           std::memory_order_relaxed);
    node = on_node;
  }
  // A piece into [begin, end) of piece(left, from_back) items (clamped to 1 .. left), from the front or the back;
  // false once the range is empty.
  template <typename Piece>
  bool take(bool from_back, const Piece& piece, int64_t& begin, int64_t& end) {
    std::atomic_ref<uint64_t> word(range);
    uint64_t seen = word.load(std::memory_order_acquire);
    for (;;) {
      const auto front = static_cast<int64_t>(seen >> 32), last = static_cast<int64_t>(seen & 0xffffffffu);
      if (front >= last) return false;
      const int64_t left = last - front;
      const int64_t n = std::clamp<int64_t>(piece(left, from_back), 1, left);
      const int64_t b = from_back ? last - n : front;
      const uint64_t next = from_back ? static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(b)
                                      : static_cast<uint64_t>(b + n) << 32 | static_cast<uint64_t>(last);
      if (word.compare_exchange_weak(seen, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
        begin = b;
        end = b + n;
        return true;
      }
    }
  }
};

// Thread `thread`'s part of a loop shared out by claims (one per thread): fn(begin, end) over the pieces of its own
// claim from the front, then over the back of every other claim of its node, until none of them has items left.
// Every item runs exactly once.
template <typename Piece, typename Fn>
void run_claims(std::span<RangeClaim> claims, int64_t thread, const Piece& piece, Fn&& fn) {
  RangeClaim& own = claims[static_cast<size_t>(thread)];
  int64_t begin = 0, end = 0;
  while (own.take(false, piece, begin, end)) fn(begin, end);
  const auto n = static_cast<int64_t>(claims.size());
  for (int64_t i = 1; i < n; ++i) {
    RangeClaim& other = claims[static_cast<size_t>((thread + i) % n)];
    if (other.node != own.node) continue;
    while (other.take(true, piece, begin, end)) fn(begin, end);
  }
}

// A non-owning reference to a callable taking a row range: parallel_for's argument. Unlike std::function it never
// allocates (a lambda capturing more than two references would), so a decode step's hundreds of parallel loops
// allocate nothing. The callable must outlive the call, which a parallel_for argument always does.
class RangeFn {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT(google-explicit-constructor): lambdas convert implicitly, as to std::function
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(o))(b, e); }) {}
  void operator()(int64_t begin, int64_t end) const { call_(object_, begin, end); }

 private:
  void* object_;
  void (*call_)(void*, int64_t, int64_t);
};

// A fixed set of worker threads that run one parallel loop at a time. The caller's thread takes part, so a
// pool of n threads starts n-1 workers and a pool of 1 runs everything inline (deterministic and cheap).
//
// Decode issues a hundred or more short loops per token, so waking a sleeping thread (tens of microseconds
// through the kernel) would cost more than some loops. Workers and the caller therefore spin on atomics for a
// short while before they sleep on a condition variable, and take no lock while both sides spin: back-to-back loops
// hand over in about a microsecond between two cores of this VM (an empty loop 1.2-1.5 -> 0.9-1.0 us without the
// mutex; one cache line's round trip between its cores is 0.4-0.6 us), and an idle pool still sleeps.
class ThreadPool {
 public:
  // With `pus`, worker i (i >= 1) pins itself to pus[i]; the caller's thread (0) is left where it is.
  explicit ThreadPool(int n_threads, std::vector<int> pus = {});
  // One thread per entry of the placement, pinned there; node-aware code reads the placement back.
  explicit ThreadPool(ThreadPlacement placement);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Where the threads run by NUMA node; null for a pool built without a placement (then: one node, all threads).
  const ThreadPlacement* placement() const { return placement_.pus.empty() ? nullptr : &placement_; }

  // Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, one chunk per
  // thread at most. Returns when all chunks are done; the first exception thrown by a chunk is rethrown here.
  void parallel_for(int64_t n, int64_t grain, RangeFn fn);
  // As parallel_for, for loops whose items are independent of each other (the result may not depend on the split):
  // each thread takes its chunk in pieces from the front, and a thread done with its own takes pieces from the back
  // of the other chunks of its NUMA node, so the loop ends together when threads run at different speeds (a VM's
  // vCPUs, a core busy with something else) and a chunk's items stay on their node. Pieces shrink with what is left
  // (a quarter of it for the owner, half for another thread, at least `grain` items), so the threads end within a
  // small piece of each other. Every item runs exactly once.
  void parallel_for_balanced(int64_t n, int64_t grain, RangeFn fn);

 private:
  void worker(int index, int pu);
  void run_chunk(int index);

  int n_threads_;
  ThreadPlacement placement_;
  std::vector<std::thread> workers_;
  std::unique_ptr<RangeClaim[]> claims_;  // one per thread, for parallel_for_balanced

  // The current loop, published by the increment of generation_; one cache line that the caller writes and the
  // workers read once per loop.
  alignas(64) const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers that have not finished the current loop
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};  // a chunk threw: error_ holds the first exception

  // The sleeping side. A loop takes the mutex only when a thread sleeps (the flags below say so, read after the
  // loop's own store) or a chunk threw: a hand-over between spinning threads is two cache-line transfers each way.
  alignas(64) std::mutex mutex_;  // guards the sleeps and error_
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::exception_ptr error_;
};

// One step of a wait on another thread: the CPU's spin-wait hint (PAUSE on x86), else a yield.
void cpu_relax();

// A thread count: `requested` when at least 1, else one per hardware thread the OS reports (at least 1).
int resolve_threads(int requested);

}  // namespace hetmoe::cpu
