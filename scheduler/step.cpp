#include "scheduler/step.h"

#include <algorithm>

namespace hetmoe::sched {
namespace {

PolicyOptions capped(PolicyOptions o, const StepperOptions& s) {
  o.n_layer = s.n_layer;
  o.prefetch = std::min<int64_t>(std::max<int64_t>(o.prefetch, 0), s.move_slots / 2);
  return o;
}

Residency::Options residency_options(Residency::Options r, const Policy& policy) {
  if (!policy.traits().uses_residency) r.slots = 0;
  r.adaptive = r.adaptive && policy.traits().adapts_residency;
  return r;
}

}  // namespace

Stepper::Stepper(const std::string& policy, const CostModel* cost, const ExpertShape& expert,
                 PolicyOptions policy_options, const StepperOptions& options)
    : options_(options),
      policy_(make_policy(policy, cost, expert, capped(std::move(policy_options), options))),
      residency_(options.n_layer, options.n_expert, residency_options(options.residency, *policy_)) {}

Stepper::Where Stepper::Step::where(int64_t expert) const {
  if (std::find(moves.begin(), moves.end(), expert) != moves.end()) return Where::kMoved;
  if (prefetched_slot(expert) >= 0) return Where::kPrefetched;
  for (const ExpertStep& s : plan.experts)
    if (s.expert == expert) return s.action == Action::kGpuResident ? Where::kResident : Where::kCpu;
  return Where::kCpu;
}

int Stepper::Step::prefetched_slot(int64_t expert) const {
  for (const auto& [e, slot] : prefetched)
    if (e == expert) return slot;
  return -1;
}

const Stepper::Step& Stepper::plan(const LayerRouting& routing) {
  const int64_t layer = routing.layer;
  step_ = Step{};
  step_.plan.layer = layer;
  // Prefetched experts serve their layer's next step only: this one, or none.
  if (prefetch_layer_ != layer) prefetched_.clear();
  if (residency_.excluded(layer)) {
    for (const LayerRouting::Expert& x : routing.experts)
      step_.plan.experts.push_back({x.expert, x.rows, 0, Action::kCpuInPlace});
    prefetched_.clear();
    planned_ = false;
    return step_;
  }
  std::vector<int64_t> staged;
  for (const auto& [e, slot] : prefetched_) staged.push_back(e);
  residency_.set_prefetched(layer, std::move(staged));
  step_.plan = policy_->plan(routing, &residency_);
  // Resident experts run on the device and the others on the CPU, whatever else the plan says; prefetched ones run
  // from their move slots when routed to.
  for (ExpertStep& s : step_.plan.experts) {
    const auto prefetched = std::find_if(prefetched_.begin(), prefetched_.end(),
                                         [&](const std::pair<int64_t, int>& p) { return p.first == s.expert; });
    const bool resident = residency_.resident(layer, s.expert);
    if (resident || prefetched != prefetched_.end()) {
      s.action = Action::kGpuResident;
    } else if (s.action == Action::kGpuResident) {
      s.action = Action::kCpuInPlace;
    }
    if (!resident && prefetched != prefetched_.end()) step_.prefetched.push_back(*prefetched);
  }
  // The ring: the move slots no prefetched expert of this step holds. Without one, a planned move runs on the CPU.
  for (int i = 0; i < static_cast<int>(options_.move_slots); ++i)
    if (std::none_of(step_.prefetched.begin(), step_.prefetched.end(),
                     [&](const std::pair<int64_t, int>& p) { return p.second == i; }))
      step_.ring.push_back(i);
  std::vector<const ExpertStep*> moved;
  for (ExpertStep& s : step_.plan.experts) {
    if (s.action != Action::kMove) continue;
    if (step_.ring.empty()) {
      s.action = Action::kCpuInPlace;
      continue;
    }
    moved.push_back(&s);
  }
  // The largest first (ties: lower id), so the ring's first copies carry the most work.
  std::stable_sort(moved.begin(), moved.end(),
                   [](const ExpertStep* a, const ExpertStep* b) { return a->rows > b->rows; });
  for (const ExpertStep* s : moved) step_.moves.push_back(s->expert);
  routing_ = routing;
  planned_ = true;
  return step_;
}

const Stepper::After& Stepper::finish(bool executed, bool copies_pending) {
  after_ = After{};
  prefetched_.clear();
  prefetch_layer_ = -1;
  if (!planned_) return after_;
  planned_ = false;
  if (executed) {
    traffic_.moves += step_.moves.size();
    traffic_.prefetch_hits += step_.prefetched.size();
  }
  after_.changes = residency_.observe(routing_);
  bool admitted = false;
  for (const Residency::Change& ch : after_.changes) {
    ++(ch.admitted ? traffic_.admissions : traffic_.evictions);
    admitted = admitted || ch.admitted;
  }
  const std::vector<int64_t> next = prefetch_after(step_.plan, admitted || copies_pending);
  after_.prefetch_layer = routing_.layer + 1;
  for (size_t i = 0; i < next.size(); ++i) after_.prefetch.emplace_back(next[i], static_cast<int>(i));
  traffic_.prefetches += next.size();
  prefetch_layer_ = after_.prefetch_layer;
  prefetched_ = after_.prefetch;
  return after_;
}

}  // namespace hetmoe::sched
