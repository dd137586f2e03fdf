#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "cpu_kernels/matmul.h"
#include "runtime/device/device.h"
#include "runtime/model/kv_cache.h"

namespace hetmoe::model {

// The weights a forward pass reads besides the FFNs (norms, attention, routers), as the file holds them: registered
// once at load, each under the handle add() returns, and then placed on every device the pass runs on.
class PassWeights {
 public:
  using Handle = size_t;
  Handle add(const cpu::WeightMatrix& w);
  // A vector of n floats (a norm's weights, a router's bias): an F32 matrix of one row.
  Handle add(const float* values, int64_t n);
  const cpu::WeightMatrix& host(Handle h) const { return items_.at(h); }
  size_t size() const { return items_.size(); }
  // Weights added from now on stay on the host whatever device the pass runs on (an MTP block's: only the host pass
  // runs it), or again go wherever the pass does.
  void host_only(bool on) { host_only_ = on; }
  bool is_host_only(Handle h) const { return host_only_items_.at(h); }

 private:
  std::vector<cpu::WeightMatrix> items_;
  std::vector<bool> host_only_items_;
  bool host_only_ = false;
};

// PassWeights placed on one device. On the host device they stay where they lie (the mapped file: nothing is
// allocated or copied); on another device they are copied once into one allocation, each on a 256-byte boundary,
// except the host-only ones (which that device's pass never reads).
class DeviceWeights {
 public:
  DeviceWeights(device::Device& device, const PassWeights& weights);

  // Whether the device runs every weight's type, and the device bytes the copies take (0 on the host).
  bool supported() const { return supported_; }
  size_t bytes() const { return bytes_; }
  // The bytes of the weights themselves.
  size_t data_bytes() const { return data_bytes_; }
  // Allocates and queues the copies on `stream`, waiting for them (nothing on the host device). Fails with
  // hetmoe::Error when they do not fit.
  void upload(int stream);

  device::DeviceMatrix matrix(PassWeights::Handle h) const;
  const float* vector(PassWeights::Handle h) const;

 private:
  device::Device& device_;
  const PassWeights& weights_;
  std::vector<size_t> offsets_;
  size_t bytes_ = 0, data_bytes_ = 0;
  bool supported_ = true;
  device::DeviceMemory memory_;
};

// One sequence's rows in a forward pass's batch: rows [row0, row0 + n) are its tokens at positions pos0, pos0 + 1, ...,
// whose keys, values and state go to its cache.
struct PassSequence {
  int64_t row0 = 0;
  int64_t n = 0;
  int64_t pos0 = 0;
  KvCache* cache = nullptr;
};

// One device's forward pass as an architecture's attention sees it: the device and the stream the pass runs on, its
// weights there, the RoPE table of the current call's positions, scratch buffers that keep their size between calls
// (decode allocates nothing once warm) and the host staging of what goes up and comes down.
class Pass {
 public:
  Pass(device::Device& device, int stream, const PassWeights& weights)
      : device(device), stream(stream), weights(device, weights), up_(device), down_(device), result_(device) {}

  // Scratch slots below this one are the model's; an architecture's attention numbers its buffers from here.
  static constexpr size_t kAttentionSlots = 8;

  device::Device& device;
  int stream;
  DeviceWeights weights;
  // The current call's sequences, in row order: everything per row (projections, norms, RoPE) runs over the batch at
  // once, what a sequence keeps (its cache, its recurrent state) per sequence.
  std::span<const PassSequence> sequences;
  const float* rope_table = nullptr;  // [n][rope.n_dims]: cpu::rope_cache at each row's position

  device::DeviceMatrix matrix(PassWeights::Handle h) const { return weights.matrix(h); }
  const float* vector(PassWeights::Handle h) const { return weights.vector(h); }
  bool on_host() const { return device.is_host(); }

  // Device buffer `slot` with room for `floats` floats; when it has to grow, earlier work is waited for first and the
  // contents are not kept.
  float* scratch(size_t slot, size_t floats);
  // Host staging for `floats` floats that go up (pinned on a GPU); kept until the next call.
  float* staging_up(size_t floats) { return up_.reserve(floats); }
  // `floats` floats of the pass's memory at p as host memory: p itself on the host device, else copied down into
  // the staging of the rows that come down (waiting for the copy); valid until the next call.
  const float* to_host(const float* p, size_t floats);
  // Several parts in one round trip: each part's host view goes to *to (on the host device the pointer itself; else
  // the parts land one after another in the staging, which the next call reuses).
  struct Down {
    const float* from;
    size_t floats;
    const float** to;
  };
  void to_host(std::initializer_list<Down> parts);
  // The host rows `src` into the pass's memory at dst (waiting for the copy); nothing when they are the same.
  void from_host(const float* src, size_t floats, float* dst);

 private:
  std::vector<device::DeviceMemory> buffers_;
  device::HostMemory up_, down_, result_;  // embeddings and RoPE table up; rows down; CPU results up
};

}  // namespace hetmoe::model
