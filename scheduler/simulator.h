#pragma once

// The simulator: policies on a machine you may not have. It runs the same policies, residency cache and cost model
// as the runtime over a prefill and a decode of a model described by its sizes, with routing replayed from a trace
// or drawn from a Zipf law, and predicts tokens/s, bytes moved and memory used.
//
// One step of n tokens, per layer: attention, norms and router (on the device when the plan says so, else the CPU);
// then the experts: the CPU runs its CPU_IN_PLACE experts and the residuals of critical rows one after another (each
// on all cores, as the expert executor does), while the device runs resident experts and the shared experts and,
// once each has crossed the link, the moved ones; the layer ends when both sides have (plus a host round trip when
// the device waits for the CPU's routing). Every cost is the cost model's; nothing else is fitted.

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/machine.h"
#include "scheduler/policies.h"
#include "scheduler/routing_trace.h"

namespace hetmoe::sched {

// A model as the simulator costs it: bytes (as stored) and parameters (for the arithmetic) of its parts.
struct SimModel {
  std::string name;
  int64_t n_layer = 0, n_leading_dense = 0, n_expert = 0, n_used = 0, n_embd = 0, n_ff_exp = 0;
  int64_t n_head = 0;
  int64_t attn_dim = 0;  // q.k length per head as attention runs (MLA absorbed: kv_lora + rope)
  int64_t kv_width = 0;  // cache values per position and layer
  double attention_bytes = 0, attention_params = 0;         // per layer: attention, norms and router
  double shared_bytes = 0, shared_params = 0;               // per MoE layer
  double dense_bytes = 0, dense_params = 0;                 // per leading dense layer's FFN
  double output_bytes = 0, output_params = 0;               // output head
  double expert_bytes = 0;                                  // one routed expert as the file stores it
  double split_device_bytes = 0, split_residual_bytes = 0;  // the same expert split: W^Q and W^R
  // A split expert's critical rows run on the source expert on the CPU (exact; the device's W^Q rows for them are
  // dropped) instead of adding W^R: no W^R is kept, the CPU reads the source expert for critical rows and for an
  // expert the device does not hold, and DRAM holds the source file.
  bool critical_from_source = false;
  double file_bytes = 0;
};

struct SimOptions {
  std::vector<std::string> policies;
  int64_t prompt = 500, gen = 128;
  std::string isa;         // the CPU tier (empty: the machine's best)
  int64_t n_critical = 2;  // split: residuals per token
  double zipf = 1.0;       // synthetic routing's skew (when no trace is given)
  uint64_t seed = 1;
  // Replayed (cycled) instead of synthetic routing, and its counts warm-start residency; layers and experts must match.
  const RoutingTrace* trace = nullptr;
  int64_t kt_resident_experts = -1;  // kt: experts placed on the device (-1: as many as fit)
  double vram_reserve_bytes = 1e9;   // device memory kept for working buffers
  double kv_bytes_per_value = 4;     // the KV cache's precision (F32, as hetmoe's)
  double host_sync_s = 20e-6;        // per MoE layer with the pass on the device: routing down and back
  int64_t move_slots = 2;            // the runtime's ring of move slots (prefetches take at most half)
  int64_t admissions = 1;            // adaptive policies: experts the residency may admit per layer step
  PolicyOptions policy;              // thresholds (isa and n_layer are set by the simulator)
};

struct SimResult {
  std::string policy;
  double prefill_tok_s = 0, decode_tok_s = 0, ttft_s = 0;
  double h2d_bytes_per_token = 0;   // decode: weights and rows moved host to device per token
  double dram_bytes_per_token = 0;  // decode: bytes the CPU reads per token
  double dram_bytes = 0, vram_bytes = 0;
  int64_t resident_experts = 0;
  int64_t crossover_rows = -1;  // of the chosen tier; -1: moving never pays (or no device)
};

// Throws std::invalid_argument for an unknown policy or tier, a trace of another shape, or a model without experts.
std::vector<SimResult> simulate(const Machine& machine, const SimModel& model, const SimOptions& options);

}  // namespace hetmoe::sched
