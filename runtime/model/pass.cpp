#include "runtime/model/pass.h"

#include <algorithm>

#include "quant/ggml_type.h"
#include "runtime/error.h"

namespace hetmoe::model {
using device::aligned;

PassWeights::Handle PassWeights::add(const cpu::WeightMatrix& w) {
  items_.push_back(w);
  host_only_items_.push_back(host_only_);
  return items_.size() - 1;
}

PassWeights::Handle PassWeights::add(const float* values, int64_t n) {
  return add(cpu::WeightMatrix{quant::GgmlType::F32, n, 1, static_cast<size_t>(n) * sizeof(float),
                               reinterpret_cast<const uint8_t*>(values)});
}

DeviceWeights::DeviceWeights(device::Device& device, const PassWeights& weights) : device_(device), weights_(weights) {
  for (size_t h = 0; h < weights.size(); ++h) {
    const cpu::WeightMatrix& w = weights.host(h);
    const size_t b = w.row_bytes * static_cast<size_t>(w.n_rows);
    offsets_.push_back(bytes_);
    if (weights.is_host_only(h) && !device.is_host()) continue;
    supported_ = supported_ && device.supports(w.type);
    data_bytes_ += b;
    if (!device.is_host()) bytes_ += aligned(b);
  }
}

void DeviceWeights::upload(int stream) {
  if (device_.is_host()) return;
  memory_ = device::DeviceMemory(device_, bytes_);
  auto* base = memory_.as<uint8_t>();
  for (size_t h = 0; h < weights_.size(); ++h) {
    const cpu::WeightMatrix& w = weights_.host(h);
    if (weights_.is_host_only(h)) continue;
    device_.copy_to_device(stream, base + offsets_[h], w.data, w.row_bytes * static_cast<size_t>(w.n_rows));
  }
  device_.synchronize(device_.record(stream));
}

device::DeviceMatrix DeviceWeights::matrix(PassWeights::Handle h) const {
  const cpu::WeightMatrix& w = weights_.host(h);
  if (!device_.is_host() && weights_.is_host_only(h)) fail("a host-only weight read by a device's pass");
  const void* data = device_.is_host() ? static_cast<const void*>(w.data) : memory_.as<uint8_t>() + offsets_.at(h);
  return {w.type, w.n_cols, w.n_rows, w.row_bytes, data};
}

const float* DeviceWeights::vector(PassWeights::Handle h) const { return static_cast<const float*>(matrix(h).data); }

float* Pass::scratch(size_t slot, size_t floats) {
  if (buffers_.size() <= slot) buffers_.resize(slot + 1);
  try {
    return device::grow(device, buffers_[slot], floats * sizeof(float)).as<float>();
  } catch (const Error&) {
    fail(
        "{}: the forward pass needs {:.1f} MB more device memory than is free ({:.1f} of {:.1f} GB in use); use a "
        "smaller --ctx-size or --device-memory, or --host-pass",
        device.name(), static_cast<double>(floats * sizeof(float)) / 1e6, static_cast<double>(device.used()) / 1e9,
        static_cast<double>(device.capacity()) / 1e9);
  }
}

const float* Pass::to_host(const float* p, size_t floats) {
  const float* host = nullptr;
  to_host({{p, floats, &host}});
  return host;
}

void Pass::to_host(std::initializer_list<Down> parts) {
  if (on_host()) {
    for (const Down& part : parts) *part.to = part.from;
    return;
  }
  size_t total = 0;
  for (const Down& part : parts) total += part.floats;
  float* host = down_.reserve(total);
  for (const Down& part : parts) {
    device.copy_to_host(stream, host, part.from, part.floats * sizeof(float));
    *part.to = host;
    host += part.floats;
  }
  device.synchronize(device.record(stream));
}

void Pass::from_host(const float* src, size_t floats, float* dst) {
  if (src == dst) return;
  const float* staged = src;
  if (!on_host()) {
    float* pinned = result_.reserve(floats);
    std::copy_n(src, floats, pinned);
    staged = pinned;
  }
  device.copy_to_device(stream, dst, staged, floats * sizeof(float));
  device.synchronize(device.record(stream));
}

}  // namespace hetmoe::model
