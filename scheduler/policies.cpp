#include "scheduler/policies.h"

#include <cmath>
#include <stdexcept>

namespace hetmoe::sched {
namespace {

class CpuPolicy final : public Policy {
 public:
  std::string name() const override { return "cpu"; }
  bool dense_on_device() const override { return false; }
  bool uses_residency() const override { return false; }
  bool adapts_residency() const override { return false; }
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
  explicit StaticPolicy(const PolicyOptions& o) : o_(o) {}
  std::string name() const override { return "static"; }
  bool dense_on_device() const override { return true; }
  bool uses_residency() const override { return false; }
  bool adapts_residency() const override { return false; }
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
  explicit KtPolicy(const PolicyOptions& o) : o_(o) {}
  std::string name() const override { return "kt"; }
  bool dense_on_device() const override { return true; }
  bool uses_residency() const override { return true; }
  bool adapts_residency() const override { return false; }
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

// Per expert from the cost model; `split` adds the critical rows' residuals to resident experts.
class CrossoverPolicy final : public Policy {
 public:
  CrossoverPolicy(const CostModel* cost, const ExpertShape& expert, const PolicyOptions& o, bool split)
      : o_(o), split_(split), threshold_(o.fixed_crossover ? o.fixed_crossover : cost->crossover(o.isa, expert)) {}
  std::string name() const override { return split_ ? "split" : "crossover"; }
  bool dense_on_device() const override { return true; }
  bool uses_residency() const override { return true; }
  bool adapts_residency() const override { return true; }
  LayerPlan plan(const LayerRouting& r, const Residency* residency) const override {
    LayerPlan p;
    p.layer = r.layer;
    p.dense_on_device = true;
    for (const LayerRouting::Expert& x : r.experts) {
      if (residency->resident(r.layer, x.expert) || residency->prefetched(r.layer, x.expert)) {
        p.experts.push_back({x.expert, x.rows, split_ ? x.critical_rows : 0, Action::kGpuResident});
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
  bool split_;
  std::optional<int64_t> threshold_;  // nullopt: moving never pays
};

}  // namespace

const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names = {"cpu", "static", "kt", "crossover", "split"};
  return names;
}

std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel& cost, const ExpertShape& expert,
                                    const PolicyOptions& options) {
  return make_policy(name, &cost, expert, options);
}

std::unique_ptr<Policy> make_policy(const std::string& name, const CostModel* cost, const ExpertShape& expert,
                                    const PolicyOptions& options) {
  const bool known = name == "cpu" || name == "static" || name == "kt" || name == "crossover" || name == "split";
  if (!known) throw std::invalid_argument("unknown policy '" + name + "' (use cpu, static, kt, crossover or split)");
  if (cost) cost->tier(options.isa);  // throws for a tier the model lacks
  if (name == "cpu" || !options.has_device) return std::make_unique<CpuPolicy>();
  if (name == "static") return std::make_unique<StaticPolicy>(options);
  if (name == "kt") return std::make_unique<KtPolicy>(options);
  if (!cost && !options.fixed_crossover)
    throw std::invalid_argument("policy '" + name + "' needs a cost model (a profile) or a fixed crossover");
  return std::make_unique<CrossoverPolicy>(cost, expert, options, name == "split");
}

}  // namespace hetmoe::sched
