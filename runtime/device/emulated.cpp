// The emulated device (runtime/device/device.h): host memory behind a capacity limit, a worker thread per stream,
// copies counted and optionally throttled, ops computed by host_ops (the host device's code) on the stream's thread.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/device/allocations.h"
#include "runtime/device/device.h"
#include "runtime/device/host_ops.h"
#include "runtime/error.h"

namespace hetmoe::device {
namespace {

// One stream: its queue of work, run in order by its own thread.
class StreamWorker {
 public:
  StreamWorker() : thread_([this] { loop(); }) {}
  ~StreamWorker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Queues fn; returns its sequence number (1, 2, ...).
  uint64_t enqueue(std::function<void()> fn) {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(fn));
    cv_.notify_all();
    return ++queued_;
  }
  uint64_t queued() {
    std::lock_guard lock(mutex_);
    return queued_;
  }
  uint64_t done() {
    std::lock_guard lock(mutex_);
    return done_;
  }
  // Blocks until work item `sequence` has run; rethrows (and clears) the stream's first failure when `rethrow`.
  void wait_for(uint64_t sequence, bool rethrow = true) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_ >= sequence; });
    if (rethrow && error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr failure;
      try {
        fn();
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (failure && !error_) error_ = failure;
      ++done_;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t queued_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members above exist
};

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(const EmulatedOptions& opt) : opt_(opt) {}
  ~EmulatedDevice() override {
    streams_.clear();  // each worker finishes its queue, then stops
    for (void* ptr : allocations_.addresses()) ::operator delete (ptr, std::align_val_t{64});
  }

  std::string name() const override {
    std::string link = opt_.link_gb_s > 0
                           ? fmt::format(", link {:.1f} GB/s + {:.0f} us", opt_.link_gb_s, opt_.link_latency_us)
                           : ", unthrottled link";
    const double gb = static_cast<double>(opt_.capacity) / 1e9;
    return gb >= 1 ? fmt::format("emulated ({:.1f} GB{})", gb, link)
                   : fmt::format("emulated ({:.1f} MB{})", gb * 1e3, link);
  }
  bool emulated() const override { return true; }
  size_t capacity() const override { return opt_.capacity; }
  bool supports(quant::GgmlType) const override { return true; }
  size_t used() const override { return allocations_.used(); }

  void* allocate(size_t bytes) override {
    // Checked before the host allocation (a request past the capacity must not reach operator new), and again by
    // add() against concurrent allocations.
    auto too_big = [&] {
      fail("emulated device: {} more bytes do not fit ({} of {} in use)", bytes, allocations_.used(), opt_.capacity);
    };
    if (bytes > opt_.capacity - std::min(opt_.capacity, allocations_.used())) too_big();
    void* p = ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{64});
    if (!allocations_.add(p, bytes, opt_.capacity)) {
      ::operator delete (p, std::align_val_t{64});
      too_big();
    }
    return p;
  }
  void release(void* ptr) override {
    allocations_.remove(ptr, "emulated device");
    ::operator delete (ptr, std::align_val_t{64});
  }

  void* allocate_host(size_t bytes) override {
    return ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{64});
  }
  void release_host(void* ptr) override { ::operator delete (ptr, std::align_val_t{64}); }

  int create_stream() override {
    std::lock_guard lock(mutex_);
    streams_.push_back(std::make_unique<StreamWorker>());
    return static_cast<int>(streams_.size()) - 1;
  }

  void copy_to_device(int stream, void* dst, const void* src, size_t bytes) override {
    copy(stream, dst, src, bytes, true);
  }
  void copy_to_host(int stream, void* dst, const void* src, size_t bytes) override {
    copy(stream, dst, src, bytes, false);
  }

  // Each op is queued as a call of host_ops, the host device's own computation, on the stream's thread (a pool of one).
  using Device::matmul;
  void matmul(int stream, const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
              int64_t ldy) override {
    worker(stream).enqueue([=, this] { host_ops::matmul(one_thread_, w, x, ldx, n, y, ldy); });
  }
  void matmul_heads(int stream, const DeviceMatrix& w, const cpu::HeadsLayout& layout, const float* x, int64_t n,
                    float* y) override {
    worker(stream).enqueue([=, this] { host_ops::matmul_heads(one_thread_, w, layout, x, n, y); });
  }
  void silu_mul(int stream, const float* gate, const float* up, int64_t n, float* out) override {
    worker(stream).enqueue([=] { host_ops::silu_mul(gate, up, n, out); });
  }
  void add_bias(int stream, const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy) override {
    worker(stream).enqueue([=] { host_ops::add_bias(bias, width, n_rows, y, ldy); });
  }
  void layer_norm(int stream, const float* x, int64_t ldx, const float* weight, const float* bias, int64_t n_rows,
                  int64_t width, float eps, float* y, int64_t ldy) override {
    worker(stream).enqueue([=] { host_ops::layer_norm(x, ldx, weight, bias, n_rows, width, eps, y, ldy); });
  }
  void indexer_select(int stream, const cpu::IndexerInput& in, int64_t n_tokens, int64_t pos0,
                      int32_t* selected) override {
    worker(stream).enqueue([=, this] { cpu::indexer_select(in, n_tokens, pos0, selected, nullptr, one_thread_); });
  }
  void add(int stream, const float* x, int64_t n, float* y) override {
    worker(stream).enqueue([=] { host_ops::add(x, n, y); });
  }
  void rms_norm(int stream, const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width, float eps,
                float* y, int64_t ldy) override {
    worker(stream).enqueue([=] { host_ops::rms_norm(x, ldx, weight, n_rows, width, eps, y, ldy); });
  }
  void rope(int stream, const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride,
            int64_t head_stride, int n_dims, bool neox) override {
    worker(stream).enqueue(
        [=] { host_ops::rope(table, x, n_tokens, n_heads, token_stride, head_stride, n_dims, neox); });
  }
  void attention(int stream, const cpu::AttentionShape& shape, const cpu::AttentionInput& in, int64_t n_tokens,
                 int64_t pos0, float* out) override {
    worker(stream).enqueue([=, this] { cpu::causal_attention(shape, in, n_tokens, pos0, out, one_thread_); });
  }
  void short_conv_silu(int stream, const cpu::ShortConv& conv, const float* x, int64_t ldx, int64_t n, float* state,
                       float* y, int64_t ldy) override {
    worker(stream).enqueue([=] { cpu::short_conv_silu(conv, x, ldx, n, state, y, ldy); });
  }
  void gated_delta_net(int stream, const cpu::DeltaNetShape& shape, const cpu::DeltaNetInput& in, int64_t n,
                       float* state, float* out, int64_t ldo) override {
    worker(stream).enqueue([=, this] { cpu::gated_delta_net(shape, in, n, state, out, ldo, one_thread_); });
  }
  void hyper_pre(int stream, const cpu::HyperConnection& hc, const float* mix, int64_t ldm, const float* x,
                 int64_t width, int64_t n, float* coef, float* out) override {
    worker(stream).enqueue([=, this] { cpu::hyper_pre(hc, mix, ldm, x, width, n, coef, out, one_thread_); });
  }
  void hyper_post(int stream, const cpu::HyperConnection& hc, const float* coef, const float* y, const float* x,
                  int64_t width, int64_t n, float* x_new) override {
    worker(stream).enqueue([=, this] { cpu::hyper_post(hc, coef, y, x, width, n, x_new, one_thread_); });
  }
  void compress(int stream, const cpu::Compressor& c, const float* kv, const float* score, int64_t ld, int64_t n,
                int64_t pos0, float* state, float* out) override {
    worker(stream).enqueue([=, this] { cpu::compress(c, kv, score, ld, n, pos0, state, out, one_thread_); });
  }
  void gated_rms_norm(int stream, const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz,
                      int64_t n_rows, int64_t width, float eps, float* y, int64_t ldy) override {
    worker(stream).enqueue([=] { host_ops::gated_rms_norm(x, ldx, weight, z, ldz, n_rows, width, eps, y, ldy); });
  }
  void sigmoid_mul(int stream, const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y,
                   int64_t ldy) override {
    worker(stream).enqueue([=] { host_ops::sigmoid_mul(gate, ldg, n_rows, width, y, ldy); });
  }
  void copy_rows(int stream, const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst,
                 int64_t ldd) override {
    worker(stream).enqueue([=] { host_ops::copy_rows(src, lds, n_rows, width, dst, ldd); });
  }
  void gather_rows(int stream, const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) override {
    worker(stream).enqueue([=] { host_ops::gather_rows(src, width, rows, n, dst); });
  }
  void combine_rows(int stream, const float* src, int64_t width, const int32_t* index, const float* weights, int64_t n,
                    int64_t k, float* dst) override {
    worker(stream).enqueue([=] { host_ops::combine_rows(src, width, index, weights, n, k, dst); });
  }
  void select_experts(int stream, const cpu::ExpertSelection& p, float* logits, const float* bias, int64_t n,
                      int32_t* ids, float* weights) override {
    worker(stream).enqueue([=] { host_ops::select_experts(p, logits, bias, n, ids, weights); });
  }
  bool selects_experts(int64_t, int64_t) const override { return true; }
  void host_callback(int stream, std::function<void()> fn) override { worker(stream).enqueue(std::move(fn)); }

  Event record(int stream) override { return {stream, worker(stream).queued()}; }
  bool reached(Event event) override { return worker(event.stream).done() >= event.sequence; }
  void wait(int stream, Event event) override {
    StreamWorker& other = worker(event.stream);
    worker(stream).enqueue([&other, event] { other.wait_for(event.sequence, /*rethrow=*/false); });
  }
  void synchronize(Event event) override { worker(event.stream).wait_for(event.sequence); }
  void synchronize() override {
    std::vector<StreamWorker*> all;
    {
      std::lock_guard lock(mutex_);
      for (auto& s : streams_) all.push_back(s.get());
    }
    for (StreamWorker* s : all) s->wait_for(s->queued());
  }

  TransferStats transfers() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  StreamWorker& worker(int stream) {
    std::lock_guard lock(mutex_);
    if (stream < 0 || stream >= static_cast<int>(streams_.size()))
      throw std::logic_error(fmt::format("emulated device: no stream {}", stream));
    return *streams_[static_cast<size_t>(stream)];
  }

  void copy(int stream, void* dst, const void* src, size_t bytes, bool to_device) {
    worker(stream).enqueue([this, dst, src, bytes, to_device] {
      // One link per direction, shared by all streams (as PCIe is): copies the same way take turns.
      std::lock_guard link(to_device ? link_to_device_ : link_to_host_);
      // The copy takes the modelled time (latency + bytes / bandwidth), the memcpy included: the thread sleeps what
      // the memcpy left of it.
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(dst, src, bytes);
      double seconds = 0;
      if (opt_.link_gb_s > 0) {
        seconds = opt_.link_latency_us * 1e-6 + static_cast<double>(bytes) / (opt_.link_gb_s * 1e9);
        std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                  std::chrono::duration<double>(seconds)));
      }
      std::lock_guard lock(mutex_);
      (to_device ? stats_.to_device_bytes : stats_.to_host_bytes) += bytes;
      ++(to_device ? stats_.to_device_copies : stats_.to_host_copies);
      stats_.link_seconds += seconds;
    });
  }

  const EmulatedOptions opt_;
  cpu::ThreadPool one_thread_{1};  // the ops' pool: a stream computes on its own thread
  mutable std::mutex mutex_;
  std::mutex link_to_device_, link_to_host_;
  Allocations allocations_;
  TransferStats stats_;
  std::vector<std::unique_ptr<StreamWorker>> streams_;
};

}  // namespace

std::unique_ptr<Device> make_emulated_device(const EmulatedOptions& opt) {
  return std::make_unique<EmulatedDevice>(opt);
}

}  // namespace hetmoe::device
