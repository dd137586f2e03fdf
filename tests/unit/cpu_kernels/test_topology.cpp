// Thread placement and row partitioning on machines this one is not: hwloc synthetic topologies and hand-made
// uneven nodes.
#include <gtest/gtest.h>
#include <numa.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "cpu_kernels/numa/memory.h"
#include "cpu_kernels/numa/topology.h"

namespace hetmoe::cpu {
namespace {

int count(const std::vector<int>& v, int x) { return static_cast<int>(std::count(v.begin(), v.end(), x)); }

TEST(Topology, SyntheticTwoNodesReadsCoresAndThreads) {
  const Topology t = Topology::synthetic("numa:2 core:4 pu:2");
  ASSERT_EQ(t.nodes().size(), 2u);
  EXPECT_EQ(t.n_cores(), 8);
  for (const NumaNode& n : t.nodes()) {
    EXPECT_EQ(n.cores.size(), 4u);
    EXPECT_EQ(n.pus.size(), 8u);
  }
  EXPECT_THROW(Topology::synthetic("no such thing"), std::invalid_argument);
}

TEST(Topology, ThreadsGoToDistinctCoresEvenlyBeforeSiblings) {
  const Topology t = Topology::synthetic("numa:2 core:4 pu:2");
  const ThreadPlacement p8 = place_threads(t, 8);
  EXPECT_EQ(count(p8.nodes, t.nodes()[0].os_index), 4);
  EXPECT_EQ(count(p8.nodes, t.nodes()[1].os_index), 4);
  EXPECT_EQ(std::set<int>(p8.pus.begin(), p8.pus.end()).size(), 8u);
  // Each of the 8 PUs is the first hardware thread of a core.
  for (int pu : p8.pus) {
    bool is_core = false;
    for (const NumaNode& n : t.nodes()) is_core |= count(n.cores, pu) == 1;
    EXPECT_TRUE(is_core) << pu;
  }
  const ThreadPlacement p12 = place_threads(t, 12);  // more threads than cores: siblings, still 6 per node
  EXPECT_EQ(count(p12.nodes, t.nodes()[0].os_index), 6);
  EXPECT_EQ(std::set<int>(p12.pus.begin(), p12.pus.end()).size(), 12u);
  EXPECT_EQ(p12.nodes[0], t.nodes()[0].os_index) << "thread 0 is on the first node";
}

TEST(Topology, FourNodesAndUnevenNodesShareByCores) {
  const ThreadPlacement p = place_threads(Topology::synthetic("numa:4 core:3 pu:1"), 6);
  ASSERT_EQ(p.threads_of_node.size(), 4u);
  std::vector<size_t> per_node;
  for (const auto& th : p.threads_of_node) per_node.push_back(th.size());
  EXPECT_EQ(per_node, (std::vector<size_t>{2, 2, 1, 1}));

  // A 6-core node and a 2-core node: 8 threads split 6/2, 4 threads 3/1.
  NumaNode big{.os_index = 0, .cores = {0, 1, 2, 3, 4, 5}, .pus = {0, 1, 2, 3, 4, 5}};
  NumaNode small{.os_index = 1, .cores = {6, 7}, .pus = {6, 7}};
  const Topology uneven = Topology::from_nodes({big, small});
  EXPECT_EQ(place_threads(uneven, 8).threads_of_node[1].size(), 2u);
  EXPECT_EQ(place_threads(uneven, 4).threads_of_node[0].size(), 3u);
  EXPECT_EQ(place_threads(uneven, 4).threads_of_node[1].size(), 1u);
}

TEST(Topology, RowsSplitByThreadsOnAlignedBoundaries) {
  const ThreadPlacement even = place_threads(Topology::synthetic("numa:2 core:2 pu:1"), 4);
  const auto r = partition_rows(even, 1000, 64);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{0, 512}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{512, 1000}));

  NumaNode a{.os_index = 0, .cores = {0, 1, 2}, .pus = {0, 1, 2}};
  NumaNode b{.os_index = 1, .cores = {3}, .pus = {3}};
  const auto u = partition_rows(place_threads(Topology::from_nodes({a, b}), 4), 1408, 32);
  EXPECT_EQ(u[0], (std::pair<int64_t, int64_t>{0, 1056}));  // 3/4 of 1408, a multiple of 32
  EXPECT_EQ(u[1], (std::pair<int64_t, int64_t>{1056, 1408}));

  // Every row exactly once, for awkward sizes and alignments.
  for (int64_t rows : {1, 17, 37, 97, 1408})
    for (int64_t align : {1, 8, 64}) {
      const auto parts = partition_rows(place_threads(Topology::synthetic("numa:4 core:3 pu:2"), 7), rows, align);
      int64_t next = 0;
      for (const auto& [b0, e0] : parts) {
        EXPECT_EQ(b0, next);
        EXPECT_GE(e0, b0);
        next = e0;
      }
      EXPECT_EQ(next, rows) << rows << " rows, align " << align;
    }
}

TEST(Topology, ThisMachineHasAtLeastOneNodeWithCores) {
  const Topology t = Topology::detect();
  ASSERT_FALSE(t.nodes().empty());
  EXPECT_GE(t.n_cores(), 1);
  EXPECT_TRUE(pin_current_thread(t.nodes()[0].cores[0]));
}

}  // namespace
}  // namespace hetmoe::cpu

namespace hetmoe::cpu {
namespace {

// mbind on this machine's own node: the pages are bound and read back as living there; a node that does not exist
// is refused without harm.
TEST(NumaMemory, BindsPagesToANodeAndRefusesMissingNodes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), bytes = 64 * page;
  void* raw = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  auto* data = static_cast<uint8_t*>(raw);
  const int node = Topology::detect().nodes().front().os_index;
  if (numa_available() < 0) GTEST_SKIP() << "no NUMA support in this kernel";
  // An unaligned start: the bound range shrinks to the whole pages inside.
  EXPECT_EQ(bind_to_node(data + 1, bytes - 1, node), bytes - page);
  EXPECT_EQ(bind_to_node(data, bytes, node), bytes);
  std::memset(data, 1, bytes);
  EXPECT_EQ(node_of_page(data + 5 * page), node);
  EXPECT_EQ(bind_to_node(data, bytes, 1000), 0u);
  // Rows by node with a one-node placement: every whole page of the matrix goes to that node.
  const ThreadPlacement one = place_threads(Topology::detect(), 1);
  EXPECT_EQ(bind_rows_by_node(one, {node}, data, 64, page), bytes);
  EXPECT_EQ(page_aligned_rows(page), 1);
  EXPECT_EQ(page_aligned_rows(1152), static_cast<int64_t>(page / 128));  // Q4_K rows of 2048: 32 rows per 9 pages
  munmap(raw, bytes);
}

}  // namespace
}  // namespace hetmoe::cpu
