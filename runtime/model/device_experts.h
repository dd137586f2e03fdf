#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cpu_kernels/experts.h"
#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/thread_pool.h"
#include "runtime/device/device.h"
#include "scheduler/policies.h"
#include "scheduler/residency.h"

namespace hetmoe::model {

struct MoeWeights;
struct Routing;
struct RoutedItems;

// Where a step's rows live when the forward pass runs on the device: `x` is the device copy of the step's host input,
// and the result goes to `out` (device memory, overwritten); the host output then only holds the CPU's part. Null
// members: input and result on the host.
struct StepOnDevice {
  const float* x = nullptr;
  float* out = nullptr;
};

// FFNs on a device: routed experts' W^Q (the whole expert for an unsplit model), each layer's shared experts and
// the dense layers' FFNs, uploaded once at load in layer order while the budget lasts and where the device runs
// their types; and the step that uses them: the device runs gate, up, SiLU and down of its experts while the CPU runs
// the residuals of their critical items and whatever did not fit; the results meet by mixing weight. Residency is
// decided at load (first come, first served by layer and expert) until the scheduler of issue 6 owns placement.
class DeviceExperts {
 public:
  // The expert ids of a layer's shared experts (one SwiGLU of n_expert_shared x n_ff_exp rows) and of a dense
  // layer's FFN.
  static constexpr int64_t kShared = -1;
  static constexpr int64_t kDense = -2;
  // The id of a single matrix (gate only, up and down empty): the output head, at layer -1.
  static constexpr int64_t kOutput = -3;

  // One routed expert's matrices (W^Q for a split model), or a layer's shared experts (expert kShared).
  struct Expert {
    int64_t layer = 0, expert = 0;
    cpu::WeightMatrix gate, up, down;
  };

  // How much of the device the weights may take, and the move slots: routed experts that are not resident but get
  // at least `move_rows` rows in a step are copied in for that step (largest first, as many as there are slots)
  // instead of running on the CPU; 0 never moves. A fixed row threshold until issue 6's scheduler decides per expert
  // from the cost model.
  struct Placement {
    size_t budget_bytes = 0;
    int64_t move_rows = 0;
    int move_slots = 0;  // each the size of the largest routed expert, set aside before the resident experts
    // The scheduler's policy (scheduler/policies.h) for routed experts: each step runs its plan, GPU_RESIDENT on
    // the device, MOVE through the move slots (at most move_slots per step, the rest on the CPU), CPU_IN_PLACE on
    // the CPU. static keeps routed experts off the device; kt, crossover and split place them at load, the hottest
    // of warm_counts first (empty: layer order), and keep that placement (admission and eviction run in the
    // simulator only, so far). Without a cost model crossover and split move from move_rows rows.
    std::string policy = "crossover";
    const sched::CostModel* cost = nullptr;
    std::string isa{};                               // the cost model's CPU tier
    std::vector<std::vector<double>> warm_counts{};  // [layer][expert] routing counts (a routing trace)
  };

  // Places the experts, in the order given, while the budget lasts (less the move slots) and the device runs their
  // types: one device allocation for all of them (no allocator per expert), filled by asynchronous copies, waited
  // for once.
  DeviceExperts(device::Device& device, const Placement& placement, std::span<const Expert> experts);
  bool resident(int64_t layer, int64_t expert) const { return slots_.count({layer, expert}) != 0; }

  int move_slots() const { return static_cast<int>(move_slots_.size()); }
  // The (layer, expert) pairs moved in since the last call, in order; clears the record.
  std::vector<std::pair<int64_t, int64_t>> take_moves() { return std::exchange(moves_, {}); }
  size_t resident_bytes() const { return resident_bytes_; }
  // Weight bytes the CPU streamed for routed experts (whole, or their residuals) since construction.
  uint64_t cpu_expert_bytes() const { return cpu_expert_bytes_; }
  const std::string& policy() const { return policy_name_; }
  // Resident FFNs: routed experts, shared experts and dense FFNs.
  int64_t resident_experts() const { return static_cast<int64_t>(slots_.size()); }
  device::Device& device() const { return device_; }

  // The stream the steps run on; a device-resident forward pass queues its own work there, in order with them.
  int compute_stream() const { return compute_; }

  // The MoE FFN of one layer for tokens x [n][n_embd] routed as `r`, into out [n][n_embd], with the CPU taking what
  // is not resident (as moe_ffn would); all of it on the CPU when the device has no room for the step's rows.
  void run(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeWeights& w, const Routing& r,
           const RoutedItems& items, int64_t layer, const float* x, int64_t n, int64_t n_embd, float* out,
           const StepOnDevice& io = {});
  // y [n][rows] = W x for a resident single matrix (the output head: resident(-1, kOutput)), x [n][cols] on the host
  // (or, with x_device, already on the device). False when the device has no room for the step's rows (nothing done:
  // the caller runs it on the CPU).
  bool run_matrix(int64_t layer, int64_t id, const float* x, int64_t n, float* y, const float* x_device = nullptr);
  // Copies a host result [n][n_embd] computed on the CPU to io.out, and waits (nothing when io.out is null).
  void upload_result(const float* out, int64_t n, int64_t n_embd, const StepOnDevice& io);
  // A dense layer's FFN (n_ff wide) on the device, when resident(layer, kDense); false as run_matrix.
  bool run_dense(const cpu::KernelTable& k, cpu::ThreadPool& pool, int64_t layer, int64_t n_ff, const float* x,
                 int64_t n, int64_t n_embd, float* out, const StepOnDevice& io = {});

 private:
  struct Slot {
    device::DeviceMatrix gate, up, down;
  };
  // One expert of a step that runs on the device: a routed expert's items order[o0 .. o1), or the shared experts or
  // a dense FFN (one item per token, o0 = 0, o1 = n); their rows [row0, row0 + m) of the n_embd-wide buffers and
  // the floats [h0, h0 + m * width) of the hidden-wide ones, and whether any item is critical.
  struct Work {
    int64_t expert = 0, o0 = 0, o1 = 0, row0 = 0, h0 = 0, width = 0;
    bool any_critical = false;
    int move_slot = -1;  // >= 0: not resident, copied into this move slot for the step
    int64_t m() const { return o1 - o0; }
  };
  // The device's part of a step (`work`: experts with their items) and the CPU's (`batch`), at the same time.
  // Reserves the step's device and host buffers; false when the device memory is too full (nothing queued).
  bool reserve(int64_t rows_in, int64_t rows_out, int64_t hidden, bool residual);
  bool execute(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeWeights* moe, const Routing* routing,
               const RoutedItems* routed, int64_t layer, const std::vector<Work>& work, const cpu::ExpertBatch& batch,
               const float* x, int64_t n, int64_t n_embd, float* out, const StepOnDevice& io);
  const Slot& slot_of(int64_t layer, const Work& d) const {
    return d.move_slot >= 0 ? moving_[static_cast<size_t>(d.move_slot)] : slots_.at({layer, d.expert});
  }
  // Whether the device runs all three matrices' types (an empty matrix needs nothing).
  bool runs(const cpu::WeightMatrix& gate, const cpu::WeightMatrix& up, const cpu::WeightMatrix& down) const;
  // A device buffer that grows to the largest request (waiting for queued work before it replaces a buffer).
  float* scratch(device::DeviceMemory& mem, size_t floats);

  device::Device& device_;
  size_t budget_;
  size_t resident_bytes_ = 0;
  int compute_ = 0, copy_ = 0;
  std::map<std::pair<int64_t, int64_t>, Slot> slots_;
  device::DeviceMemory weights_;
  // Move slots: room for whole routed experts that are not resident, copied in for a step on the copy stream while
  // the compute stream works, then used like resident ones.
  device::DeviceMemory move_memory_;
  std::vector<uint8_t*> move_slots_;
  size_t move_slot_bytes_ = 0;
  std::array<Slot, 64> moving_{};  // the matrices in each move slot this step
  std::string policy_name_;
  std::unique_ptr<sched::Policy> policy_;      // null for a model without routed experts
  std::optional<sched::Residency> residency_;  // routed experts' placement as the policy sees it
  uint64_t cpu_expert_bytes_ = 0;
  std::vector<std::pair<int64_t, int64_t>> moves_;
  device::DeviceMemory x_, g_, u_, gr_, ur_, h_, y_, cpu_part_, gather_, combine_;
  // Pinned host staging of the step's rows: inputs, residual gate/up, hidden rows back, down rows back; with the
  // input and output on the device: the rows to gather, the combine's rows and weights, the CPU's part.
  device::HostMemory xs_, gr_host_, ur_host_, hs_, ys_, gather_host_, combine_host_, cpu_part_host_;
};

}  // namespace hetmoe::model
