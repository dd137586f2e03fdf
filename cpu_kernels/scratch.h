#pragma once

#include <bit>
#include <cstddef>
#include <span>
#include <vector>

namespace hetmoe::cpu {

// Temporary memory that keeps its capacity: a function that needs a buffer on every call takes it from here, one
// buffer per call site (`Site`, any type named at the call) and thread. The decode loop then stops allocating
// once the largest call has been seen; the price is that each site holds its largest buffer until the thread
// ends (a prefill batch's worth, never more). Sizes up to a million elements round up to a power of two, so a
// buffer that grows by a little each step (attention scores: one key more per token) reallocates rarely.
template <typename T, typename Site>
std::span<T> scratch(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n <= (size_t{1} << 20) ? std::bit_ceil(n) : n);
  return {buffer.data(), n};
}

}  // namespace hetmoe::cpu
