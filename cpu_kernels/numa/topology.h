#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hetmoe::cpu {

// The machine as the CPU engine sees it: NUMA nodes, each with the processing units (hardware threads) and cores
// it owns. Read from hwloc, or built from an hwloc synthetic description ("package:2 numa:1 core:4 pu:1") so the
// placement logic can be tested for machines this one is not.
struct NumaNode {
  int os_index = 0;           // the node number Linux and libnuma use
  std::vector<int> cores;     // one PU (os index) per physical core, the core's first hardware thread
  std::vector<int> pus;       // every PU of the node
  uint64_t memory_bytes = 0;  // local memory, 0 when unknown
};

class Topology {
 public:
  // This machine. A machine hwloc cannot read is one node holding every online CPU.
  static Topology detect();
  // An hwloc synthetic topology; fails (std::invalid_argument) on a description hwloc rejects.
  static Topology synthetic(const std::string& description);
  // Given nodes, e.g. uneven ones that hwloc's synthetic syntax cannot express.
  static Topology from_nodes(std::vector<NumaNode> nodes);

  const std::vector<NumaNode>& nodes() const { return nodes_; }
  int n_cores() const;

 private:
  std::vector<NumaNode> nodes_;
};

// Where each pool thread runs: thread i is pinned to `pus[i]` on node `nodes[i]`.
struct ThreadPlacement {
  std::vector<int> nodes;
  std::vector<int> pus;
  // The threads of each node, in pool order.
  std::vector<std::vector<int>> threads_of_node;
};

// Spreads n_threads over the nodes in proportion to their cores (uneven nodes get uneven shares, every node with
// cores gets at least one thread when n_threads allows), one thread per physical core first, hardware siblings
// only when threads outnumber cores. Thread 0 (the caller's thread in the pool) lands on the first node.
ThreadPlacement place_threads(const Topology& topology, int n_threads);

// Splits rows [0, n_rows) into one contiguous range per node, in proportion to the node's threads, with range
// boundaries on multiples of `align_rows` (so a node's rows start on its own pages). Ranges of nodes without
// threads are empty. Result: per node {begin, end}.
std::vector<std::pair<int64_t, int64_t>> partition_rows(const ThreadPlacement& placement, int64_t n_rows,
                                                        int64_t align_rows);
// The same into out[0 .. nodes), without allocating (the decode loop calls it per expert).
void partition_rows(const ThreadPlacement& placement, int64_t n_rows, int64_t align_rows,
                    std::pair<int64_t, int64_t>* out);

// Pins the calling thread to one PU; false when the OS refuses (the thread then keeps running unpinned).
bool pin_current_thread(int pu);

}  // namespace hetmoe::cpu
