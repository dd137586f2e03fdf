#pragma once

// What the scheduler decides for one layer's step, and what it decides from.

#include <cstdint>
#include <vector>

namespace hetmoe::sched {

// Where an activated expert runs in a step.
enum class Action : uint8_t {
  kGpuResident,  // its device part is on the device: x . W^Q there (+ x . W^R on the CPU for critical rows)
  kMove,         // copied to the device for this step, computed there
  kCpuInPlace,   // run on the CPU from the mapped weights
};

// One layer's step as the router left it: the activated experts (ascending id) with their rows (tokens routed to
// them), the rows for which they are critical (split models: among the token's largest mixing weights) and the sum
// of their mixing weights.
struct LayerRouting {
  struct Expert {
    int64_t expert = 0;
    int64_t rows = 0;
    int64_t critical_rows = 0;
    double gate = 0;
  };
  int64_t layer = 0;
  int64_t n_tokens = 0;
  std::vector<Expert> experts;
};

// Whether slot `slot` of a token's n_used mixing weights is among its n_critical largest (ties: the earlier slot):
// the rule that picks the experts whose residual a split model adds, for the runtime and the simulator alike.
inline bool is_critical(const float* weights, int64_t n_used, int64_t slot, int64_t n_critical) {
  int64_t above = 0;  // slots that rank before this one
  for (int64_t b = 0; b < n_used; ++b) above += weights[b] > weights[slot] || (weights[b] == weights[slot] && b < slot);
  return above < n_critical;
}

struct ExpertStep {
  int64_t expert = 0;
  int64_t rows = 0;
  int64_t critical_rows = 0;  // kGpuResident of a split model: rows whose residual the CPU adds
  Action action = Action::kCpuInPlace;
};

struct LayerPlan {
  int64_t layer = 0;
  bool dense_on_device = false;     // attention, norms, router, shared experts and dense FFNs on the device
  std::vector<ExpertStep> experts;  // in the routing's order
  std::vector<int64_t> prefetch;    // experts of layer + 1 to copy in while the link is idle
};

// The experts to prefetch after a step: the plan's list when the link is idle (the step moved nothing, and no
// admission or earlier copy is still queued: link_busy false), else none. One rule for the executor and the
// simulator.
inline std::vector<int64_t> prefetch_after(const LayerPlan& plan, bool link_busy) {
  if (link_busy) return {};
  for (const ExpertStep& s : plan.experts)
    if (s.action == Action::kMove) return {};
  return plan.prefetch;
}

}  // namespace hetmoe::sched
