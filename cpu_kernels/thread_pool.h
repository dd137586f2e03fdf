#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hetmoe::cpu {

// A fixed set of worker threads that run one parallel loop at a time. The caller's thread takes part, so a
// pool of n threads starts n-1 workers and a pool of 1 runs everything inline (deterministic and cheap).
class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, one chunk per
  // thread at most. Returns when all chunks are done; the first exception thrown by a chunk is rethrown here.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace hetmoe::cpu
