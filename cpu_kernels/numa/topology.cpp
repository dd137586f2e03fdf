#include "cpu_kernels/numa/topology.h"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace hetmoe::cpu {
namespace {

// RAII for an hwloc topology.
struct HwlocTopology {
  hwloc_topology_t t = nullptr;
  HwlocTopology() { hwloc_topology_init(&t); }
  ~HwlocTopology() { hwloc_topology_destroy(t); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
};

std::vector<NumaNode> read_nodes(hwloc_topology_t t) {
  std::vector<NumaNode> nodes;
  const int n_nodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n_nodes; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode n;
    n.os_index = static_cast<int>(node->os_index);
    n.memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    const int n_cores = hwloc_get_nbobjs_inside_cpuset_by_type(t, node->cpuset, HWLOC_OBJ_CORE);
    for (int c = 0; c < n_cores; ++c) {
      hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(t, node->cpuset, HWLOC_OBJ_CORE, static_cast<unsigned>(c));
      hwloc_obj_t pu = hwloc_get_obj_inside_cpuset_by_type(t, core->cpuset, HWLOC_OBJ_PU, 0);
      if (pu) n.cores.push_back(static_cast<int>(pu->os_index));
    }
    const int n_pus = hwloc_get_nbobjs_inside_cpuset_by_type(t, node->cpuset, HWLOC_OBJ_PU);
    for (int p = 0; p < n_pus; ++p)
      n.pus.push_back(static_cast<int>(
          hwloc_get_obj_inside_cpuset_by_type(t, node->cpuset, HWLOC_OBJ_PU, static_cast<unsigned>(p))->os_index));
    nodes.push_back(std::move(n));
  }
  return nodes;
}

}  // namespace

Topology Topology::detect() {
  Topology topo;
  HwlocTopology h;
  if (hwloc_topology_load(h.t) == 0) topo.nodes_ = read_nodes(h.t);
  if (topo.nodes_.empty() || topo.n_cores() == 0) {
    NumaNode all;
    const long n = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    for (int i = 0; i < n; ++i) all.cores.push_back(i);
    all.pus = all.cores;
    topo.nodes_ = {all};
  }
  return topo;
}

Topology Topology::synthetic(const std::string& description) {
  HwlocTopology h;
  if (hwloc_topology_set_synthetic(h.t, description.c_str()) != 0 || hwloc_topology_load(h.t) != 0)
    throw std::invalid_argument("hwloc rejects the synthetic topology '" + description + "'");
  Topology topo;
  topo.nodes_ = read_nodes(h.t);
  return topo;
}

Topology Topology::from_nodes(std::vector<NumaNode> nodes) {
  Topology topo;
  topo.nodes_ = std::move(nodes);
  return topo;
}

int Topology::n_cores() const {
  int n = 0;
  for (const NumaNode& node : nodes_) n += static_cast<int>(node.cores.size());
  return n;
}

ThreadPlacement place_threads(const Topology& topology, int n_threads) {
  const std::vector<NumaNode>& nodes = topology.nodes();
  ThreadPlacement p;
  p.threads_of_node.resize(nodes.size());
  const int total_cores = std::max(1, topology.n_cores());
  // Threads per node by largest remainder over the core counts.
  std::vector<int> share(nodes.size(), 0);
  std::vector<std::pair<double, size_t>> remainders;
  int given = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const double exact = static_cast<double>(n_threads) * static_cast<double>(nodes[i].cores.size()) / total_cores;
    share[i] = static_cast<int>(exact);
    given += share[i];
    remainders.push_back({exact - share[i], i});
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < n_threads && k < remainders.size(); ++k, ++given) ++share[remainders[k].second];
  for (size_t k = 0; given < n_threads; k = (k + 1) % nodes.size())  // only when every node has no cores
    if (!nodes[k].pus.empty()) ++share[k], ++given;

  // Within a node: distinct cores first, then the remaining hardware threads, then wrap around.
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<int> order = nodes[i].cores;
    for (int pu : nodes[i].pus)
      if (std::find(order.begin(), order.end(), pu) == order.end()) order.push_back(pu);
    for (int k = 0; k < share[i] && !order.empty(); ++k) {
      p.threads_of_node[i].push_back(static_cast<int>(p.nodes.size()));
      p.nodes.push_back(nodes[i].os_index);
      p.pus.push_back(order[static_cast<size_t>(k) % order.size()]);
    }
  }
  return p;
}

std::vector<std::pair<int64_t, int64_t>> partition_rows(const ThreadPlacement& placement, int64_t n_rows,
                                                        int64_t align_rows) {
  std::vector<std::pair<int64_t, int64_t>> ranges(placement.threads_of_node.size());
  partition_rows(placement, n_rows, align_rows, ranges.data());
  return ranges;
}

void partition_rows(const ThreadPlacement& placement, int64_t n_rows, int64_t align_rows,
                    std::pair<int64_t, int64_t>* ranges) {
  const size_t n_nodes = placement.threads_of_node.size();
  std::fill(ranges, ranges + n_nodes, std::pair<int64_t, int64_t>{0, 0});
  const int64_t total_threads = static_cast<int64_t>(placement.nodes.size());
  if (total_threads == 0 || n_rows <= 0) return;
  align_rows = std::max<int64_t>(1, align_rows);
  int64_t begin = 0, threads_before = 0;
  for (size_t i = 0; i < n_nodes; ++i) {
    const int64_t threads = static_cast<int64_t>(placement.threads_of_node[i].size());
    threads_before += threads;
    // Cut at the aligned row nearest to this node's proportional end; the last node with threads takes the rest.
    int64_t end = threads_before == total_threads ? n_rows : n_rows * threads_before / total_threads;
    if (end != n_rows) end = std::min(n_rows, (end + align_rows / 2) / align_rows * align_rows);
    end = std::max(end, begin);
    ranges[i] = threads == 0 ? std::pair<int64_t, int64_t>{begin, begin} : std::pair<int64_t, int64_t>{begin, end};
    begin = ranges[i].second;
  }
}

bool pin_current_thread(int pu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(pu, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

}  // namespace hetmoe::cpu
