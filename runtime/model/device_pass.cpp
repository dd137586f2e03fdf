#include "runtime/model/device_pass.h"

#include <algorithm>

#include "quant/ggml_type.h"
#include "runtime/error.h"

namespace hetmoe::model {
using device::aligned;

size_t DeviceWeights::add(const cpu::WeightMatrix& w) {
  supported_ = supported_ && device_.supports(w.type);
  items_.push_back({w, bytes_});
  bytes_ += aligned(w.row_bytes * static_cast<size_t>(w.n_rows));
  data_bytes_ += w.row_bytes * static_cast<size_t>(w.n_rows);
  return items_.size() - 1;
}

size_t DeviceWeights::add(const float* values, int64_t n) {
  return add(cpu::WeightMatrix{quant::GgmlType::F32, n, 1, static_cast<size_t>(n) * sizeof(float),
                               reinterpret_cast<const uint8_t*>(values)});
}

void DeviceWeights::upload(int stream) {
  memory_ = device::DeviceMemory(device_, bytes_);
  auto* base = memory_.as<uint8_t>();
  for (const Item& item : items_)
    device_.copy_to_device(stream, base + item.offset, item.host.data,
                           item.host.row_bytes * static_cast<size_t>(item.host.n_rows));
  device_.synchronize(device_.record(stream));
}

device::DeviceMatrix DeviceWeights::matrix(size_t handle) const {
  const Item& item = items_.at(handle);
  return {item.host.type, item.host.n_cols, item.host.n_rows, item.host.row_bytes, memory_.as<uint8_t>() + item.offset};
}

const float* DeviceWeights::vector(size_t handle) const {
  return reinterpret_cast<const float*>(memory_.as<uint8_t>() + items_.at(handle).offset);
}

float* DevicePass::scratch(size_t slot, size_t floats) {
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

}  // namespace hetmoe::model
