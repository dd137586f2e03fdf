#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu_kernels/matmul.h"
#include "runtime/device/device.h"

namespace hetmoe::model {

// Weights copied to a device once, in one allocation: matrices and F32 vectors are added first (each gets a handle),
// then upload() places and copies them all. What the device-resident forward pass keeps there besides the experts:
// norms, attention and router weights.
class DeviceWeights {
 public:
  explicit DeviceWeights(device::Device& device) : device_(device) {}

  // Plans a matrix; whether the device runs its type shows in supported().
  size_t add(const cpu::WeightMatrix& w);
  size_t add(const float* values, int64_t n);
  bool supported() const { return supported_; }
  // Device bytes the weights take (each on a 256-byte boundary), and the bytes of the weights themselves.
  size_t bytes() const { return bytes_; }
  size_t data_bytes() const { return data_bytes_; }

  // Allocates and queues the copies on `stream`, waiting for them. Fails with hetmoe::Error when they do not fit.
  void upload(int stream);

  device::DeviceMatrix matrix(size_t handle) const;
  const float* vector(size_t handle) const;

 private:
  struct Item {
    cpu::WeightMatrix host;  // a vector is an F32 matrix of one row
    size_t offset = 0;
  };
  device::Device& device_;
  std::vector<Item> items_;
  size_t bytes_ = 0, data_bytes_ = 0;
  bool supported_ = true;
  device::DeviceMemory memory_;
};

// Rows [first, first + count) of a device matrix (one head's rows of a per-head tensor).
inline device::DeviceMatrix rows_of(const device::DeviceMatrix& w, int64_t first, int64_t count) {
  return {w.type, w.n_cols, count, w.row_bytes, static_cast<const uint8_t*>(w.data) + first * w.row_bytes};
}

// One forward call on the device as an architecture's device attention sees it: the device and the stream the whole
// pass runs on, the RoPE table of the call's positions and device scratch buffers that keep their size between calls
// (decode allocates nothing once warm).
class DevicePass {
 public:
  DevicePass(device::Device& device, int stream) : device(device), stream(stream) {}

  // Scratch slots below this one are the model's; an architecture's attention numbers its buffers from here.
  static constexpr size_t kAttentionSlots = 8;

  device::Device& device;
  int stream;
  const float* rope_table = nullptr;  // [n][rope.n_dims]: cpu::rope_cache at positions pos0, pos0 + 1, ...

  // Device buffer `slot` with room for `floats` floats; when it has to grow, earlier work is waited for first and the
  // contents are not kept.
  float* scratch(size_t slot, size_t floats);

 private:
  std::vector<device::DeviceMemory> buffers_;
};

}  // namespace hetmoe::model
