#include "runtime/model/kv_cache.h"

#include <new>

#include "runtime/error.h"

namespace hetmoe::model {

KvCache::KvCache(int64_t n_layer, int64_t n_ctx, int64_t k_width, int64_t v_width)
    : n_layer_(n_layer), n_ctx_(n_ctx), k_width_(k_width), v_width_(v_width) {
  const double gib = static_cast<double>(bytes()) / (1 << 30);
  try {
    k_.assign(static_cast<size_t>(n_layer * n_ctx * k_width), 0.0f);
    v_.assign(static_cast<size_t>(n_layer * n_ctx * v_width), 0.0f);
  } catch (const std::bad_alloc&) {
    fail("not enough memory for a KV cache of {} positions ({:.2f} GiB); use a smaller --ctx-size", n_ctx, gib);
  }
  k_base_ = k_.data();
  v_base_ = v_.data();
}

KvCache::KvCache(device::Device& device, int64_t n_layer, int64_t n_ctx, int64_t k_width, int64_t v_width)
    : n_layer_(n_layer), n_ctx_(n_ctx), k_width_(k_width), v_width_(v_width), device_(&device) {
  device_memory_ = device::DeviceMemory(device, bytes());
  k_base_ = device_memory_.as<float>();
  v_base_ = k_base_ + n_layer * n_ctx * k_width;
}

}  // namespace hetmoe::model
