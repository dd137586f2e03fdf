#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cpu_kernels/numa/topology.h"

namespace hetmoe::cpu {

// Row counts whose byte size is a whole number of pages: node boundaries on such rows fall on page boundaries
// (relative to the matrix start), so every page belongs to one node.
int64_t page_aligned_rows(size_t row_bytes);

// Puts the pages of [data, data + bytes) on `node` (its os index) with mbind(MPOL_BIND, MPOL_MF_MOVE): pages
// already in memory move, pages read later are allocated there. The range is shrunk to whole pages; a page that
// straddles two nodes' ranges stays where it is. Returns the bytes bound; 0 when the kernel refuses (no NUMA
// support, a node without memory) — the data stays valid either way, only its placement differs.
size_t bind_to_node(const void* data, size_t bytes, int node);

// The node of the page holding `addr` (get_mempolicy MPOL_F_NODE | MPOL_F_ADDR), -1 when unknown or not resident.
int node_of_page(const void* addr);

// Binds the rows of a matrix ([n_rows] rows of row_bytes at data) to the nodes by partition_rows: node k's rows are
// the ones its threads compute, so every weight byte is read from local memory and no node holds a copy.
// Returns the bytes bound.
size_t bind_rows_by_node(const ThreadPlacement& placement, const std::vector<int>& node_os_index, const uint8_t* data,
                         int64_t n_rows, size_t row_bytes);

}  // namespace hetmoe::cpu
