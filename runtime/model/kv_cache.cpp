#include "runtime/model/kv_cache.h"

#include <algorithm>
#include <new>

#include "runtime/error.h"

namespace hetmoe::model {
namespace {

int64_t row_floats(const std::vector<LayerCache>& layers, int64_t n_ctx) {
  int64_t floats = 0;
  for (const LayerCache& l : layers) floats += n_ctx * (l.k_width + l.v_width) + l.blocks(n_ctx) * l.block_width;
  return floats;
}

int64_t recurrent_floats(const std::vector<LayerCache>& layers) {
  int64_t floats = 0;
  for (const LayerCache& l : layers) floats += l.recurrent;
  return floats;
}

}  // namespace

size_t KvCache::bytes_for(const std::vector<LayerCache>& layers, int64_t n_ctx) {
  return static_cast<size_t>(row_floats(layers, n_ctx) + recurrent_floats(layers)) * sizeof(float);
}

KvCache::KvCache(std::vector<LayerCache> layers, int64_t n_ctx)
    : layers_(std::move(layers)), n_ctx_(n_ctx), bytes_(bytes_for(layers_, n_ctx)) {
  try {
    host_.assign(bytes_ / sizeof(float), 0.0f);
  } catch (const std::bad_alloc&) {
    fail("not enough memory for a KV cache of {} positions ({:.2f} GiB); use a smaller --ctx-size", n_ctx,
         static_cast<double>(bytes_) / (1 << 30));
  }
  allocate_views(host_.data());
}

KvCache::KvCache(device::Device& device, std::vector<LayerCache> layers, int64_t n_ctx)
    : layers_(std::move(layers)), n_ctx_(n_ctx), bytes_(bytes_for(layers_, n_ctx)), device_(&device) {
  device_memory_ = device::DeviceMemory(device, std::max<size_t>(bytes_, 1));
  stream_ = device.create_stream();
  allocate_views(device_memory_.as<float>());
  zero_recurrent();
}

void KvCache::allocate_views(float* base) {
  const size_t n = layers_.size();
  k_.assign(n, nullptr);
  v_.assign(n, nullptr);
  r_.assign(n, nullptr);
  b_.assign(n, nullptr);
  float* p = base;
  for (size_t l = 0; l < n; ++l) {
    k_[l] = p;
    p += n_ctx_ * layers_[l].k_width;
    v_[l] = p;
    p += n_ctx_ * layers_[l].v_width;
    b_[l] = p;
    p += layers_[l].blocks(n_ctx_) * layers_[l].block_width;
  }
  recurrent_base_ = p;
  recurrent_floats_ = recurrent_floats(layers_);
  for (size_t l = 0; l < n; ++l) {
    if (layers_[l].recurrent > 0) r_[l] = p;
    p += layers_[l].recurrent;
  }
}

void KvCache::zero_recurrent() {
  recurrent_pos_ = 0;
  if (recurrent_floats_ == 0) return;
  if (!device_) {
    std::fill_n(recurrent_base_, recurrent_floats_, 0.0f);
    return;
  }
  const std::vector<float> zeros(static_cast<size_t>(recurrent_floats_), 0.0f);
  device_->synchronize();
  device_->copy_to_device(stream_, recurrent_base_, zeros.data(), zeros.size() * sizeof(float));
  device_->synchronize(device_->record(stream_));
}

void KvCache::copy_on_device(const float* src, float* dst) {
  device_->synchronize();  // the pass's work on the state is done
  device_->copy_rows(stream_, src, recurrent_floats_, 1, recurrent_floats_, dst, recurrent_floats_);
  device_->synchronize(device_->record(stream_));
}

std::optional<int64_t> KvCache::checkpoint_at_or_before(int64_t pos) const {
  for (auto c = checkpoints_.rbegin(); c != checkpoints_.rend(); ++c)
    if (c->pos <= pos) return c->pos;
  return std::nullopt;
}

void KvCache::checkpoint() {
  if (recurrent_floats_ == 0 || recurrent_pos_ < 0) return;
  if (!checkpoints_.empty() && checkpoints_.back().pos == recurrent_pos_) return;
  Checkpoint c;
  c.pos = recurrent_pos_;
  const size_t bytes = static_cast<size_t>(recurrent_floats_) * sizeof(float);
  if (!device_) {
    try {
      c.host.assign(recurrent_base_, recurrent_base_ + recurrent_floats_);
    } catch (const std::bad_alloc&) {
      fail("not enough memory for a checkpoint of the recurrent state ({:.1f} MiB)",
           static_cast<double>(bytes) / (1 << 20));
    }
  } else {
    c.device = device::DeviceMemory(*device_, bytes);
    copy_on_device(recurrent_base_, c.device.as<float>());
  }
  if (checkpoints_.size() >= std::max<size_t>(max_checkpoints_, 1)) checkpoints_.erase(checkpoints_.begin());
  checkpoints_.push_back(std::move(c));
}

int64_t KvCache::rollback(int64_t pos) {
  if (recurrent_floats_ == 0) return pos;
  if (recurrent_pos_ >= 0 && pos >= recurrent_pos_) return recurrent_pos_;
  while (!checkpoints_.empty() && checkpoints_.back().pos > pos) checkpoints_.pop_back();
  if (checkpoints_.empty()) {
    zero_recurrent();
    return 0;
  }
  const Checkpoint& c = checkpoints_.back();
  if (!device_) {
    std::copy(c.host.begin(), c.host.end(), recurrent_base_);
  } else {
    copy_on_device(c.device.as<float>(), recurrent_base_);
  }
  recurrent_pos_ = c.pos;
  return recurrent_pos_;
}

namespace {

bool same_layers(const std::vector<LayerCache>& a, const std::vector<LayerCache>& b) {
  if (a.size() != b.size()) return false;
  for (size_t l = 0; l < a.size(); ++l)
    if (a[l].k_width != b[l].k_width || a[l].v_width != b[l].v_width || a[l].recurrent != b[l].recurrent ||
        a[l].block_ratio != b[l].block_ratio || a[l].block_width != b[l].block_width)
      return false;
  return true;
}

}  // namespace

// The state's regions in order: per layer its k rows, v rows and block entries of the positions below n_pos, then
// all recurrent state.
template <typename Fn>
void KvCache::for_each_region(int64_t n_pos, Fn&& fn) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerCache& c = layers_[l];
    fn(k_[l], n_pos * c.k_width);
    fn(v_[l], n_pos * c.v_width);
    fn(b_[l], (c.block_ratio > 0 ? n_pos / c.block_ratio : 0) * c.block_width);
  }
  fn(recurrent_base_, recurrent_floats_);
}

CacheState KvCache::save(int64_t n_pos) {
  if (n_pos < 0 || n_pos > n_ctx_) fail("cannot save the cache at position {}: it holds {} positions", n_pos, n_ctx_);
  if (recurrent_floats_ > 0 && recurrent_pos_ != n_pos)
    fail("cannot save the cache at position {}: its recurrent state is at {}", n_pos, recurrent_pos_);
  CacheState state{.n_pos = n_pos, .layers = layers_, .values = {}};
  int64_t total = 0;
  for_each_region(n_pos, [&](float*, int64_t n) { total += n; });
  state.values.resize(static_cast<size_t>(total));
  if (device_) device_->synchronize();  // the pass's work on the cache is done
  float* out = state.values.data();
  for_each_region(n_pos, [&](float* src, int64_t n) {
    if (n == 0) return;
    if (device_) {
      device_->copy_to_host(stream_, out, src, static_cast<size_t>(n) * sizeof(float));
    } else {
      std::copy_n(src, n, out);
    }
    out += n;
  });
  if (device_) device_->synchronize(device_->record(stream_));
  return state;
}

void KvCache::load(const CacheState& state) {
  if (!same_layers(state.layers, layers_)) fail("cannot load a cache state of another model's layers");
  if (state.n_pos < 0 || state.n_pos > n_ctx_)
    fail("cannot load a cache state of {} positions into a cache of {}", state.n_pos, n_ctx_);
  int64_t total = 0;
  for_each_region(state.n_pos, [&](float*, int64_t n) { total += n; });
  if (static_cast<size_t>(total) != state.values.size()) fail("cannot load a cache state of the wrong size");
  if (device_) device_->synchronize();
  const float* in = state.values.data();
  for_each_region(state.n_pos, [&](float* dst, int64_t n) {
    if (n == 0) return;
    if (device_) {
      device_->copy_to_device(stream_, dst, in, static_cast<size_t>(n) * sizeof(float));
    } else {
      std::copy_n(in, n, dst);
    }
    in += n;
  });
  if (device_) device_->synchronize(device_->record(stream_));
  checkpoints_.clear();
  recurrent_pos_ = state.n_pos;
}

std::vector<int64_t> KvCache::checkpoints() const {
  std::vector<int64_t> pos;
  for (const Checkpoint& c : checkpoints_) pos.push_back(c.pos);
  return pos;
}

}  // namespace hetmoe::model
