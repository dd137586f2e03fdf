#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {

// One SwiGLU expert: down(silu(gate x) * up x). gate and up are [n_ff, n_embd], down is [n_embd, n_ff].
// A split expert run with its residual adds each residual matrix's product to its part's:
// gate x = gate.x + gate_r.x, and likewise for up and down (residual matrices of the same shapes).
// gpt-oss's experts have biases (gate and up before the activation, down before the mixing weight) and its clamped
// SwiGLU: min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1).
struct ExpertFfn {
  WeightMatrix gate, up, down;
  WeightMatrix gate_r{}, up_r{}, down_r{};  // data == nullptr: no residual
  const float* gate_bias = nullptr;         // [n_ff], or null (then up_bias is null too)
  const float* up_bias = nullptr;           // [n_ff]
  const float* down_bias = nullptr;         // [n_embd], or null
  bool clamped_swiglu = false;
  // DeepSeek-V4's clamped SwiGLU when > 0: silu(min(g, limit)) * clamp(u, -limit, limit).
  float swiglu_limit = 0.0f;

  bool has_residual() const { return gate_r.data != nullptr; }
  // h[i] = hidden(r0 + i, g[i], u[i]) for i < n; h may alias g. Where hidden() is silu_times(g, u) itself (no biases,
  // no limit, not gpt-oss's clamp), k.swiglu gives the same floats for the whole run at once.
  void hidden_run(const KernelTable& k, int64_t r0, int64_t n, const float* g, const float* u, float* h) const {
    if (!gate_bias && swiglu_limit <= 0.0f && !clamped_swiglu) return k.swiglu(n, g, u, h);
    for (int64_t i = 0; i < n; ++i) h[i] = hidden(r0 + i, g[i], u[i]);
  }
  // Hidden value r of the expert from its gate and up products.
  float hidden(int64_t r, float g, float u) const {
    if (gate_bias) {
      g += gate_bias[r];
      u += up_bias[r];
    }
    if (swiglu_limit > 0.0f) return silu_times(std::min(g, swiglu_limit), std::clamp(u, -swiglu_limit, swiglu_limit));
    return clamped_swiglu ? clamped_swiglu_value(g, u) : silu_times(g, u);
  }
  static float clamped_swiglu_value(float g, float u) {
    constexpr float kLimit = 7.0f, kAlpha = 1.702f;
    const float x = std::min(g, kLimit), y = std::clamp(u, -kLimit, kLimit);
    return x / (1.0f + std::exp(-kAlpha * x)) * (y + 1.0f);
  }
};

// The expert work of one MoE layer for a batch of tokens: every token has up to `per_token` items (its routed
// experts, then any shared ones; a slot without an item adds nothing, its expert running elsewhere), and item
// (t, k) adds weight(t, k) * expert(x_t) to token t's output. Items are
// grouped by expert so each expert's rows are read once for all the tokens routed to it.
struct ExpertBatch {
  int64_t n_tokens = 0;
  int64_t per_token = 0;
  std::vector<ExpertFfn> experts;
  std::vector<int64_t> first;  // [experts + 1]: expert e's items are [first[e], first[e + 1])
  std::vector<int32_t> token;  // [items] the token of each item
  std::vector<int32_t> rank;   // [items] its position k among the token's items (the order of the sum)
  std::vector<float> weight;   // [items] its mixing weight (1 for a shared expert)

  void clear(int64_t tokens, int64_t items_per_token);
  // Adds an expert and its items (token, rank, weight), in the order given.
  void add_expert(const ExpertFfn& ffn);
  void add_item(int32_t t, int32_t k, float w);
};

// out[t][r] = sum over k in increasing order of weight(t, k) * expert(t, k)(x_t)[r], for all tokens of the batch.
// Two parallel passes: the first runs gate and up of every expert, row blocks taken dynamically by the threads,
// with SiLU and the product fused; the second runs the down projections by blocks of output rows, and each block
// forms its weighted sums right there (no separate pass over the outputs). The sum follows k order with one
// rounding per add, as a chain of separate adds would. Temporary buffers come from scratch(): after the first
// call of a size, no allocation.
void run_experts(const KernelTable& k, ThreadPool& pool, const ExpertBatch& batch, const float* x, int64_t n_embd,
                 float* out);

}  // namespace hetmoe::cpu
