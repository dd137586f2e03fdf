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
#include <string_view>
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

// What a policy does, for the code that sets it up: the runtime reads these (never a policy's name) to decide what to
// put on the device and what a model needs.
struct PolicyTraits {
  bool uses_device = false;        // it puts work on a device (every policy but cpu)
  bool dense_on_device = false;    // attention, norms, router, shared experts and dense FFNs on the device
  bool uses_residency = false;     // routed experts stay resident on the device (its plans need a Residency)
  bool adapts_residency = false;   // and the residency admits and evicts as the routing goes
  bool moves_experts = false;      // it copies absent experts to the device for a step (a batch or row threshold)
  bool needs_crossover = false;    // its threshold comes from a cost model, or a fixed row count without one
  bool needs_split_model = false;  // it runs a split model's W^Q on the device and adds W^R on the CPU
};

class Policy;

// A policy as the registry lists it.
struct PolicyInfo {
  std::string name;
  std::string summary;  // one line, for --help
  PolicyTraits traits;
  std::unique_ptr<Policy> (*make)(const PolicyInfo& info, const CostModel* cost, const ExpertShape& expert,
                                  const PolicyOptions& options);
};

// Every policy this build knows, in the order the help lists them (cpu, static, kt, crossover, split).
const std::vector<PolicyInfo>& policies();
// The registry's entry; throws std::invalid_argument naming the known policies for any other name.
const PolicyInfo& find_policy(std::string_view name);
// "cpu, static, kt, crossover, split".
std::string policy_list();
// The policy a command runs when none is named: crossover with a device, cpu without.
const PolicyInfo& default_policy(bool has_device);

class Policy {
 public:
  explicit Policy(const PolicyInfo& info) : info_(info) {}
  virtual ~Policy() = default;
  const std::string& name() const { return info_.name; }
  const PolicyTraits& traits() const { return info_.traits; }
  // Whether its plans can move an expert at all (crossover: only with a threshold; moving may never pay).
  virtual bool moves() const { return traits().moves_experts; }
  // The plan of one layer's step. residency: required when traits().uses_residency, else ignored (may be null).
  virtual LayerPlan plan(const LayerRouting& routing, const Residency* residency) const = 0;

 private:
  const PolicyInfo& info_;
};

// Throws std::invalid_argument for an unknown name or an ISA tier the cost model lacks. Without a device
// (options.has_device false) every policy plans as cpu.
std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel& cost, const ExpertShape& expert,
                                    const PolicyOptions& options);
// The same where there may be no cost model (null): crossover and split then need options.fixed_crossover.
std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel* cost, const ExpertShape& expert,
                                    const PolicyOptions& options);

}  // namespace hetmoe::sched
