#pragma once

// A model as the simulator costs it (scheduler/simulator.h), from a make-model preset at a file type (the plan
// make-model writes, no weights generated) or from a GGUF file's tensor table; and a split of it.

#include <string>

#include "runtime/model/split.h"
#include "scheduler/simulator.h"

namespace hetmoe::cli {

// The preset at `type` with `layers` blocks (< 1: the real model's depth). Fails (hetmoe::Error) for an unknown preset.
sched::SimModel sim_model_from_preset(const std::string& preset, const std::string& type, int layers);
// The model of a GGUF file (its first shard of a sharded one names the rest). Fails for a file hetmoe cannot read,
// an architecture it does not know, a model without routed experts, and a split file (give its source).
sched::SimModel sim_model_from_file(const std::string& path);

// The split sizes of one routed expert: W^Q of `gpu_bits` in groups of 64, and W^R of `residual_bits` or, critical
// rows from the source, none. Fails for bit counts split does not take.
void set_split(sched::SimModel& m, int gpu_bits, int residual_bits, model::CriticalFrom from);

// The workload that simulate and tune describe alike (prompt and generated tokens, synthetic routing's skew and seed,
// or a replayed trace), from either command's options.
template <typename Options>
sched::SimOptions sim_workload(const Options& opt, const sched::RoutingTrace* trace) {
  sched::SimOptions so;
  so.prompt = opt.prompt;
  so.gen = opt.gen;
  so.zipf = opt.zipf;
  so.seed = opt.seed;
  so.trace = trace;
  return so;
}

}  // namespace hetmoe::cli
