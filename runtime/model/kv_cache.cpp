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

std::vector<int64_t> KvCache::checkpoints() const {
  std::vector<int64_t> pos;
  for (const Checkpoint& c : checkpoints_) pos.push_back(c.pos);
  return pos;
}

}  // namespace hetmoe::model
