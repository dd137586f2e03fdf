#pragma once

// Routing traces: which experts each MoE layer chose for each token, recorded from a model (`hetmoe run
// --trace-routing FILE`) or drawn from a Zipf distribution, for warm-starting residency and for replay in bench and
// simulate. The file is JSON lines: a header {"format": "hetmoe-routing/1", "model", "n_layer", "n_expert",
// "n_used"}, then one line per layer step {"layer", "n", "ids": [n * n_used], "weights": [n * n_used]}.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "scheduler/plan.h"

namespace hetmoe::sched {

struct RoutingStep {
  int64_t layer = 0;
  int64_t n_tokens = 0;
  std::vector<int32_t> ids;    // [n_tokens][n_used]
  std::vector<float> weights;  // mixing weights, the same shape
};

struct RoutingTrace {
  std::string model;
  int64_t n_layer = 0, n_expert = 0, n_used = 0;
  std::vector<RoutingStep> steps;

  // How often each expert was chosen: [n_layer][n_expert] (layers without steps: zeros).
  std::vector<std::vector<double>> counts() const;

  // Throws std::runtime_error naming the file and line for a missing file, bad JSON, a wrong format or an id out of
  // range.
  static RoutingTrace load(const std::string& path);
  void save(const std::string& path) const;
  // The header line and one step's line (for writers that stream).
  std::string header_line() const;
  std::string step_line(const RoutingStep& step) const;

  // Synthetic routing: each MoE layer (layers first_moe_layer .. n_layer - 1) draws each token's n_used distinct
  // experts by a Zipf law of exponent s over a random per-layer ranking of the experts (s = 0: uniform); weights
  // decrease with the draw order and sum to 1. `steps` steps of `tokens` tokens per layer.
  static RoutingTrace zipf(int64_t n_layer, int64_t first_moe_layer, int64_t n_expert, int64_t n_used, double s,
                           int64_t steps, int64_t tokens, uint64_t seed);
};

// One step as the scheduler sees it: rows per activated expert (ascending id), the rows where it is among the token's
// n_critical largest weights (ties: the earlier slot), and its weights' sum.
LayerRouting layer_routing(const RoutingStep& step, int64_t n_used, int64_t n_critical);

}  // namespace hetmoe::sched
