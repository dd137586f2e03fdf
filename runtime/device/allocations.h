#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace hetmoe::device {

// The memory a device handed out, by address: what used() reports and what release() checks. Thread-safe; shared
// by the device implementations.
class Allocations {
 public:
  // Records `bytes` at p unless the total would pass `limit`; returns whether it did.
  bool add(void* p, size_t bytes, size_t limit = SIZE_MAX) {
    std::lock_guard lock(mutex_);
    if (bytes > limit - std::min(limit, used_)) return false;
    sizes_[p] = bytes;
    used_ += bytes;
    return true;
  }
  // Forgets p; an address never recorded is a bug of the caller (`device` names the device in the message).
  void remove(void* p, const std::string& device) {
    std::lock_guard lock(mutex_);
    const auto it = sizes_.find(p);
    if (it == sizes_.end()) throw std::logic_error(device + ": release of memory it did not allocate");
    used_ -= it->second;
    sizes_.erase(it);
  }
  size_t used() const {
    std::lock_guard lock(mutex_);
    return used_;
  }
  // The addresses still recorded (for a device's destructor).
  std::vector<void*> addresses() const {
    std::lock_guard lock(mutex_);
    std::vector<void*> out;
    for (const auto& [p, bytes] : sizes_) out.push_back(p);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::map<void*, size_t> sizes_;
  size_t used_ = 0;
};

}  // namespace hetmoe::device
