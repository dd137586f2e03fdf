#pragma once

// Offload policies: each turns a layer's routing (and the residency cache, for those that keep one) into a plan;
// one executor runs every policy's plans, so they differ only in what they decide.
//   cpu        everything on the CPU (the reference point).
//   static     llama.cpp with --cpu-moe: attention, norms and shared experts on the device, routed experts on the
//              CPU; a step of batch_threshold tokens or more (32) moves its experts to the device.
//   kt         KTransformers: as static, plus the experts warm_start placed on the device (fixed), and a prefill
//              of kt_prefill_tokens tokens or more moves the rest.
//   crossover  per expert and step: resident (and prefetched) experts run on the device; an absent one moves when
//              its rows reach the crossover of the CPU's ISA tier (cost model), else runs on the CPU; the residency
//              cache admits and evicts; the plan names the next layer's hottest absent experts that its next step
//              likely routes to, which the executor prefetches when the step left the link idle (no moves, no
//              admissions).
//   split      crossover over a split model: the residency holds W^Q (small, so many more experts fit) and the CPU
//              adds W^R for the critical rows of resident experts; absent experts run whole (W^Q + W^R) by the
//              same crossover rule.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/cost_model.h"
#include "scheduler/plan.h"
#include "scheduler/residency.h"

namespace hetmoe::sched {

struct PolicyOptions {
  std::string isa;                   // the CPU tier of CPU_IN_PLACE experts (a tier of the cost model)
  bool has_device = true;            // without a device every policy plans as cpu
  int64_t n_layer = 0;               // layers of the model (the last one prefetches nothing)
  int64_t batch_threshold = 32;      // static: llama.cpp's rule
  int64_t kt_prefill_tokens = 1024;  // kt: KTransformers' hand-set threshold (400-4096 in its configurations)
  int64_t prefetch = 1;              // crossover, split: experts of the next layer prefetched per step
  // crossover, split: and only those that the next step (as many tokens as this one) routes to with at least this
  // probability, from their share of recent tokens (a copy the router then ignores only costs link time and power).
  double prefetch_min_probability = 0.5;
  // crossover, split: this threshold instead of the cost model's crossover (the runtime without a profile).
  std::optional<int64_t> fixed_crossover;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // Whether the policy keeps expert residency on the device (then plan() needs a Residency), and whether it changes
  // it as the routing goes (observe() admissions and evictions).
  virtual bool uses_residency() const = 0;
  virtual bool adapts_residency() const = 0;
  // Whether its plans put attention, norms, router, shared experts and dense FFNs on the device.
  virtual bool dense_on_device() const = 0;
  // The plan of one layer's step. residency: required when uses_residency(), else ignored (may be null).
  virtual LayerPlan plan(const LayerRouting& routing, const Residency* residency) const = 0;
};

// Throws std::invalid_argument for an unknown name or an ISA tier the cost model lacks.
std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel& cost, const ExpertShape& expert,
                                    const PolicyOptions& options);
// The same where there may be no cost model (null): crossover and split then need options.fixed_crossover.
std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel* cost, const ExpertShape& expert,
                                    const PolicyOptions& options);
const std::vector<std::string>& policy_names();

}  // namespace hetmoe::sched
