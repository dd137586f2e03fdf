// The host device (runtime/device/device.h): the CPU itself. Its memory is host memory, its weights are the mapped
// file's rows where they lie (nothing is copied to "upload" them), and its ops run at once on the calling thread with
// the model's thread pool: the kernel table's threaded matmul (NUMA partition, tiles, oneDNN), the CPU attention.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "runtime/device/allocations.h"
#include "runtime/device/device.h"
#include "runtime/device/host_ops.h"
#include "runtime/error.h"

namespace hetmoe::device {
namespace {

size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : SIZE_MAX;
}

class HostDevice final : public Device {
 public:
  explicit HostDevice(cpu::ThreadPool& pool) : pool_(pool), capacity_(physical_memory()) {}
  ~HostDevice() override {
    for (void* ptr : allocations_.addresses()) ::operator delete (ptr, std::align_val_t{64});
  }

  std::string name() const override { return fmt::format("host ({} threads)", pool_.size()); }
  bool emulated() const override { return false; }
  bool is_host() const override { return true; }
  size_t capacity() const override { return capacity_; }
  size_t used() const override { return allocations_.used(); }
  bool supports(quant::GgmlType) const override { return true; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    try {
      p = ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{64});
    } catch (const std::bad_alloc&) {
      fail("host memory: {:.1f} MB more do not fit", static_cast<double>(bytes) / 1e6);
    }
    allocations_.add(p, bytes);
    return p;
  }
  void release(void* ptr) override {
    allocations_.remove(ptr, "host device");
    ::operator delete (ptr, std::align_val_t{64});
  }
  void* allocate_host(size_t bytes) override { return allocate(bytes); }
  void release_host(void* ptr) override { release(ptr); }

  // One stream: the calling thread. Work is done when the call returns, so events are always reached.
  int create_stream() override { return 0; }
  void copy_to_device(int, void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(int, void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }

  using Device::matmul;
  void matmul(int, const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy) override {
    host_ops::matmul(pool_, w, x, ldx, n, y, ldy);
  }
  void matmuls(int, std::span<const MatmulOutput> outs, const float* x, int64_t n) override {
    host_ops::matmuls(pool_, outs, x, n);
  }
  void matmul_heads(int, const DeviceMatrix& w, const cpu::HeadsLayout& layout, const float* x, int64_t n,
                    float* y) override {
    host_ops::matmul_heads(pool_, w, layout, x, n, y);
  }
  void silu_mul(int, const float* gate, const float* up, int64_t n, float* out) override {
    host_ops::silu_mul(gate, up, n, out);
  }
  void add(int, const float* x, int64_t n, float* y) override { host_ops::add(x, n, y); }
  void add_bias(int, const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy) override {
    host_ops::add_bias(bias, width, n_rows, y, ldy);
  }
  void layer_norm(int, const float* x, int64_t ldx, const float* weight, const float* bias, int64_t n_rows,
                  int64_t width, float eps, float* y, int64_t ldy) override {
    host_ops::layer_norm(x, ldx, weight, bias, n_rows, width, eps, y, ldy);
  }
  void indexer_select(int, const cpu::IndexerInput& in, int64_t n_tokens, int64_t pos0, int32_t* selected) override {
    cpu::indexer_select(in, n_tokens, pos0, selected, nullptr, pool_);
  }
  void rms_norm(int, const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width, float eps,
                float* y, int64_t ldy) override {
    host_ops::rms_norm(x, ldx, weight, n_rows, width, eps, y, ldy);
  }
  void rope(int, const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride,
            int64_t head_stride, int n_dims, bool neox) override {
    host_ops::rope(table, x, n_tokens, n_heads, token_stride, head_stride, n_dims, neox);
  }
  void attention(int, const cpu::AttentionShape& shape, const cpu::AttentionInput& in, int64_t n_tokens, int64_t pos0,
                 float* out) override {
    cpu::causal_attention(shape, in, n_tokens, pos0, out, pool_);
  }
  void short_conv_silu(int, const cpu::ShortConv& conv, const float* x, int64_t ldx, int64_t n, float* state, float* y,
                       int64_t ldy) override {
    cpu::short_conv_silu(conv, x, ldx, n, state, y, ldy);
  }
  void gated_delta_net(int, const cpu::DeltaNetShape& shape, const cpu::DeltaNetInput& in, int64_t n, float* state,
                       float* out, int64_t ldo) override {
    cpu::gated_delta_net(shape, in, n, state, out, ldo, pool_);
  }
  void hyper_pre(int, const cpu::HyperConnection& hc, const float* mix, int64_t ldm, const float* x, int64_t width,
                 int64_t n, float* coef, float* out) override {
    cpu::hyper_pre(hc, mix, ldm, x, width, n, coef, out, pool_);
  }
  void hyper_post(int, const cpu::HyperConnection& hc, const float* coef, const float* y, const float* x, int64_t width,
                  int64_t n, float* x_new) override {
    cpu::hyper_post(hc, coef, y, x, width, n, x_new, pool_);
  }
  void compress(int, const cpu::Compressor& c, const float* kv, const float* score, int64_t ld, int64_t n, int64_t pos0,
                float* state, float* out) override {
    cpu::compress(c, kv, score, ld, n, pos0, state, out, pool_);
  }
  void gated_rms_norm(int, const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz,
                      int64_t n_rows, int64_t width, float eps, float* y, int64_t ldy) override {
    host_ops::gated_rms_norm(x, ldx, weight, z, ldz, n_rows, width, eps, y, ldy);
  }
  void sigmoid_mul(int, const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y, int64_t ldy) override {
    host_ops::sigmoid_mul(gate, ldg, n_rows, width, y, ldy);
  }
  void copy_rows(int, const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst, int64_t ldd) override {
    host_ops::copy_rows(src, lds, n_rows, width, dst, ldd);
  }
  void gather_rows(int, const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) override {
    host_ops::gather_rows(src, width, rows, n, dst);
  }
  void select_experts(int, const cpu::ExpertSelection& p, float* logits, const float* bias, int64_t n, int32_t* ids,
                      float* weights) override {
    host_ops::select_experts(p, logits, bias, n, ids, weights);
  }
  bool selects_experts(int64_t, int64_t) const override { return true; }
  void combine_rows(int, const float* src, int64_t width, const int32_t* index, const float* weights, int64_t n,
                    int64_t k, float* dst) override {
    host_ops::combine_rows(src, width, index, weights, n, k, dst);
  }
  void host_callback(int, std::function<void()> fn) override { fn(); }

  Event record(int stream) override { return {stream, 0}; }
  bool reached(Event) override { return true; }
  void wait(int, Event) override {}
  void synchronize(Event) override {}
  void synchronize() override {}

  // Nothing crosses a link: the host device's copies are plain memory copies of activations.
  TransferStats transfers() const override { return {}; }

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
  }

  cpu::ThreadPool& pool_;
  size_t capacity_;
  Allocations allocations_;
};

}  // namespace

std::unique_ptr<Device> make_host_device(cpu::ThreadPool& pool) { return std::make_unique<HostDevice>(pool); }

}  // namespace hetmoe::device
