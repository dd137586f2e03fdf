#include "cpu_kernels/numa/memory.h"

#include <numa.h>
#include <numaif.h>
#include <unistd.h>

#include <numeric>

namespace hetmoe::cpu {
namespace {

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

int64_t page_aligned_rows(size_t row_bytes) {
  if (row_bytes == 0) return 1;
  return static_cast<int64_t>(page_size() / std::gcd(row_bytes, page_size()));
}

size_t bind_to_node(const void* data, size_t bytes, int node) {
  if (numa_available() < 0 || node < 0 || node > numa_max_node()) return 0;
  const size_t page = page_size();
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end <= begin) return 0;
  // One bit per node, in as many unsigned longs as the highest node needs.
  std::vector<unsigned long> mask(static_cast<size_t>(node) / (8 * sizeof(unsigned long)) + 1, 0);
  mask[static_cast<size_t>(node) / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  if (mbind(reinterpret_cast<void*>(begin), end - begin, MPOL_BIND, mask.data(),
            mask.size() * 8 * sizeof(unsigned long), MPOL_MF_MOVE) != 0)
    return 0;
  return end - begin;
}

int node_of_page(const void* addr) {
  if (numa_available() < 0) return -1;
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, const_cast<void*>(addr), MPOL_F_NODE | MPOL_F_ADDR) != 0) return -1;
  return node;
}

size_t bind_rows_by_node(const ThreadPlacement& placement, const std::vector<int>& node_os_index, const uint8_t* data,
                         int64_t n_rows, size_t row_bytes) {
  const auto ranges = partition_rows(placement, n_rows, page_aligned_rows(row_bytes));
  size_t bound = 0;
  for (size_t k = 0; k < ranges.size() && k < node_os_index.size(); ++k) {
    const auto [begin, end] = ranges[k];
    if (end > begin)
      bound += bind_to_node(data + static_cast<size_t>(begin) * row_bytes, static_cast<size_t>(end - begin) * row_bytes,
                            node_os_index[k]);
  }
  return bound;
}

}  // namespace hetmoe::cpu
