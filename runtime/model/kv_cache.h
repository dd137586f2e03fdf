#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/device/device.h"

namespace hetmoe::model {

// Per-layer key and value rows in F32, one row per position, in host memory or in a device's memory (a model whose
// forward pass runs on the device: Model::make_cache decides). MLA models keep one latent row per position that
// serves as both key and value (v_width 0).
class KvCache {
 public:
  KvCache() = default;
  // In host memory. Fails with a clear error when the cache cannot be allocated.
  KvCache(int64_t n_layer, int64_t n_ctx, int64_t k_width, int64_t v_width);
  // In `device`'s memory (not cleared: a position is read only after it was written). Fails with hetmoe::Error
  // when it does not fit there.
  KvCache(device::Device& device, int64_t n_layer, int64_t n_ctx, int64_t k_width, int64_t v_width);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t k_width() const { return k_width_; }
  int64_t v_width() const { return v_width_; }
  size_t bytes() const { return static_cast<size_t>(n_layer_ * n_ctx_ * (k_width_ + v_width_)) * sizeof(float); }
  // The device holding the cache, or null for a host cache.
  device::Device* device() const { return device_; }

  // Row `pos` of layer `layer`: host memory, or device memory for a device cache.
  float* k(int64_t layer, int64_t pos) { return k_base_ + (layer * n_ctx_ + pos) * k_width_; }
  float* v(int64_t layer, int64_t pos) { return v_base_ + (layer * n_ctx_ + pos) * v_width_; }

 private:
  int64_t n_layer_ = 0;
  int64_t n_ctx_ = 0;
  int64_t k_width_ = 0;
  int64_t v_width_ = 0;
  device::Device* device_ = nullptr;
  std::vector<float> k_, v_;            // host: [n_layer][n_ctx][k_width], [n_layer][n_ctx][v_width]
  device::DeviceMemory device_memory_;  // device: keys, then values
  float* k_base_ = nullptr;
  float* v_base_ = nullptr;
};

}  // namespace hetmoe::model
