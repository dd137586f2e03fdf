#include "cpu_kernels/experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "cpu_kernels/scratch.h"
#include "quant/ref.h"

namespace hetmoe::cpu {
namespace {

// Rows of gate/up per unit of the first pass: fine enough that the cost-weighted split between threads is even.
constexpr int64_t kGateRows = 32;
// Output rows per unit of the second pass; the unit's partial sums for all items stay in L1/L2.
constexpr int64_t kDownRows = 32;
// Activation rows per dot_rows call (the weight row is unpacked once for them).
constexpr int64_t kItemChunk = 16;

// Runs fn(unit) for units [0, n), each thread one contiguous range of units of about equal cost (`cost_end[u]`:
// the summed cost of units 0..u; null: every unit costs the same). Contiguous ranges keep each thread's reads
// long sequential streams that the hardware prefetchers follow, which taking units one at a time from a shared
// counter breaks up (measured slower in decode); the cost weighting keeps experts with many tokens and experts
// with one balanced in prefill.
template <typename Fn>
void for_each_unit(ThreadPool& pool, int64_t n, const double* cost_end, Fn&& fn) {
  const int64_t threads = pool.size();
  pool.parallel_for(threads, 1, [&](int64_t i, int64_t) {
    auto boundary = [&](int64_t j) -> int64_t {
      if (j == threads) return n;
      if (!cost_end) return n * j / threads;
      const double target = cost_end[n - 1] * static_cast<double>(j) / static_cast<double>(threads);
      return std::upper_bound(cost_end, cost_end + n, target) - cost_end;
    };
    for (int64_t u = boundary(i), end = boundary(i + 1); u < end; ++u) fn(u);
  });
}

// Byte offsets of each expert's converted activation rows in one buffer, one row per item.
struct ActLayout {
  size_t row_bytes = 0;
  size_t offset = 0;
};

void convert(const KernelTable& k, quant::GgmlType weight_type, int64_t n, const float* src, uint8_t* dst) {
  const quant::GgmlType act = quant::type_info(weight_type).vec_dot_type;
  if (act == quant::GgmlType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  k.activation_for(act)(src, dst, n);
}

size_t act_row_bytes(quant::GgmlType weight_type, int64_t n) {
  return quant::type_info(weight_type).vec_dot_type == quant::GgmlType::F32
             ? static_cast<size_t>(n) * sizeof(float)
             : quant::activation_row_bytes(weight_type, n);
}

}  // namespace

void ExpertBatch::clear(int64_t tokens, int64_t items_per_token) {
  n_tokens = tokens;
  per_token = items_per_token;
  experts.clear();
  first.assign(1, 0);
  token.clear();
  rank.clear();
  weight.clear();
}

void ExpertBatch::add_expert(const ExpertFfn& ffn) {
  experts.push_back(ffn);
  first.push_back(first.back());
}

void ExpertBatch::add_item(int32_t t, int32_t k, float w) {
  token.push_back(t);
  rank.push_back(k);
  weight.push_back(w);
  ++first.back();
}

void run_experts(const KernelTable& k, ThreadPool& pool, const ExpertBatch& batch, const float* x, int64_t n_embd,
                 float* out) {
  const int64_t n_experts = static_cast<int64_t>(batch.experts.size());
  const int64_t n_items = static_cast<int64_t>(batch.token.size());
  if (batch.n_tokens == 0) return;
  if (n_items != batch.n_tokens * batch.per_token)
    throw std::invalid_argument("expert batch: every token needs exactly per_token items");

  // Where each expert's converted inputs (gate, up), hidden rows and converted hidden rows go.
  struct Plan {
    ActLayout gate, up, down;
    size_t hidden = 0;  // float offset of the expert's [items][n_ff] hidden rows
    int64_t unit0 = 0;  // its first unit of the first pass
  };
  std::span<Plan> plan = scratch<Plan, struct ExpertPlanSite>(n_experts);
  size_t act_bytes = 0, down_bytes = 0, hidden_floats = 0;
  int64_t units = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    const ExpertFfn& f = batch.experts[e];
    const int64_t m = batch.first[e + 1] - batch.first[e];
    Plan& p = plan[e];
    p.gate = {act_row_bytes(f.gate.type, f.gate.n_cols), act_bytes};
    act_bytes += p.gate.row_bytes * m;
    const bool same = quant::type_info(f.gate.type).vec_dot_type == quant::type_info(f.up.type).vec_dot_type;
    p.up = same ? p.gate : ActLayout{act_row_bytes(f.up.type, f.up.n_cols), act_bytes};
    if (!same) act_bytes += p.up.row_bytes * m;
    p.down = {act_row_bytes(f.down.type, f.down.n_cols), down_bytes};
    down_bytes += p.down.row_bytes * m;
    p.hidden = hidden_floats;
    hidden_floats += static_cast<size_t>(m * f.gate.n_rows);
    p.unit0 = units;
    if (m > 0) units += (f.gate.n_rows + kGateRows - 1) / kGateRows;
  }
  // Pass 1's unit costs: rows times tokens, so a unit of an expert with 12 tokens weighs 12 single-token ones.
  std::span<double> cost_end = scratch<double, struct ExpertCostSite>(units);
  double cost = 0;
  for (int64_t e = 0, u = 0; e < n_experts; ++e) {
    const int64_t m = batch.first[e + 1] - batch.first[e];
    const int64_t n_ff = batch.experts[e].gate.n_rows;
    for (int64_t r = 0; m > 0 && r < n_ff; r += kGateRows, ++u)
      cost_end[u] = cost += static_cast<double>(m * std::min(kGateRows, n_ff - r));
  }
  std::span<uint8_t> act = scratch<uint8_t, struct ExpertActSite>(act_bytes);
  std::span<float> hidden = scratch<float, struct ExpertHiddenSite>(hidden_floats);
  std::span<uint8_t> down_act = scratch<uint8_t, struct ExpertDownActSite>(down_bytes);

  // Each item's input row, converted once per activation type its expert needs.
  pool.parallel_for(n_experts, 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const ExpertFfn& f = batch.experts[e];
      const Plan& p = plan[e];
      for (int64_t i = batch.first[e]; i < batch.first[e + 1]; ++i) {
        const int64_t j = i - batch.first[e];
        const float* src = x + static_cast<int64_t>(batch.token[i]) * n_embd;
        convert(k, f.gate.type, n_embd, src, act.data() + p.gate.offset + j * p.gate.row_bytes);
        if (p.up.offset != p.gate.offset)
          convert(k, f.up.type, n_embd, src, act.data() + p.up.offset + j * p.up.row_bytes);
      }
    }
  });

  // Pass 1: hidden = silu(gate x) * up x, by units of kGateRows rows of one expert.
  for_each_unit(pool, units, cost_end.data(), [&](int64_t u) {
    const int64_t e = std::upper_bound(plan.begin(), plan.begin() + n_experts, u,
                                       [](int64_t v, const Plan& p) { return v < p.unit0; }) -
                      plan.begin() - 1;
    const ExpertFfn& f = batch.experts[e];
    const Plan& p = plan[e];
    const int64_t m = batch.first[e + 1] - batch.first[e], n_ff = f.gate.n_rows;
    const int64_t r0 = (u - p.unit0) * kGateRows, r1 = std::min(n_ff, r0 + kGateRows);
    float g[kItemChunk], up[kItemChunk];
    for (int64_t c0 = 0; c0 < m; c0 += kItemChunk) {
      const int64_t nc = std::min(kItemChunk, m - c0);
      const uint8_t* ga = act.data() + p.gate.offset + c0 * p.gate.row_bytes;
      const uint8_t* ua = act.data() + p.up.offset + c0 * p.up.row_bytes;
      float* h = hidden.data() + p.hidden + c0 * n_ff;
      for (int64_t r = r0; r < r1; ++r) {
        k.dot_rows(f.gate.type, f.gate.n_cols, f.gate.row(r), ga, p.gate.row_bytes, nc, g);
        k.dot_rows(f.up.type, f.up.n_cols, f.up.row(r), ua, p.up.row_bytes, nc, up);
        for (int64_t j = 0; j < nc; ++j) h[j * n_ff + r] = (g[j] / (1.0f + std::exp(-g[j]))) * up[j];
      }
    }
  });

  // The hidden rows in the down projections' activation types.
  pool.parallel_for(n_experts, 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const ExpertFfn& f = batch.experts[e];
      const Plan& p = plan[e];
      const int64_t m = batch.first[e + 1] - batch.first[e], n_ff = f.gate.n_rows;
      for (int64_t j = 0; j < m; ++j)
        convert(k, f.down.type, n_ff, hidden.data() + p.hidden + j * n_ff,
                down_act.data() + p.down.offset + j * p.down.row_bytes);
    }
  });

  // Pass 2: by blocks of output rows, every expert's down rows, then each token's weighted sum in rank order.
  const int64_t per_token = batch.per_token;
  for_each_unit(pool, (n_embd + kDownRows - 1) / kDownRows, nullptr, [&](int64_t u) {
    const int64_t r0 = u * kDownRows, r1 = std::min(n_embd, r0 + kDownRows), nr = r1 - r0;
    // partial[(t * per_token + k) * kDownRows + r - r0]: item (t, k)'s weighted output rows of this block.
    std::span<float> partial = scratch<float, struct ExpertPartialSite>(n_items * kDownRows);
    float y[kItemChunk];
    for (int64_t e = 0; e < n_experts; ++e) {
      const ExpertFfn& f = batch.experts[e];
      const Plan& p = plan[e];
      const int64_t i0 = batch.first[e], m = batch.first[e + 1] - i0;
      for (int64_t c0 = 0; c0 < m; c0 += kItemChunk) {
        const int64_t nc = std::min(kItemChunk, m - c0);
        const uint8_t* a = down_act.data() + p.down.offset + c0 * p.down.row_bytes;
        for (int64_t r = r0; r < r1; ++r) {
          k.dot_rows(f.down.type, f.down.n_cols, f.down.row(r), a, p.down.row_bytes, nc, y);
          for (int64_t j = 0; j < nc; ++j) {
            const int64_t i = i0 + c0 + j;
            partial[(batch.token[i] * per_token + batch.rank[i]) * kDownRows + (r - r0)] = y[j] * batch.weight[i];
          }
        }
      }
    }
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
      const float* s = partial.data() + t * per_token * kDownRows;
      float* o = out + t * n_embd + r0;
      for (int64_t r = 0; r < nr; ++r) {
        float v = s[r];
        for (int64_t kk = 1; kk < per_token; ++kk) v += s[kk * kDownRows + r];
        o[r] = v;
      }
    }
  });
}

}  // namespace hetmoe::cpu
