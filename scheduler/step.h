#pragma once

// One policy's layer steps and their books, kept once for the runtime's expert executor and the simulator alike: the
// plan of each step, the experts it moves through the ring of move slots, the residency's admissions and evictions
// after it, the next layer's prefetch into free move slots over an idle link, and the count of all of it. The
// executor carries a step out (copies, kernels) and the simulator costs it; neither decides anything of its own.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/plan.h"
#include "scheduler/policies.h"
#include "scheduler/residency.h"

namespace hetmoe::sched {

// What the steps did so far.
struct Traffic {
  uint64_t moves = 0;       // experts copied in for one step
  uint64_t admissions = 0;  // experts admitted into the residency (a copy each)
  uint64_t evictions = 0;
  uint64_t prefetches = 0;     // next-layer experts copied in while the link was idle
  uint64_t prefetch_hits = 0;  // of those, the ones their step ran
};

struct StepperOptions {
  int64_t n_layer = 0, n_expert = 0;
  // The ring of move slots (one expert each) that moved and prefetched experts go through; prefetches take at most
  // half of it, so a step that moves always finds a slot.
  int64_t move_slots = 0;
  Residency::Options residency{};  // slots 0: nothing resident (its adaptive flag is and-ed with the policy's trait)
};

class Stepper {
 public:
  // The policy of that name (make_policy; options.prefetch capped at half the move slots) over a residency of
  // options.residency.slots experts. Throws std::invalid_argument as make_policy does.
  Stepper(const std::string& policy, const CostModel* cost, const ExpertShape& expert, PolicyOptions policy_options,
          const StepperOptions& options);

  const Policy& policy() const { return *policy_; }
  // The residency the plans read: warm_start and exclude it before the first step.
  Residency& residency() { return residency_; }
  const Residency& residency() const { return residency_; }
  int64_t move_slots() const { return options_.move_slots; }
  const Traffic& traffic() const { return traffic_; }

  // Where a routed expert of a step runs.
  enum class Where : uint8_t {
    kCpu,         // on the CPU, in place
    kResident,    // resident on the device
    kPrefetched,  // copied into a move slot after the layer's last step (its slot: prefetched_slot)
    kMoved,       // copied for this step through the ring
  };
  struct Step {
    LayerPlan plan;                                   // the policy's plan (actions, critical rows)
    std::vector<int64_t> moves;                       // the moved experts, in ring order (most rows first)
    std::vector<int> ring;                            // move j goes through move slot ring[j % ring.size()]
    std::vector<std::pair<int64_t, int>> prefetched;  // this layer's prefetched experts the step runs, and their slots
    Where where(int64_t expert) const;
    int prefetched_slot(int64_t expert) const;  // -1 when not prefetched
  };
  // Plans one step of routing.layer. A layer the residency excludes (the device cannot run its weights) runs every
  // expert on the CPU and keeps no books.
  const Step& plan(const LayerRouting& routing);

  // What follows a step: the residency's admissions and evictions (each eviction before the admission it makes room
  // for), and the next layer's experts to prefetch, each with its move slot.
  struct After {
    std::vector<Residency::Change> changes;
    int64_t prefetch_layer = -1;
    std::vector<std::pair<int64_t, int>> prefetch;
  };
  // After the planned step ran: `executed` false when it fell back to the CPU (its moves and prefetch hits do not
  // count); `copies_pending` when earlier copies still hold the link (a prefetch behind them would hold up the next
  // layer). The link is idle for a prefetch only when neither holds and the step moved and admitted nothing.
  const After& finish(bool executed, bool copies_pending);

 private:
  StepperOptions options_;
  std::unique_ptr<Policy> policy_;
  Residency residency_;
  Traffic traffic_;
  LayerRouting routing_;  // the planned step's
  bool planned_ = false;  // a step waits for finish()
  Step step_;
  After after_;
  // The experts prefetched for prefetch_layer_'s next step, and their move slots.
  int64_t prefetch_layer_ = -1;
  std::vector<std::pair<int64_t, int>> prefetched_;
};

}  // namespace hetmoe::sched
