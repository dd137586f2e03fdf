#include "scheduler/simulator.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "scheduler/step.h"

namespace hetmoe::sched {
namespace {

// Where the routing of each layer step comes from: a trace replayed, or Zipf draws.
class RoutingSource {
 public:
  // draw_seed: the synthetic router's draws (the ranking of experts always comes from o.seed).
  RoutingSource(const SimModel& m, const SimOptions& o, uint64_t draw_seed)
      : zipf_(m.n_expert, m.n_used, o.zipf, o.seed, draw_seed) {
    if (o.trace) {
      if (o.trace->n_layer != m.n_layer || o.trace->n_expert != m.n_expert || o.trace->n_used != m.n_used)
        throw std::invalid_argument("the routing trace has another model's shape (layers, experts or experts used)");
      replay_.emplace(*o.trace);
    }
  }
  // The next step of `layer` with n tokens.
  RoutingStep next(int64_t layer, int64_t n) { return replay_ ? replay_->next(layer, n) : zipf_.draw(layer, n); }

 private:
  std::optional<TraceReplay> replay_;
  ZipfRouter zipf_;
};

struct StepCost {
  double seconds = 0, h2d_bytes = 0, dram_bytes = 0;
};

class Run {
 public:
  Run(const Machine& machine, const SimModel& m, const SimOptions& o, const std::string& policy)
      : machine_(machine), cost_(machine.cost_model()), m_(m), o_(o), name_(policy) {
    isa_ = o.isa.empty() ? machine.best_tier().isa : o.isa;
    const PolicyTraits& traits = find_policy(policy).traits;
    split_ = traits.needs_split_model;
    shape_.bytes = m.expert_bytes;
    shape_.device_bytes = split_ ? m.split_device_bytes : m.expert_bytes;
    shape_.residual_bytes = split_ ? (m.critical_from_source ? m.expert_bytes : m.split_residual_bytes) : 0;
    if (split_ && !m.critical_from_source) shape_.bytes = m.split_device_bytes + m.split_residual_bytes;
    shape_.n_embd = m.n_embd;
    shape_.n_ff = m.n_ff_exp;
    PolicyOptions po = o.policy;
    po.isa = isa_;
    po.has_device = machine.gpu.has_value();
    // Device memory: the pass's weights and the KV cache first, then expert slots.
    dense_on_device_ = traits.dense_on_device && machine.gpu;
    if (dense_on_device_) {
      const double kv = static_cast<double>(m.n_layer * (o.prompt + o.gen) * m.kv_width) * o.kv_bytes_per_value;
      vram_ = m.n_layer * m.attention_bytes + (m.n_layer - m.n_leading_dense) * m.shared_bytes +
              m.n_leading_dense * m.dense_bytes + m.output_bytes + kv;
    }
    int64_t slots = 0;
    if (traits.uses_residency && machine.gpu) {
      // The ring of move slots comes out of the same memory, as the runtime's DeviceExperts takes it.
      const double ring = traits.moves_experts ? static_cast<double>(o.move_slots) * shape_.device_bytes : 0;
      const double room = std::max(0.0, machine.gpu->memory_bytes - o.vram_reserve_bytes - vram_ - ring);
      vram_ += std::min(ring, std::max(0.0, machine.gpu->memory_bytes - o.vram_reserve_bytes - vram_));
      slots = static_cast<int64_t>(room / shape_.device_bytes);
      slots = std::min(slots, (m.n_layer - m.n_leading_dense) * m.n_expert);
      // A fixed placement (kt) may be given its size.
      if (!traits.adapts_residency && o.kt_resident_experts >= 0) slots = std::min(slots, o.kt_resident_experts);
      vram_ += static_cast<double>(slots) * shape_.device_bytes;
    }
    stepper_.emplace(policy, &cost_, shape_, po,
                     StepperOptions{.n_layer = m.n_layer,
                                    .n_expert = m.n_expert,
                                    .move_slots = o.move_slots,
                                    .residency = {.slots = slots, .max_admissions = o.admissions}});
    const std::optional<int64_t> x = cost_.crossover(isa_, shape_);
    crossover_ = x ? *x : -1;
  }

  // Warm start from routing counts (a warm-up trace): the hottest experts fill the slots.
  void warm_start(const std::vector<std::vector<double>>& counts) {
    if (stepper_->residency().slots() > 0) stepper_->residency().warm_start(counts);
  }

  StepCost step(RoutingSource& routing, int64_t n, int64_t ctx) {
    StepCost c;
    const CpuTier& tier = cost_.tier(isa_);
    // The dense parts: on the device or on the CPU.
    // Weights read once for `rows` rows.
    auto dense_rows = [&](double bytes, double params, double extra_flops, int64_t rows) {
      const double flops = 2 * params * static_cast<double>(rows) + extra_flops;
      if (dense_on_device_) return machine_.gpu->seconds(bytes, flops);
      c.dram_bytes += bytes;
      return tier.stream_seconds(bytes, flops / static_cast<double>(rows), rows);
    };
    auto dense = [&](double bytes, double params, double extra_flops) {
      return dense_rows(bytes, params, extra_flops, n);
    };
    double background = 0;   // admission copies still queued on the link
    double prefetching = 0;  // the copy of the experts prefetched for the next layer
    const double attention_flops = 4.0 * static_cast<double>(m_.n_head * m_.attn_dim) * static_cast<double>(n) *
                                   (static_cast<double>(ctx) - static_cast<double>(n) / 2);
    for (int64_t l = 0; l < m_.n_layer; ++l) {
      const double attention = dense(m_.attention_bytes, m_.attention_params, attention_flops);
      c.seconds += attention;
      if (l < m_.n_leading_dense) {
        c.seconds += dense(m_.dense_bytes, m_.dense_params, 0);
        continue;
      }
      const RoutingStep step = routing.next(l, n);
      const LayerRouting routed = layer_routing(step, m_.n_used, split_ ? o_.n_critical : 0);
      // Each split expert's critical rows. A source split's device runs only the rows that are not critical, so the
      // plan sees those (as the runtime's does); its critical rows run on the source expert on the CPU, with the
      // expert's other rows when it runs there whole. What no step below takes is run on the CPU after the plan (a
      // moved expert's residuals, a source split's critical rows).
      std::vector<int64_t> critical(split_ ? static_cast<size_t>(m_.n_expert) : 0, 0);
      LayerRouting r = routed;
      if (split_) {
        for (const LayerRouting::Expert& x : routed.experts) critical[static_cast<size_t>(x.expert)] = x.critical_rows;
        if (m_.critical_from_source) {
          r.experts.clear();
          for (LayerRouting::Expert x : routed.experts) {
            x.rows -= x.critical_rows;
            x.critical_rows = 0;
            if (x.rows > 0) r.experts.push_back(x);
          }
        }
      }
      const Stepper::Step& plan = stepper_->plan(r);
      // A prefetch copy runs during this layer's attention; what is left of it holds the link (and the prefetched
      // experts' device work) before this layer's moves.
      double cpu = 0, link = std::max(0.0, prefetching - attention), gpu_resident = 0, gpu_moved = 0;
      prefetching = 0;
      if (dense_on_device_) {
        gpu_resident += machine_.gpu->seconds(m_.shared_bytes, 2 * m_.shared_params * static_cast<double>(n));
      } else {
        cpu += dense(m_.shared_bytes, m_.shared_params, 0);
      }
      bool cpu_work = false;
      for (const ExpertStep& s : plan.plan.experts) {
        switch (s.action) {
          case Action::kCpuInPlace: {
            // Whole on the CPU: a split expert's residuals are part of it, a source split's critical rows join it.
            int64_t rows = s.rows;
            if (split_) {
              if (m_.critical_from_source) rows += critical[static_cast<size_t>(s.expert)];
              critical[static_cast<size_t>(s.expert)] = 0;
            }
            cpu += cost_.cpu_seconds(isa_, shape_, rows);
            c.dram_bytes += shape_.bytes;
            cpu_work = true;
            break;
          }
          case Action::kGpuResident:
            gpu_resident += cost_.gpu_seconds(shape_, s.rows);
            if (s.critical_rows > 0) {
              cpu += cost_.residual_seconds(isa_, shape_, s.critical_rows);
              c.dram_bytes += shape_.residual_bytes;
              cpu_work = true;
              critical[static_cast<size_t>(s.expert)] = 0;
            }
            break;
          case Action::kMove:
            link += cost_.move_seconds(shape_.bytes);
            c.h2d_bytes += shape_.bytes;
            gpu_moved += cost_.moved_gpu_seconds(shape_, s.rows);
            break;
        }
      }
      for (const int64_t rows : critical)
        if (rows > 0) {
          cpu += cost_.residual_seconds(isa_, shape_, rows);
          c.dram_bytes += shape_.residual_bytes;
          cpu_work = true;
        }
      double layer = std::max(cpu, std::max(gpu_resident, link) + gpu_moved);
      // Admissions copy in the background: an admitted expert is first used at the next step, so its copy waits for
      // the link's idle time instead of holding up this layer. The next layer's likely experts are prefetched only
      // over an idle link (the stepper's rule); they run on the device at its step.
      const double idle = layer - link;
      const Stepper::After& after = stepper_->finish(true, background - idle > 0);
      for (const Residency::Change& ch : after.changes)
        if (ch.admitted) {
          background += cost_.move_seconds(shape_.device_bytes);
          c.h2d_bytes += shape_.device_bytes;
        }
      background = std::max(0.0, background - idle);
      const double prefetched = static_cast<double>(after.prefetch.size());
      prefetching = prefetched * cost_.move_seconds(shape_.device_bytes);
      c.h2d_bytes += prefetched * shape_.device_bytes;
      if (dense_on_device_) {
        layer += o_.host_sync_s;
        if (cpu_work) {  // the normed rows down, the CPU's part up
          const double rows_bytes = 4.0 * static_cast<double>(n * m_.n_embd);
          layer += 2 * cost_.move_seconds(rows_bytes);
          c.h2d_bytes += rows_bytes;
        }
      }
      c.seconds += layer;
    }
    c.seconds += dense_rows(m_.output_bytes, m_.output_params, 0, 1);  // the last token's logits
    c.seconds += background;  // copies the link had no idle time for finish before the next step
    return c;
  }

  SimResult result(double prefill_s, double decode_s, double h2d, double dram) const {
    SimResult r;
    r.policy = name_;
    r.prefill_tok_s = static_cast<double>(o_.prompt) / prefill_s;
    r.decode_tok_s = o_.gen > 0 ? static_cast<double>(o_.gen) / decode_s : 0;
    r.ttft_s = prefill_s;
    r.h2d_bytes_per_token = o_.gen > 0 ? h2d / static_cast<double>(o_.gen) : 0;
    r.dram_bytes_per_token = o_.gen > 0 ? dram / static_cast<double>(o_.gen) : 0;
    r.dram_bytes = split_ ? m_.file_bytes - static_cast<double>((m_.n_layer - m_.n_leading_dense) * m_.n_expert) *
                                                (m_.expert_bytes - shape_.bytes)
                          : m_.file_bytes;
    r.vram_bytes = vram_;
    r.resident_experts = stepper_->residency().used();
    r.crossover_rows = crossover_;
    return r;
  }

 private:
  const Machine& machine_;
  CostModel cost_;
  const SimModel& m_;
  const SimOptions& o_;
  std::string name_, isa_;
  bool split_ = false, dense_on_device_ = false;
  ExpertShape shape_;
  std::optional<Stepper> stepper_;
  double vram_ = 0;
  int64_t crossover_ = -1;
};

}  // namespace

std::vector<SimResult> simulate(const Machine& machine, const SimModel& model, const SimOptions& options) {
  if (model.n_expert <= 0 || model.n_used <= 0 || model.n_layer <= model.n_leading_dense)
    throw std::invalid_argument("simulate: the model has no MoE layers");
  if (options.prompt <= 0 || options.gen < 0) throw std::invalid_argument("simulate: --prompt must be positive");
  std::vector<SimResult> results;
  for (const std::string& name : options.policies) {
    Run run(machine, model, options, name);
    if (options.trace) {
      run.warm_start(options.trace->counts());  // a recorded trace warm-starts residency with all of its counts
    } else {
      // Synthetic routing: a warm-up of the same workload (expert ranking), other draws.
      ZipfRouter warm(model.n_expert, model.n_used, options.zipf, options.seed, options.seed + 1);
      run.warm_start(warm.counts(model.n_layer, model.n_leading_dense, 64));
    }
    RoutingSource routing(model, options, options.seed);
    const StepCost prefill = run.step(routing, options.prompt, options.prompt);
    double decode = 0, h2d = 0, dram = 0;
    for (int64_t t = 0; t < options.gen; ++t) {
      const StepCost s = run.step(routing, 1, options.prompt + t + 1);
      decode += s.seconds;
      h2d += s.h2d_bytes;
      dram += s.dram_bytes;
    }
    results.push_back(run.result(prefill.seconds, decode, h2d, dram));
  }
  return results;
}

}  // namespace hetmoe::sched
