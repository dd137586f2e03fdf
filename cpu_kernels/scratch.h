#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace hetmoe::cpu {

// Temporary memory that keeps its capacity: a function that needs a buffer on every call takes it from here, one
// buffer per call site (`Site`, any type named at the call) and thread. The decode loop then stops allocating
// once the largest call has been seen; the price is that each site holds its largest buffer until the thread
// ends (a prefill batch's worth, never more).
template <typename T, typename Site>
std::span<T> scratch(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return {buffer.data(), n};
}

}  // namespace hetmoe::cpu
