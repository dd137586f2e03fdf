#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/device/device.h"

namespace hetmoe::model {

// What one layer keeps of a sequence: key and value rows per position (MLA: one latent row serving as both, v_width
// 0), and state that every token updates in place (Qwen3.5's Gated DeltaNet: the convolution's last inputs and the
// delta rule's matrices). A layer may have either or both.
// DeepSeek-V4's layers keep entries per block of positions (compressed keys, indexer keys) beside a window ring and
// compressor rows held as recurrent state.
struct LayerCache {
  int64_t k_width = 0;    // floats per position
  int64_t v_width = 0;    // floats per position
  int64_t recurrent = 0;  // floats of recurrent state
  // One entry of block_width floats per block of block_ratio positions (n_ctx / block_ratio of them), written when
  // the block's last position is evaluated and, like rows, overwritten when it is evaluated again. 0: none.
  int64_t block_ratio = 0;
  int64_t block_width = 0;
  int64_t blocks(int64_t n_ctx) const { return block_ratio > 0 ? n_ctx / block_ratio : 0; }
};

// A copy of a sequence's state at position n_pos in host memory (KvCache::save): every layer's rows and block entries
// of positions below n_pos and its recurrent state. What a server keeps of a prompt prefix to serve a later request
// that starts with it without evaluating it again; loaded into any cache of the same layers with room for n_pos.
struct CacheState {
  int64_t n_pos = 0;
  std::vector<LayerCache> layers;
  std::vector<float> values;
  size_t bytes() const { return values.size() * sizeof(float); }
};

// A sequence's state, per layer as LayerCache says, in F32, in host memory or in a device's memory (a model whose
// forward pass runs on the device: Model::make_cache decides).
//
// Key/value rows are addressed by position and overwritten when a position is evaluated again, so an attention-only
// cache rolls back to any position for free. Recurrent state describes exactly the tokens folded into it: it is
// at position recurrent_pos(), and the forward pass only continues from there. To go back, the cache keeps
// checkpoints, copies of every layer's recurrent state at a position (up to max_checkpoints, the oldest dropped);
// rollback(p) restores the newest one at or before p, and the caller evaluates the tokens from there to p again.
class KvCache {
 public:
  KvCache() = default;
  // In host memory, zeroed. Fails with a clear error when it cannot be allocated.
  KvCache(std::vector<LayerCache> layers, int64_t n_ctx);
  // In `device`'s memory; the recurrent state is zeroed, the rows are not (a position is read only after it was
  // written). Fails with hetmoe::Error when it does not fit there.
  KvCache(device::Device& device, std::vector<LayerCache> layers, int64_t n_ctx);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_layer() const { return static_cast<int64_t>(layers_.size()); }
  const LayerCache& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  // Bytes of the rows and the recurrent state (checkpoints not counted: they come and go).
  size_t bytes() const { return bytes_; }
  // Bytes a cache of these layers takes for n_ctx positions.
  static size_t bytes_for(const std::vector<LayerCache>& layers, int64_t n_ctx);
  // The device holding the cache, or null for a host cache.
  device::Device* device() const { return device_; }

  // Row `pos` of layer `layer`: host memory, or device memory for a device cache.
  float* k(int64_t layer, int64_t pos) { return k_[static_cast<size_t>(layer)] + pos * layers_[layer].k_width; }
  float* v(int64_t layer, int64_t pos) { return v_[static_cast<size_t>(layer)] + pos * layers_[layer].v_width; }
  // The layer's recurrent state (null when it has none).
  float* recurrent(int64_t layer) { return r_[static_cast<size_t>(layer)]; }
  // Block entry `b` of layer `layer` (LayerCache::block_ratio).
  float* block(int64_t layer, int64_t b) { return b_[static_cast<size_t>(layer)] + b * layers_[layer].block_width; }

  // Whether any layer has recurrent state, and the position it is at (the tokens folded into it; -1 while a pass
  // changes it or after one stopped part-way).
  bool has_recurrent() const { return recurrent_floats_ > 0; }
  int64_t recurrent_pos() const { return recurrent_pos_; }
  // The forward pass folded positions up to `pos` into the recurrent state.
  void set_recurrent_pos(int64_t pos) { recurrent_pos_ = pos; }
  // The recurrent state is being changed (a pass is running, or it stopped part-way): until set_recurrent_pos, it
  // describes no position, and only a rollback brings it back.
  void invalidate_recurrent() {
    if (recurrent_floats_ > 0) recurrent_pos_ = -1;
  }

  // A copy of the recurrent state at recurrent_pos() (nothing without recurrent state, or when the newest checkpoint
  // is already there). Fails with hetmoe::Error when the memory for it cannot be had.
  void checkpoint();
  // Back to position `pos` or the nearest point before it that can be restored: any position for an attention-only
  // cache; else the newest checkpoint at or before `pos` (checkpoints after it are dropped), or 0 with the state
  // zeroed. Returns the position the cache is at now; the caller evaluates the tokens from there to `pos` again.
  int64_t rollback(int64_t pos);
  // The positions of the checkpoints held, oldest first.
  std::vector<int64_t> checkpoints() const;
  // The newest checkpoint at or before `pos`, if any.
  std::optional<int64_t> checkpoint_at_or_before(int64_t pos) const;
  void set_max_checkpoints(size_t n) { max_checkpoints_ = n; }

  // The state at position n_pos (the rows and blocks of the positions before it, the recurrent state, which must be
  // at n_pos). Fails with hetmoe::Error when n_pos is outside the cache or the recurrent state is elsewhere.
  CacheState save(int64_t n_pos);
  // Replaces the state with `state` (the cache is then at state.n_pos; its checkpoints are dropped). Fails with
  // hetmoe::Error, the cache unchanged, when the layers differ or state.n_pos exceeds n_ctx.
  void load(const CacheState& state);

 private:
  void allocate_views(float* base);
  template <typename Fn>
  void for_each_region(int64_t n_pos, Fn&& fn);
  void zero_recurrent();
  // recurrent_floats_ floats from src to dst, both device memory, once the device's queued work is done.
  void copy_on_device(const float* src, float* dst);

  std::vector<LayerCache> layers_;
  int64_t n_ctx_ = 0;
  size_t bytes_ = 0;
  int64_t recurrent_floats_ = 0;  // of all layers together
  int64_t recurrent_pos_ = 0;
  device::Device* device_ = nullptr;
  int stream_ = -1;                     // device: the stream of the cache's own copies
  std::vector<float> host_;             // host: every layer's rows and blocks, then every recurrent state
  device::DeviceMemory device_memory_;  // device: the same layout
  std::vector<float*> k_, v_, r_, b_;   // per layer
  float* recurrent_base_ = nullptr;     // all layers' recurrent state, contiguous

  struct Checkpoint {
    int64_t pos = 0;
    std::vector<float> host;
    device::DeviceMemory device;
  };
  std::vector<Checkpoint> checkpoints_;  // oldest first
  size_t max_checkpoints_ = 8;
};

}  // namespace hetmoe::model
