#include "scheduler/policies.h"

#include <cmath>
#include <stdexcept>

namespace hetmoe::sched {
namespace {

class CpuPolicy final : public Policy {
 public:
  CpuPolicy(const PolicyInfo& info, const PolicyOptions&) : Policy(info) {}
  LayerPlan plan(const LayerRouting& r, const Residency*) const override {
    LayerPlan p;
    p.layer = r.layer;
    for (const LayerRouting::Expert& x : r.experts) p.experts.push_back({x.expert, x.rows, 0, Action::kCpuInPlace});
    return p;
  }
};

// llama.cpp --cpu-moe: the batch, not the expert, decides.
class StaticPolicy final : public Policy {
 public:
  StaticPolicy(const PolicyInfo& info, const PolicyOptions& o) : Policy(info), o_(o) {}
  LayerPlan plan(const LayerRouting& r, const Residency*) const override {
    LayerPlan p;
    p.layer = r.layer;
    p.dense_on_device = true;
    const Action a = r.n_tokens >= o_.batch_threshold ? Action::kMove : Action::kCpuInPlace;
    for (const LayerRouting::Expert& x : r.experts) p.experts.push_back({x.expert, x.rows, 0, a});
    return p;
  }

 private:
  PolicyOptions o_;
};

// KTransformers: a fixed set of experts on the device, a prefill threshold for the rest.
class KtPolicy final : public Policy {
 public:
  KtPolicy(const PolicyInfo& info, const PolicyOptions& o) : Policy(info), o_(o) {}
  LayerPlan plan(const LayerRouting& r, const Residency* residency) const override {
    LayerPlan p;
    p.layer = r.layer;
    p.dense_on_device = true;
    for (const LayerRouting::Expert& x : r.experts) {
      Action a = r.n_tokens >= o_.kt_prefill_tokens ? Action::kMove : Action::kCpuInPlace;
      if (residency->resident(r.layer, x.expert)) a = Action::kGpuResident;
      p.experts.push_back({x.expert, x.rows, 0, a});
    }
    return p;
  }

 private:
  PolicyOptions o_;
};

// Per expert from the cost model; split adds the critical rows' residuals to resident experts.
class CrossoverPolicy final : public Policy {
 public:
  CrossoverPolicy(const PolicyInfo& info, const CostModel* cost, const ExpertShape& expert, const PolicyOptions& o)
      : Policy(info), o_(o), threshold_(o.fixed_crossover ? o.fixed_crossover : cost->crossover(o.isa, expert)) {}
  bool moves() const override { return threshold_.has_value(); }
  LayerPlan plan(const LayerRouting& r, const Residency* residency) const override {
    const bool split = traits().needs_split_model;
    LayerPlan p;
    p.layer = r.layer;
    p.dense_on_device = true;
    for (const LayerRouting::Expert& x : r.experts) {
      if (residency->resident(r.layer, x.expert) || residency->prefetched(r.layer, x.expert)) {
        p.experts.push_back({x.expert, x.rows, split ? x.critical_rows : 0, Action::kGpuResident});
        continue;
      }
      const bool move = threshold_ && x.rows >= *threshold_;
      p.experts.push_back({x.expert, x.rows, 0, move ? Action::kMove : Action::kCpuInPlace});
    }
    if (r.layer + 1 < o_.n_layer)
      for (int64_t e : residency->hottest_absent(r.layer + 1, o_.prefetch)) {
        const double miss = std::pow(1.0 - residency->share(r.layer + 1, e), static_cast<double>(r.n_tokens));
        if (1.0 - miss >= o_.prefetch_min_probability) p.prefetch.push_back(e);
      }
    return p;
  }

 private:
  PolicyOptions o_;
  std::optional<int64_t> threshold_;  // nullopt: moving never pays
};

template <typename P>
std::unique_ptr<Policy> make(const PolicyInfo& info, const CostModel*, const ExpertShape&, const PolicyOptions& o) {
  return std::make_unique<P>(info, o);
}
std::unique_ptr<Policy> make_crossover(const PolicyInfo& info, const CostModel* cost, const ExpertShape& expert,
                                       const PolicyOptions& o) {
  return std::make_unique<CrossoverPolicy>(info, cost, expert, o);
}

// The registry: every policy, its traits and its factory, in one place.
const std::vector<PolicyInfo>& registry() {
  static const std::vector<PolicyInfo> all = {
      {"cpu", "everything on the CPU", {}, make<CpuPolicy>},
      {"static",
       "llama.cpp --cpu-moe: dense work on the device, routed experts on the CPU; a batch of 32+ tokens moves them",
       {.uses_device = true, .dense_on_device = true, .moves_experts = true},
       make<StaticPolicy>},
      {"kt",
       "KTransformers: as static, plus a fixed set of hot experts resident on the device",
       {.uses_device = true, .dense_on_device = true, .uses_residency = true, .moves_experts = true},
       make<KtPolicy>},
      {"crossover",
       "per expert and step by the cost model: resident experts on the device, absent ones moved from the ISA's "
       "crossover row count, the residency admitting and evicting",
       {.uses_device = true,
        .dense_on_device = true,
        .uses_residency = true,
        .adapts_residency = true,
        .moves_experts = true,
        .needs_crossover = true},
       make_crossover},
      {"split",
       "crossover over a split model: W^Q resident on the device, W^R added on the CPU for each token's critical "
       "experts",
       {.uses_device = true,
        .dense_on_device = true,
        .uses_residency = true,
        .adapts_residency = true,
        .moves_experts = true,
        .needs_crossover = true,
        .needs_split_model = true},
       make_crossover},
  };
  return all;
}

}  // namespace

const std::vector<PolicyInfo>& policies() { return registry(); }

const PolicyInfo& find_policy(std::string_view name) {
  for (const PolicyInfo& p : registry())
    if (p.name == name) return p;
  throw std::invalid_argument("unknown policy '" + std::string(name) + "' (use " + policy_list() + ")");
}

std::string policy_list() {
  std::string names;
  for (const PolicyInfo& p : registry()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

const PolicyInfo& default_policy(bool has_device) { return find_policy(has_device ? "crossover" : "cpu"); }

std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel& cost, const ExpertShape& expert,
                                    const PolicyOptions& options) {
  return make_policy(name, &cost, expert, options);
}

std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel* cost, const ExpertShape& expert,
                                    const PolicyOptions& options) {
  const PolicyInfo& info = find_policy(name);
  if (cost) cost->tier(options.isa);  // throws for a tier the model lacks
  if (!info.traits.uses_device || !options.has_device) return std::make_unique<CpuPolicy>(registry().front(), options);
  if (info.traits.needs_crossover && !cost && !options.fixed_crossover)
    throw std::invalid_argument("policy '" + name + "' needs a cost model (a profile) or a fixed crossover");
  return info.make(info, cost, expert, options);
}

}  // namespace hetmoe::sched
