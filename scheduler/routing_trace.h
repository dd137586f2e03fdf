#pragma once

// Routing traces: which experts each MoE layer chose for each token, recorded from a model (`hetmoe run
// --trace-routing FILE`) or drawn from a Zipf distribution, for warm-starting residency and for replay in bench and
// simulate. The file is JSON lines: a header {"format": "hetmoe-routing/1", "model", "n_layer", "n_expert",
// "n_used"}, then one line per layer step {"layer", "n", "ids": [n * n_used], "weights": [n * n_used]}.

#include <cstdint>
#include <iosfwd>
#include <random>
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

  // Reads the text of a trace file (the scheduler reads no files: engine::load_routing_trace does); throws
  // std::runtime_error naming `path` and the line for bad JSON, a wrong format or an id out of range.
  static RoutingTrace parse(const std::string& text, const std::string& path);
  // The whole trace as hetmoe-routing/1 lines (the scheduler writes no files; the tools do, through io::OutputFile).
  std::string text() const;
  // The header line and one step's line (for writers that stream).
  std::string header_line() const;
  std::string step_line(const RoutingStep& step) const;

  // Synthetic routing (ZipfRouter, both seeds `seed`): `steps` steps of `tokens` tokens for each MoE layer
  // (first_moe_layer .. n_layer - 1), layer by layer within a step.
  static RoutingTrace zipf(int64_t n_layer, int64_t first_moe_layer, int64_t n_expert, int64_t n_used, double s,
                           int64_t steps, int64_t tokens, uint64_t seed);
};

// Zipf-skewed routing drawn step by step: each layer ranks its experts once (a random order from `ranking_seed`),
// and each token draws n_used distinct experts with probability proportional to 1 / rank^s (s = 0: uniform) from a
// stream of `draw_seed`; weights decrease with the draw order (1/2, 1/3, ...) and are normalised to sum to 1. Two
// routers with the same ranking seed and different draw seeds model a warm-up and a run of one workload.
class ZipfRouter {
 public:
  ZipfRouter(int64_t n_expert, int64_t n_used, double s, uint64_t ranking_seed, uint64_t draw_seed);
  RoutingStep draw(int64_t layer, int64_t n_tokens);
  // How often each expert is chosen when `tokens` tokens are drawn for each MoE layer (first_moe_layer ..
  // n_layer - 1, in order): [n_layer][n_expert], the warm-up counts that place experts for this workload.
  std::vector<std::vector<double>> counts(int64_t n_layer, int64_t first_moe_layer, int64_t tokens);

 private:
  const std::vector<int32_t>& ranking(int64_t layer);
  int64_t n_expert_, n_used_;
  uint64_t ranking_seed_;
  std::vector<double> law_;
  std::vector<std::vector<int32_t>> rankings_;
  std::mt19937_64 rng_;
  std::vector<double> weights_, cumulative_;  // one pick's, reused
};

// A trace's routing replayed: each layer's recorded steps in order, cycled, their tokens concatenated into steps of
// the size asked for (a prefill and decode of other lengths than the recording's). The trace must outlive it.
class TraceReplay {
 public:
  explicit TraceReplay(const RoutingTrace& trace);
  // The next n tokens' routing of `layer`; throws std::invalid_argument when the trace has no token of that layer.
  RoutingStep next(int64_t layer, int64_t n);

 private:
  const RoutingTrace& trace_;
  std::vector<std::vector<const RoutingStep*>> per_layer_;
  std::vector<size_t> step_;    // per layer: the step replayed now
  std::vector<int64_t> token_;  // and its next token
};

// One step as the scheduler sees it: rows per activated expert (ascending id), the rows where it is among the token's
// n_critical largest weights (ties: the earlier slot), and its weights' sum.
LayerRouting layer_routing(const RoutingStep& step, int64_t n_used, int64_t n_critical);

}  // namespace hetmoe::sched
