// The CUDA device: the Device interface over gpu_kernels' launch API. Compiled only in CUDA builds, into the shared
// library libhetmoe_cuda.so with the kernels, cuBLAS and the CUDA runtime; the hetmoe binary loads it at run time
// (cuda_loader.cpp), so it links none of them and runs where they are missing.
#include <fmt/format.h>

#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "gpu_kernels/gpu.h"
#include "quant/lowbit.h"
#include "runtime/device/allocations.h"
#include "runtime/device/device.h"
#include "runtime/error.h"

namespace hetmoe::device {
namespace {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index) {
    gpu::set_device(index_);
    name_ = fmt::format("cuda:{} {}", index_, gpu::device_name(index_));
    capacity_ = gpu::total_memory(index_);
    events_.resize(kEvents);
    for (gpu::EventHandle& e : events_) e = gpu::create_event();
  }
  ~CudaDevice() override {
    try {
      gpu::set_device(index_);
      for (gpu::Stream s : streams_) gpu::stream_synchronize(s);
      for (void* ptr : allocations_.addresses()) gpu::free_device(ptr);
      for (gpu::Stream s : streams_) gpu::destroy_stream(s);
      for (gpu::EventHandle e : events_) gpu::destroy_event(e);
    } catch (const std::exception&) {
      // a broken context at exit: nothing left to release
    }
  }

  std::string name() const override { return name_; }
  bool emulated() const override { return false; }
  size_t capacity() const override { return capacity_; }
  size_t used() const override { return allocations_.used(); }
  bool supports(quant::GgmlType type) const override {
    return quant::lowbit_format(type).has_value() || gpu::block_matmul_supports(type);
  }

  void* allocate(size_t bytes) override {
    gpu::set_device(index_);
    void* p = nullptr;
    try {
      p = gpu::malloc_device(std::max<size_t>(bytes, 1));
    } catch (const std::runtime_error& e) {
      fail("{}: {} bytes do not fit ({})", name_, bytes, e.what());
    }
    allocations_.add(p, bytes);
    return p;
  }
  void release(void* ptr) override {
    allocations_.remove(ptr, "cuda device");
    gpu::free_device(ptr);
  }

  void* allocate_host(size_t bytes) override {
    gpu::set_device(index_);
    try {
      return gpu::malloc_pinned(std::max<size_t>(bytes, 1));
    } catch (const std::runtime_error& e) {
      fail("{}: {} bytes of pinned host memory: {}", name_, bytes, e.what());
    }
  }
  void release_host(void* ptr) override { gpu::free_pinned(ptr); }

  int create_stream() override {
    gpu::set_device(index_);
    std::lock_guard lock(mutex_);
    streams_.push_back(gpu::create_stream());
    return static_cast<int>(streams_.size()) - 1;
  }

  void copy_to_device(int stream, void* dst, const void* src, size_t bytes) override {
    gpu::copy_to_device_async(dst, src, bytes, s(stream));
    std::lock_guard lock(mutex_);
    stats_.to_device_bytes += bytes;
    ++stats_.to_device_copies;
  }
  void copy_to_host(int stream, void* dst, const void* src, size_t bytes) override {
    gpu::copy_to_host_async(dst, src, bytes, s(stream));
    std::lock_guard lock(mutex_);
    stats_.to_host_bytes += bytes;
    ++stats_.to_host_copies;
  }
  using Device::matmul;
  void matmul(int stream, const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
              int64_t ldy) override {
    products(stream, w, w.n_rows, x, ldx, n, y, ldy, {});
  }
  // Every head in one launch.
  void matmul_heads(int stream, const DeviceMatrix& w, const cpu::HeadsLayout& layout, const float* x, int64_t n,
                    float* y) override {
    products(stream, w, w.n_rows / layout.n_heads, x, layout.x_token_stride, n, y, layout.y_token_stride,
             {.count = layout.n_heads, .x_stride = layout.x_head_stride, .y_stride = layout.y_head_stride});
  }
  void silu_mul(int stream, const float* gate, const float* up, int64_t n, float* out) override {
    gpu::silu_mul(gate, up, n, out, s(stream));
  }
  void add(int stream, const float* x, int64_t n, float* y) override { gpu::add(x, n, y, s(stream)); }
  void add_bias(int stream, const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy) override {
    gpu::add_bias(bias, width, n_rows, y, ldy, s(stream));
  }
  void layer_norm(int stream, const float* x, int64_t ldx, const float* weight, const float* bias, int64_t n_rows,
                  int64_t width, float eps, float* y, int64_t ldy) override {
    gpu::layer_norm(x, ldx, weight, bias, n_rows, width, eps, y, ldy, s(stream));
  }
  void indexer_select(int stream, const cpu::IndexerInput& in, int64_t n_tokens, int64_t pos0,
                      int32_t* selected) override {
    gpu::indexer_select({in.q, in.w, in.w_scale, in.k, in.k_stride, in.n_head, in.dim, in.top_k, in.ratio}, n_tokens,
                        pos0, selected, s(stream));
  }
  void rms_norm(int stream, const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width, float eps,
                float* y, int64_t ldy) override {
    gpu::rms_norm(x, ldx, weight, n_rows, width, eps, y, ldy, s(stream));
  }
  void rope(int stream, const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride,
            int64_t head_stride, int n_dims, bool neox) override {
    gpu::rope(table, x, n_tokens, n_heads, token_stride, head_stride, n_dims, neox, s(stream));
  }
  void short_conv_silu(int stream, const cpu::ShortConv& conv, const float* x, int64_t ldx, int64_t n, float* state,
                       float* y, int64_t ldy) override {
    gpu::short_conv_silu(conv.weight, conv.channels, conv.width, x, ldx, n, state, y, ldy, s(stream));
  }
  void gated_delta_net(int stream, const cpu::DeltaNetShape& shape, const cpu::DeltaNetInput& in, int64_t n,
                       float* state, float* out, int64_t ldo) override {
    gpu::gated_delta_net({shape.n_k_heads, shape.n_v_heads, shape.head_dim, shape.eps, in.qkv, in.ld_qkv, in.alpha,
                          in.beta, in.ld_gates, in.a, in.dt_bias},
                         n, state, out, ldo, s(stream));
  }
  void hyper_pre(int stream, const cpu::HyperConnection& hc, const float* mix, int64_t ldm, const float* x,
                 int64_t width, int64_t n, float* coef, float* out) override {
    gpu::hyper_pre(hyper_args(hc), mix, ldm, x, width, n, coef, out, s(stream));
  }
  void hyper_post(int stream, const cpu::HyperConnection& hc, const float* coef, const float* y, const float* x,
                  int64_t width, int64_t n, float* x_new) override {
    gpu::hyper_post(hyper_args(hc), coef, y, x, width, n, x_new, s(stream));
  }
  void compress(int stream, const cpu::Compressor& c, const float* kv, const float* score, int64_t ld, int64_t n,
                int64_t pos0, float* state, float* out) override {
    gpu::compress({c.width, c.ratio, c.overlap, c.ape}, kv, score, ld, n, pos0, state, out, s(stream));
  }
  void gated_rms_norm(int stream, const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz,
                      int64_t n_rows, int64_t width, float eps, float* y, int64_t ldy) override {
    gpu::gated_rms_norm(x, ldx, weight, z, ldz, n_rows, width, eps, y, ldy, s(stream));
  }
  void sigmoid_mul(int stream, const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y,
                   int64_t ldy) override {
    gpu::sigmoid_mul(gate, ldg, n_rows, width, y, ldy, s(stream));
  }
  void attention(int stream, const cpu::AttentionShape& shape, const cpu::AttentionInput& in, int64_t n_tokens,
                 int64_t pos0, float* out) override {
    const gpu::AttentionArgs a{shape.n_head,
                               shape.n_head_kv,
                               shape.head_dim_k,
                               shape.head_dim_v,
                               shape.scale,
                               in.q,
                               in.q_token_stride,
                               in.q_head_stride,
                               in.k,
                               in.k_stride,
                               in.v,
                               in.v_stride,
                               shape.sinks,
                               shape.window,
                               shape.keys,
                               shape.keys_per_query,
                               in.ring,
                               in.compressed,
                               in.compressed_stride,
                               in.ratio,
                               in.chosen,
                               in.chosen_per_query};
    gpu::attention(a, n_tokens, pos0, out, s(stream));
  }
  void select_experts(int stream, const cpu::ExpertSelection& p, float* logits, const float* bias, int64_t n,
                      int32_t* ids, float* weights) override {
    if (p.softmax_selected || p.sqrt_softplus)
      throw std::logic_error("cuda device: select_experts has no softmax-over-the-chosen or sqrt-softplus mode");
    const gpu::SelectionArgs a{p.n_expert, p.n_used, p.sigmoid, p.norm, p.scale, p.n_group, p.n_group_used};
    gpu::select_experts(a, logits, bias, n, ids, weights, s(stream));
  }
  bool selects_experts(int64_t n_expert, int64_t n_group) const override {
    return n_expert <= gpu::kMaxSelectionExperts && n_group <= 64;
  }
  void copy_rows(int stream, const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst,
                 int64_t ldd) override {
    gpu::copy_rows(src, lds, n_rows, width, dst, ldd, s(stream));
  }
  void gather_rows(int stream, const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) override {
    gpu::gather_rows(src, width, rows, n, dst, s(stream));
  }
  void combine_rows(int stream, const float* src, int64_t width, const int32_t* index, const float* weights, int64_t n,
                    int64_t k, float* dst) override {
    gpu::combine_rows(src, width, index, weights, n, k, dst, s(stream));
  }
  void host_callback(int stream, std::function<void()> fn) override {
    // The callback owns its function (released to CUDA only once the launch succeeded) and reports a failure to
    // the next synchronize.
    struct Call {
      CudaDevice* device;
      std::function<void()> fn;
    };
    auto call = std::make_unique<Call>(Call{this, std::move(fn)});
    gpu::launch_host_func(
        s(stream),
        [](void* arg) {
          std::unique_ptr<Call> owned(static_cast<Call*>(arg));
          try {
            owned->fn();
          } catch (...) {
            std::lock_guard lock(owned->device->mutex_);
            if (!owned->device->error_) owned->device->error_ = std::current_exception();
          }
        },
        call.get());
    call.release();
  }

  Event record(int stream) override {
    std::lock_guard lock(mutex_);
    const uint64_t sequence = next_event_++;
    gpu::record_event(events_[sequence % kEvents], s(stream));
    return {stream, sequence};
  }
  bool reached(Event event) override { return gpu::event_query(events_[fresh(event) % kEvents]); }
  void wait(int stream, Event event) override { gpu::stream_wait_event(s(stream), events_[fresh(event) % kEvents]); }
  void synchronize(Event event) override {
    gpu::event_synchronize(events_[fresh(event) % kEvents]);
    rethrow();
  }
  void synchronize() override {
    for (gpu::Stream st : streams_) gpu::stream_synchronize(st);
    rethrow();
  }

  TransferStats transfers() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  // heads.count products of `rows` rows each (gpu::Heads).
  void products(int stream, const DeviceMatrix& w, int64_t rows, const float* x, int64_t ldx, int64_t n, float* y,
                int64_t ldy, const gpu::Heads& heads) {
    if (const auto f = quant::lowbit_format(w.type))
      return gpu::lowbit_matmul(f->bits, f->group, w.data, rows, w.n_cols, w.row_bytes, x, ldx, n, y, ldy, s(stream),
                                heads);
    if (!supports(w.type)) throw std::logic_error("cuda device: matmul of a type supports() refuses");
    gpu::block_matmul(w.type, w.data, rows, w.n_cols, w.row_bytes, x, ldx, n, y, ldy, s(stream), heads);
  }
  // Events are reused round-robin. An Event older than kEvents records (an expert admitted long before a step uses
  // it) no longer names its own CUDA event: it stands for the current end of its stream instead, a later point of
  // the same stream, so waiting for it still waits for everything it covered. (Events are recorded and used from
  // one host thread at a time: the check and the use are not one atomic step.)
  static constexpr size_t kEvents = 4096;
  uint64_t fresh(Event event) {
    {
      std::lock_guard lock(mutex_);
      if (next_event_ - event.sequence <= kEvents) return event.sequence;
    }
    return record(event.stream).sequence;
  }

  static gpu::HyperArgs hyper_args(const cpu::HyperConnection& hc) {
    return {hc.n_streams, hc.sinkhorn_iters, hc.output_head, hc.eps, hc.scale, hc.base};
  }
  gpu::Stream s(int stream) const {
    if (stream < 0 || stream >= static_cast<int>(streams_.size()))
      throw std::logic_error(fmt::format("cuda device: no stream {}", stream));
    return streams_[static_cast<size_t>(stream)];
  }
  void rethrow() {
    std::exception_ptr e;
    {
      std::lock_guard lock(mutex_);
      std::swap(e, error_);
    }
    if (e) std::rethrow_exception(e);
  }

  int index_;
  std::string name_;
  size_t capacity_ = 0;
  mutable std::mutex mutex_;
  Allocations allocations_;
  std::vector<gpu::Stream> streams_;
  std::vector<gpu::EventHandle> events_;
  uint64_t next_event_ = 0;
  TransferStats stats_;
  std::exception_ptr error_;
};

}  // namespace
}  // namespace hetmoe::device

// The library's entry points, the only symbols it exports (runtime/device/cuda_loader.cpp finds them with dlsym).
#define HETMOE_EXPORT extern "C" __attribute__((visibility("default")))

HETMOE_EXPORT int hetmoe_cuda_abi() { return hetmoe::device::kDeviceAbi; }

HETMOE_EXPORT int hetmoe_cuda_device_count() {
  try {
    return hetmoe::gpu::device_count();
  } catch (const std::exception&) {
    return 0;
  }
}

// A new device the caller owns; throws hetmoe::Error (the same class in both images: libstdc++ matches it by name).
HETMOE_EXPORT hetmoe::device::Device* hetmoe_cuda_open(int index) {
  const int n = hetmoe::gpu::device_count();
  if (index < 0 || index >= n) hetmoe::fail("--device cuda: no CUDA GPU {} ({} found)", index, n);
  return new hetmoe::device::CudaDevice(index);
}
