#pragma once

#include <cstdint>
#include <string_view>

namespace hetmoe::model {

// Receives intermediate values of a forward pass, named as in llama.cpp's graph ("l_out", "ffn_moe_probs", ...),
// for conformance tests and debugging. Rows are the tokens of the batch.
class Trace {
 public:
  virtual ~Trace() = default;
  virtual void values(int64_t layer, std::string_view name, const float* data, int64_t rows, int64_t cols) = 0;
  virtual void ids(int64_t layer, std::string_view name, const int32_t* data, int64_t rows, int64_t cols) = 0;
};

// Sees each MoE layer's routing as it is decided, on the CPU or on a device: ids and final mixing weights
// [n_tokens][n_used] (the routing traces of `hetmoe run --trace-routing`, and what a scheduler learns from). Unlike a
// Trace it changes nothing of how the pass runs.
class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  virtual void routed(int64_t layer, int64_t n_tokens, int64_t n_used, const int32_t* ids, const float* weights) = 0;
};

// Replaces each MoE layer's routing before its experts run, in place: ids and weights [n_tokens][n_used] (benchmarks
// on a chosen routing skew, `hetmoe bench --synthetic zipf:S`). The model's outputs are then no longer its own; only
// its speed means something.
class RoutingOverride {
 public:
  virtual ~RoutingOverride() = default;
  virtual void reroute(int64_t layer, int64_t n_tokens, int64_t n_used, int32_t* ids, float* weights) = 0;
};

// Replaces DeepSeek-V3.2's indexer selection of each layer before the attention uses it, in place: selected
// [n_tokens][top_k] key positions (-1 after a query's last). Conformance tests force the reference's choice where a
// legitimate rounding difference changed it. Host pass only.
class SelectionOverride {
 public:
  virtual ~SelectionOverride() = default;
  virtual void reselect(int64_t layer, int64_t n_tokens, int64_t top_k, int32_t* selected) = 0;
};

}  // namespace hetmoe::model
