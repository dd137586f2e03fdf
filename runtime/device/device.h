#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "cpu_kernels/hyper_connection.h"
#include "cpu_kernels/linear_attention.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/thread_pool.h"
#include "quant/ggml_type.h"

namespace hetmoe::device {

// What moved between host and device, and for the emulated device how long the modelled link took.
struct TransferStats {
  uint64_t to_device_bytes = 0, to_host_bytes = 0;
  uint64_t to_device_copies = 0, to_host_copies = 0;
  double link_seconds = 0;  // time the copies held the (modelled or real) link
};

// A matrix of rows in device memory (the device's copy of GGUF rows: W^Q of an expert, say).
struct DeviceMatrix {
  quant::GgmlType type = quant::GgmlType::F32;
  int64_t n_cols = 0, n_rows = 0;
  size_t row_bytes = 0;
  const void* data = nullptr;  // device memory

  // Rows [first, first + count) (one head's rows of a per-head tensor), as cpu::WeightMatrix::rows.
  DeviceMatrix rows(int64_t first, int64_t count) const {
    return {type, n_cols, count, row_bytes, static_cast<const uint8_t*>(data) + first * row_bytes};
  }
};

// An event: a point in one stream's work, reached when everything queued on that stream before it has run.
struct Event {
  int stream = -1;
  uint64_t sequence = 0;
};

// Where a forward pass and its weights run: the host (the CPU itself), the emulated GPU stand-in or a CUDA GPU. Work is
// queued on streams and runs in order within a stream; streams run concurrently; events order work across streams and
// with the host. Copies and ops are asynchronous: they return once queued, and the memory they touch must stay valid
// until an event after them is reached (the host device runs each at once, on the calling thread). Memory is limited
// to capacity(); allocate() fails with hetmoe::Error when the request does not fit.
class Device {
 public:
  virtual ~Device() = default;

  // "emulated (...)" for the emulated device: everything printed about work on it says so.
  virtual std::string name() const = 0;
  virtual bool emulated() const = 0;
  // The CPU itself: device memory is host memory and weights are used where they lie (the mapped file), so nothing
  // is copied to put them "on" it.
  virtual bool is_host() const { return false; }
  virtual size_t capacity() const = 0;
  virtual size_t used() const = 0;
  // Whether matmul() takes weights of this type (the CUDA device: the low-bit W^Q types).
  virtual bool supports(quant::GgmlType type) const = 0;

  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  // Host memory the device copies from and to at full speed without staging (CUDA: page-locked).
  virtual void* allocate_host(size_t bytes) = 0;
  virtual void release_host(void* ptr) = 0;

  // A new stream's id (streams live as long as the device).
  virtual int create_stream() = 0;
  virtual void copy_to_device(int stream, void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(int stream, void* dst, const void* src, size_t bytes) = 0;
  // y[t][r] = w.row(r) . x[t] for t < n (x: n rows of w.n_cols floats, y: n rows of w.n_rows floats, both on the
  // device). Every weight type of the CPU reference is accepted; the W^Q types are the ones that matter.
  void matmul(int stream, const DeviceMatrix& w, const float* x, int64_t n, float* y) {
    matmul(stream, w, x, w.n_cols, n, y, w.n_rows);
  }
  // The same with token t's activations at x + t * ldx and its outputs at y + t * ldy (one head of a batch of heads,
  // say).
  virtual void matmul(int stream, const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                      int64_t ldy) = 0;
  // Matrices over the same n rows of x (each row w.n_cols floats, all widths equal): outs[i].y gets
  // outs[i].w's matmul (ldy = its n_rows). By default one matmul each; the host shares one loop between them.
  struct MatmulOutput {
    DeviceMatrix w;
    float* y = nullptr;
  };
  virtual void matmuls(int stream, std::span<const MatmulOutput> outs, const float* x, int64_t n) {
    for (const MatmulOutput& o : outs) matmul(stream, o.w, x, n, o.y);
  }
  // Per-head matrices in one call (MLA's attn_k_b / attn_v_b), as cpu::matmul_heads defines it: w holds
  // layout.n_heads blocks of w.n_rows / n_heads rows, head h of token t reads x + t * x_token_stride + h *
  // x_head_stride and writes y + t * y_token_stride + h * y_head_stride. By default one strided matmul per head.
  virtual void matmul_heads(int stream, const DeviceMatrix& w, const cpu::HeadsLayout& layout, const float* x,
                            int64_t n, float* y) {
    const int64_t rows = w.n_rows / layout.n_heads;
    for (int64_t h = 0; h < layout.n_heads; ++h)
      matmul(stream, w.rows(h * rows, rows), x + h * layout.x_head_stride, layout.x_token_stride, n,
             y + h * layout.y_head_stride, layout.y_token_stride);
  }
  // out[i] = silu(gate[i]) * up[i] for i < n (device memory).
  virtual void silu_mul(int stream, const float* gate, const float* up, int64_t n, float* out) = 0;
  // y[i] += x[i] for i < n (device memory).
  virtual void add(int stream, const float* x, int64_t n, float* y) = 0;
  // Row r of y (at y + r * ldy) += bias, `width` values per row: a projection's bias on every token (device memory).
  virtual void add_bias(int stream, const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy) = 0;
  // Row r of y = cpu::layer_norm(row r of x) with weight and bias (either may be null); y may alias x.
  virtual void layer_norm(int stream, const float* x, int64_t ldx, const float* weight, const float* bias,
                          int64_t n_rows, int64_t width, float eps, float* y, int64_t ldy) = 0;
  // cpu::indexer_select (DeepSeek-V3.2's key selection); selected [n_tokens][top_k] int32, device memory.
  virtual void indexer_select(int stream, const cpu::IndexerInput& in, int64_t n_tokens, int64_t pos0,
                              int32_t* selected) = 0;

  // The layer ops of a forward pass on the device, each as the CPU's cpu_kernels/ops.h defines it; all pointers are
  // device memory.
  // Row r of y (at y + r * ldy) = rms_norm(row r of x) * weight, `width` values per row; y may alias x.
  virtual void rms_norm(int stream, const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width,
                        float eps, float* y, int64_t ldy) = 0;
  // Rotates head h of token t, at x + t * token_stride + h * head_stride, by the cos/sin of row t of `table`
  // ([n_tokens][n_dims], as cpu::rope_cache computes it on the host) in the pairing of `neox`.
  virtual void rope(int stream, const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride,
                    int64_t head_stride, int n_dims, bool neox) = 0;
  // cpu::causal_attention: the queries of tokens at positions pos0.. against cache positions 0..pos0+t.
  virtual void attention(int stream, const cpu::AttentionShape& shape, const cpu::AttentionInput& in, int64_t n_tokens,
                         int64_t pos0, float* out) = 0;
  // Qwen3.5's Gated DeltaNet: cpu::short_conv_silu and cpu::gated_delta_net, their states in device memory.
  virtual void short_conv_silu(int stream, const cpu::ShortConv& conv, const float* x, int64_t ldx, int64_t n,
                               float* state, float* y, int64_t ldy) = 0;
  virtual void gated_delta_net(int stream, const cpu::DeltaNetShape& shape, const cpu::DeltaNetInput& in, int64_t n,
                               float* state, float* out, int64_t ldo) = 0;
  // DeepSeek-V4: cpu::hyper_pre, cpu::hyper_post and cpu::compress (its state ring in device memory).
  virtual void hyper_pre(int stream, const cpu::HyperConnection& hc, const float* mix, int64_t ldm, const float* x,
                         int64_t width, int64_t n, float* coef, float* out) = 0;
  virtual void hyper_post(int stream, const cpu::HyperConnection& hc, const float* coef, const float* y, const float* x,
                          int64_t width, int64_t n, float* x_new) = 0;
  virtual void compress(int stream, const cpu::Compressor& c, const float* kv, const float* score, int64_t ld,
                        int64_t n, int64_t pos0, float* state, float* out) = 0;
  // Row r of y = cpu::gated_rms_norm(row r of x, weight, row r of z), `width` values per row; y may alias x.
  virtual void gated_rms_norm(int stream, const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz,
                              int64_t n_rows, int64_t width, float eps, float* y, int64_t ldy) = 0;
  // Row r of y (at y + r * ldy) *= sigmoid(row r of gate), `width` values per row (a gated attention's output).
  virtual void sigmoid_mul(int stream, const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y,
                           int64_t ldy) = 0;
  // n_rows rows of `width` floats from src (rows lds apart) to dst (rows ldd apart), device to device.
  virtual void copy_rows(int stream, const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst,
                         int64_t ldd) = 0;
  // dst[i] = src[rows[i]] for i < n: rows of `width` floats; `rows` (int32) in device memory.
  virtual void gather_rows(int stream, const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) = 0;
  // cpu::select_experts for n tokens: logits [n][n_expert] (overwritten with the probabilities), bias [n_expert] or
  // null, ids [n][n_used] (int32) and weights [n][n_used].
  virtual void select_experts(int stream, const cpu::ExpertSelection& p, float* logits, const float* bias, int64_t n,
                              int32_t* ids, float* weights) = 0;
  // Whether select_experts takes a router of this many experts and groups (the CUDA kernel: up to 512 and 64).
  virtual bool selects_experts(int64_t n_expert, int64_t n_group) const = 0;
  // dst[t] = sum over j < k with index[t][j] >= 0 of weights[t][j] * src[index[t][j]] (rows of `width` floats, in
  // j order), for t < n; a row with no index is zero. The weighted sum of each token's expert outputs.
  virtual void combine_rows(int stream, const float* src, int64_t width, const int32_t* index, const float* weights,
                            int64_t n, int64_t k, float* dst) = 0;
  // fn() on a host thread once the stream's earlier work is done; the stream's later work waits for it.
  virtual void host_callback(int stream, std::function<void()> fn) = 0;

  virtual Event record(int stream) = 0;
  // Whether `event` has been reached (everything queued on its stream before it has run), without waiting.
  virtual bool reached(Event event) = 0;
  // The stream's later work waits for `event`.
  virtual void wait(int stream, Event event) = 0;
  // The host waits for `event`, or for everything queued anywhere. Rethrows the first failure of queued work.
  virtual void synchronize(Event event) = 0;
  virtual void synchronize() = 0;

  virtual TransferStats transfers() const = 0;
};

// Device memory owned by an object: released when it goes out of scope.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(Device& device, size_t bytes) : device_(&device), ptr_(device.allocate(bytes)), bytes_(bytes) {}
  ~DeviceMemory() { reset(); }
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    if (this != &other) {
      reset();
      device_ = other.device_;
      ptr_ = other.ptr_;
      bytes_ = other.bytes_;
      other.ptr_ = nullptr;
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void reset() {
    if (ptr_) device_->release(ptr_);
    ptr_ = nullptr;
  }

 private:
  Device* device_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// `mem` with room for at least `bytes` (and 1): when it has to grow, queued work is waited for first (it may still use
// the old buffer) and the contents are not kept. Fails with hetmoe::Error when the device is full.
inline DeviceMemory& grow(Device& device, DeviceMemory& mem, size_t bytes) {
  if (mem.bytes() < bytes || mem.get() == nullptr) {
    device.synchronize();
    mem.reset();
    mem = DeviceMemory(device, std::max<size_t>(bytes, 1));
  }
  return mem;
}

// Bytes rounded up to the 256-byte boundary each matrix of a shared device allocation starts on.
inline size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Work queued on a device that host memory (staging buffers, a caller's arrays) must outlive: wait() waits for it
// and reports its failure; if the scope is left early (an exception on the host side), the destructor still waits,
// so nothing the device copies from or to is freed under it.
class PendingWork {
 public:
  PendingWork(Device& device, int stream) : device_(&device), event_(device.record(stream)) {}
  ~PendingWork() {
    if (!device_) return;
    try {
      device_->synchronize(event_);
    } catch (...) {
      // already leaving because of another failure: that one is reported
    }
  }
  PendingWork(const PendingWork&) = delete;
  PendingWork& operator=(const PendingWork&) = delete;
  void wait() {
    Device* d = device_;
    device_ = nullptr;
    d->synchronize(event_);
  }

 private:
  Device* device_;
  Event event_;
};

// Host staging memory owned by an object: released when it goes out of scope. Grows with reserve().
class HostMemory {
 public:
  explicit HostMemory(Device& device) : device_(&device) {}
  ~HostMemory() { reset(); }
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // At least `floats` floats (earlier contents are not kept when it grows).
  float* reserve(size_t floats) {
    if (bytes_ < floats * sizeof(float)) {
      reset();
      bytes_ = std::max<size_t>(floats, 1) * sizeof(float);
      ptr_ = device_->allocate_host(bytes_);
    }
    return static_cast<float*>(ptr_);
  }
  void reset() {
    if (ptr_) device_->release_host(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  Device* device_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The emulated device's link and size.
struct EmulatedOptions {
  size_t capacity = 24'000'000'000;  // bytes of "device memory" (host memory underneath)
  double link_gb_s = 0;              // throttle copies to this bandwidth (GB/s); 0: no throttle
  double link_latency_us = 0;        // and this latency per copy
};

// A GPU stand-in: host memory with a capacity limit, one worker thread per stream, copies counted and optionally
// throttled to a modelled PCIe link (one per direction, shared by the streams), ops computed with the CPU kernels. Lets
// the split and the scheduler run end to end where there is no GPU.
std::unique_ptr<Device> make_emulated_device(const EmulatedOptions& opt);

// The Device interface's version: the CUDA device library reports the one it was built with, and the loader refuses a
// library of another (raise it whenever this interface or what its methods take changes).
inline constexpr int kDeviceAbi = 5;

// The CPU as a device, computing with `pool` (which must outlive it).
std::unique_ptr<Device> make_host_device(cpu::ThreadPool& pool);

// CUDA GPUs this process can use: 0 without an NVIDIA driver (then nothing is loaded), without a GPU, or when the CUDA
// device library cannot be loaded. The library (libhetmoe_cuda.so: the kernels, cuBLAS, the CUDA runtime) is loaded
// on first use, from HETMOE_CUDA_LIBRARY, next to the executable, its ../lib/hetmoe, or the build tree.
int cuda_device_count();
// The CUDA device `index` (two streams' worth of work at a time is the runtime's use); fails with hetmoe::Error
// saying what is missing: a build without CUDA, a library that does not load (and why), no such GPU.
std::unique_ptr<Device> make_cuda_device(int index);

}  // namespace hetmoe::device
