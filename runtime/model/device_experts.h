#pragma once

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
#include "runtime/model/moe.h"
#include "scheduler/step.h"

namespace hetmoe::model {

// FFNs on a device: routed experts' W^Q (the whole expert for an unsplit model), each layer's shared experts and
// the dense layers' FFNs, where the device runs their types; and the step that uses them: the device runs gate, up,
// SiLU and down of its experts while the CPU runs the residuals of their critical items and whatever is not on the
// device; the results meet by mixing weight. The output head, dense FFNs and shared experts are placed once at load
// in one allocation; routed experts live in slots of one size (the largest routed expert), placed and then admitted
// and evicted by the scheduler's residency cache, plus a ring of move slots for the experts a step moves and the
// next layer's prefetched experts.
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
    // An expert the device has no kernels for (gpt-oss's biases and clamped SwiGLU, DeepSeek-V4's clamped SwiGLU):
    // it stays on the CPU, and so do all of its layer's routed experts, as a layer's do when the device cannot take
    // their weight types.
    bool cpu_only = false;
  };

  // How much of the device the weights may take, and how routed experts are scheduled.
  struct Placement {
    size_t budget_bytes = 0;
    // Without a cost model, crossover and split move an expert that is not resident from this many rows in a step
    // (0: never).
    int64_t move_rows = 0;
    // The ring of move slots, each the size of the largest routed expert, set aside before the resident experts: a
    // step copies the experts it moves into them in turn (a slot is reused once the device is done with its last
    // expert), so a step can move more experts than there are slots.
    int move_slots = 0;
    // The scheduler's policy (scheduler/policies.h) for routed experts: each step runs its plan, GPU_RESIDENT on
    // the device, MOVE through the move slots, CPU_IN_PLACE on the CPU. static keeps routed experts off the device;
    // kt, crossover and split fill the expert slots at load, the hottest of warm_counts first (empty or all zero:
    // layer order); kt keeps that placement, crossover and split admit and evict as the routing goes.
    std::string policy = "crossover";
    const sched::CostModel* cost = nullptr;
    std::string isa{};                               // the cost model's CPU tier
    std::vector<std::vector<double>> warm_counts{};  // [layer][expert] routing counts (a routing trace)
    int64_t admissions = 1;  // crossover, split: experts admitted per step at most (0: the placement at load stays)
    int64_t prefetch = 1;    // crossover, split: next-layer experts prefetched per step (at most half the move slots)
  };

  // What the scheduler did since construction: experts moved for a step, admitted into and evicted from the expert
  // slots, prefetched, and prefetched experts the next step used.
  using Traffic = sched::Traffic;

  // Places the experts while the budget lasts (less the move slots) and the device runs their types: the output
  // head, dense FFNs and shared experts in the order given, in one allocation; then as many expert slots as the rest
  // of the budget holds (one allocation), filled as the policy says. Asynchronous copies, waited for once.
  DeviceExperts(device::Device& device, const Placement& placement, std::span<const Expert> experts);
  // Waits for the copies still queued (admissions and prefetches run past the step that made them).
  ~DeviceExperts();
  DeviceExperts(const DeviceExperts&) = delete;
  DeviceExperts& operator=(const DeviceExperts&) = delete;
  bool resident(int64_t layer, int64_t expert) const { return slots_.count({layer, expert}) != 0; }

  int move_slots() const { return static_cast<int>(move_slots_.size()); }
  // The (layer, expert) pairs moved in since the last call, in order; clears the record.
  std::vector<std::pair<int64_t, int64_t>> take_moves() { return std::exchange(moves_, {}); }
  // The residency's admissions and evictions since the last call, in order; clears the record.
  std::vector<sched::Residency::Change> take_changes() { return std::exchange(changes_, {}); }
  const Traffic& traffic() const { return stepper_ ? stepper_->traffic() : kNoTraffic; }
  // Routed experts the expert slots hold at most.
  int64_t expert_slots() const { return static_cast<int64_t>(pool_slots_.size()); }
  size_t resident_bytes() const { return resident_bytes_; }
  // Weight bytes the CPU streamed for routed experts (whole, or their residuals) since construction.
  uint64_t cpu_expert_bytes() const { return cpu_expert_bytes_; }
  // The policy the steps follow ("" for a model without routed experts).
  std::string policy() const { return stepper_ ? stepper_->policy().name() : std::string(); }
  // Resident FFNs: routed experts, shared experts and dense FFNs.
  int64_t resident_experts() const { return static_cast<int64_t>(slots_.size()); }
  device::Device& device() const { return device_; }

  // The stream the steps run on; a device-resident forward pass queues its own work there, in order with them.
  int compute_stream() const { return compute_; }

  // The MoE FFN of one layer step on ffn's rows, as the scheduler's step plans it, the CPU taking what is not on the
  // device; all of it on the CPU when the device has no room for the step's rows.
  void run(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeStep& step, const FfnRows& ffn);
  // y [n][rows] = W x for a resident single matrix (the output head: resident(-1, kOutput)), x [n][cols] on the host
  // (or, with x_device, already on the device). False when the matrix is not resident or the device has no room for
  // the step's rows (nothing done: the caller runs it on the CPU).
  bool run_matrix(int64_t layer, int64_t id, const float* x, int64_t n, float* y, const float* x_device = nullptr);
  // Copies ffn.out, a result computed on the CPU, to ffn.device.out, and waits (nothing without device rows).
  void upload_result(const FfnRows& ffn);
  // A dense layer's FFN (n_ff wide) on the device; false as run_matrix (not resident(layer, kDense), or no room).
  bool run_dense(const cpu::KernelTable& k, cpu::ThreadPool& pool, int64_t layer, int64_t n_ff, const FfnRows& ffn);

 private:
  // An FFN's matrices on the device; a routed expert's expert slot (pool) and, after an admission, the copy that
  // fills it (steps that use it wait for it first).
  struct Slot {
    device::DeviceMatrix gate, up, down;
    int pool = -1;
    bool filling = false;
    device::Event filled{};
  };
  // One expert of a step that runs on the device: a routed expert's items order[o0 .. o1), or the shared experts or
  // a dense FFN (one item per token, o0 = 0, o1 = n); their rows [row0, row0 + m) of the n_embd-wide buffers and
  // the floats [h0, h0 + m * width) of the hidden-wide ones, and whether any item is critical. Experts on the device
  // (resident or prefetched) come first, then the moved ones in the order they go through the ring.
  struct Work {
    int64_t expert = 0, o0 = 0, o1 = 0, row0 = 0, h0 = 0, width = 0;
    bool any_critical = false;
    const Slot* slot = nullptr;  // an expert on the device
    int move = -1;               // >= 0: the step's move number (its matrices: moving_[move])
    int64_t m() const { return o1 - o0; }
  };
  // The device's part of a step (`work`: experts with their items) and the CPU's (`batch`), at the same time.
  // Reserves the step's device and host buffers; false when the device memory is too full (nothing queued).
  bool reserve(int64_t rows_in, int64_t rows_out, int64_t hidden, bool residual);
  // `step` is null for a dense FFN.
  bool execute(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeStep* step, int64_t layer,
               const std::vector<Work>& work, const cpu::ExpertBatch& batch, const FfnRows& ffn);
  const Slot& slot_of(const Work& d) const { return d.move >= 0 ? moving_[static_cast<size_t>(d.move)] : *d.slot; }
  // Queues the copy of the step's move j (routed expert plan_->moves[j] of `layer`) into its ring slot on the copy
  // stream, after the device is done with the slot's previous expert of the step; moving_[j].filled marks its end.
  void queue_move(int64_t layer, size_t j);
  // Queues the copy of a routed expert's matrices to `base` on the copy stream; `filled` marks its end.
  Slot copy_expert(int64_t layer, int64_t expert, uint8_t* base);
  // After a planned step (executed: as planned, not fallen back to the CPU): the residency's admissions and evictions
  // into the expert slots, then the next layer's prefetch into the move slots, as the stepper says.
  void after_step(bool executed);
  const Expert& routed(int64_t layer, int64_t expert) const {
    return routed_[static_cast<size_t>(layer * n_expert_ + expert)];
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
  device::DeviceMemory weights_;  // output head, dense FFNs, shared experts
  int64_t n_layer_ = 0, n_expert_ = 0;
  std::vector<Expert> routed_;  // [layer * n_expert + expert]: every routed expert's host matrices
  // Expert slots: routed experts resident on the device, one size each; the free ones.
  device::DeviceMemory pool_memory_;
  std::vector<uint8_t*> pool_slots_;
  std::vector<int> free_pool_;
  size_t slot_bytes_ = 0;
  // The ring of move slots: whole routed experts that are not resident, copied in for a step on the copy stream
  // while the compute stream works, then used like resident ones. Per step: the ring (the slots no prefetched expert
  // of the step holds), each move's matrices, the copies' and the computes' events.
  device::DeviceMemory move_memory_;
  std::vector<uint8_t*> move_slots_;
  // The current step's plan (moves in ring order, the ring); all on the CPU outside a planned step.
  static inline const sched::Stepper::Step all_on_cpu{};
  const sched::Stepper::Step* plan_ = &all_on_cpu;
  std::vector<Slot> moving_;
  std::vector<device::Event> move_done_;
  std::vector<Slot> prefetch_slots_;  // [move slot]: a next-layer expert prefetched there (the stepper knows which)
  device::Event last_copy_{};         // the end of the last expert copy queued (when copied_)
  bool copied_ = false;
  // The scheduler's steps and books (null for a model without routed experts): the policy, the residency that the
  // expert slots mirror slot for slot, the moves and prefetches.
  std::optional<sched::Stepper> stepper_;
  static constexpr Traffic kNoTraffic{};
  uint64_t cpu_expert_bytes_ = 0;
  std::vector<std::pair<int64_t, int64_t>> moves_;
  std::vector<sched::Residency::Change> changes_;
  device::DeviceMemory x_, g_, u_, gr_, ur_, h_, y_, cpu_part_, gather_, combine_;
  // Pinned host staging of the step's rows: inputs, residual gate/up, hidden rows back, down rows back; with the
  // input and output on the device: the rows to gather, the combine's rows and weights, the CPU's part.
  device::HostMemory xs_, gr_host_, ur_host_, hs_, ys_, gather_host_, combine_host_, cpu_part_host_;
};

}  // namespace hetmoe::model
