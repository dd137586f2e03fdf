#include "runtime/model/moe.h"

#include <algorithm>

#include "cpu_kernels/experts.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"
#include "scheduler/plan.h"

namespace hetmoe::model {

void route(const RoutingParams& p, float* logits, const float* bias, int64_t n, Routing& out, Trace* trace,
           int64_t layer, const int32_t* fixed) {
  const int64_t nu = p.n_used;
  out.ids.resize(n * nu);
  out.weights.resize(n * nu);
  const bool apply_scale = p.scale != 0.0f && p.scale != 1.0f;
  std::vector<float> w_raw, w_norm;
  if (trace) {
    w_raw.resize(n * nu);
    w_norm.resize(n * nu);
  }
  const cpu::ExpertSelection selection = p.selection();
  for (int64_t t = 0; t < n; ++t)
    cpu::select_experts(selection, logits + t * p.n_expert, bias, out.ids.data() + t * nu, out.weights.data() + t * nu,
                        trace ? w_raw.data() + t * nu : nullptr, trace ? w_norm.data() + t * nu : nullptr,
                        fixed ? fixed + t * nu : nullptr);
  if (trace) {
    trace->values(layer, "ffn_moe_probs", logits, n, p.n_expert);
    trace->ids(layer, "ffn_moe_topk", out.ids.data(), n, nu);
    trace->values(layer, "ffn_moe_weights", w_raw.data(), n, nu);
    if (p.norm) trace->values(layer, "ffn_moe_weights_norm", w_norm.data(), n, nu);
    if (apply_scale) trace->values(layer, "ffn_moe_weights_scaled", out.weights.data(), n, nu);
  }
}

RoutedItems group_items(const MoeWeights& w, const Routing& r, int64_t n, int64_t nu) {
  // Items bucketed by expert with one counting sort (token order within each expert): next[e] starts as the
  // beginning of expert e's bucket and ends as its end.
  std::span<int64_t> next = cpu::scratch<int64_t, struct ExpertNextSite>(w.n_expert + 1);
  std::span<int64_t> order = cpu::scratch<int64_t, struct ExpertOrderSite>(n * nu);
  std::fill(next.begin(), next.end(), 0);
  for (int64_t i = 0; i < n * nu; ++i) ++next[r.ids[i] + 1];
  for (int64_t e = 0; e < w.n_expert; ++e) next[e + 1] += next[e];
  for (int64_t i = 0; i < n * nu; ++i) order[next[r.ids[i]]++] = i;
  // A split model's critical items: per token, the n_critical routed experts of largest weight (ties: lower slot).
  std::span<uint8_t> critical = cpu::scratch<uint8_t, struct CriticalSite>(w.split() ? n * nu : 0);
  if (w.split()) {
    const int64_t keep = w.n_critical < 0 ? nu : std::min(w.n_critical, nu);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t a = 0; a < nu; ++a)
        critical[t * nu + a] = sched::is_critical(r.weights.data() + t * nu, nu, a, keep);
  }
  // A source split: each expert's items that are not critical first (the device's), both parts in token order.
  std::span<int64_t> device_end = cpu::scratch<int64_t, struct DeviceEndSite>(w.critical_whole ? w.n_expert : 0);
  if (w.critical_whole) {
    for (int64_t e = 0; e < w.n_expert; ++e) {
      const auto first = order.begin() + (e == 0 ? 0 : next[e - 1]), last = order.begin() + next[e];
      device_end[e] = std::stable_partition(first, last, [&](int64_t i) { return critical[i] == 0; }) - order.begin();
    }
  }
  return {next.first(w.n_expert), order.first(n * nu), critical.first(w.split() ? n * nu : 0),
          device_end.first(w.critical_whole ? w.n_expert : 0)};
}

void add_routed_expert(cpu::ExpertBatch& batch, const MoeWeights& w, const RoutedItems& items, const Routing& r,
                       int64_t e, int64_t nu, int64_t n_embd, bool critical_only) {
  if (items.begin(e) == items.end[e]) return;  // no item: nothing to add (most of a decode step's experts)
  const cpu::ExpertFfn q{.gate = w.gate_exps.rows(e * w.n_ff_exp, w.n_ff_exp),
                         .up = w.up_exps.rows(e * w.n_ff_exp, w.n_ff_exp),
                         .down = w.down_exps.rows(e * n_embd, n_embd),
                         .gate_bias = w.gate_exps_bias ? w.gate_exps_bias + e * w.n_ff_exp : nullptr,
                         .up_bias = w.up_exps_bias ? w.up_exps_bias + e * w.n_ff_exp : nullptr,
                         .down_bias = w.down_exps_bias ? w.down_exps_bias + e * n_embd : nullptr,
                         .clamped_swiglu = w.clamped_swiglu,
                         .swiglu_limit = w.swiglu_limit};
  const cpu::WeightMatrix gate_r = w.split() ? w.gate_exps_r.rows(e * w.n_ff_exp, w.n_ff_exp) : cpu::WeightMatrix{},
                          up_r = w.split() ? w.up_exps_r.rows(e * w.n_ff_exp, w.n_ff_exp) : cpu::WeightMatrix{},
                          down_r = w.split() ? w.down_exps_r.rows(e * n_embd, n_embd) : cpu::WeightMatrix{};
  // Which items an entry takes: all (-1), or those of one criticality; and its weights.
  auto add = [&](int critical, const cpu::ExpertFfn& f) {
    bool added = false;
    for (int64_t o = items.begin(e); o < items.end[e]; ++o) {
      const int64_t i = items.order[o];
      if (critical >= 0 && items.critical[i] != critical) continue;
      if (!added) {
        batch.add_expert(f);
        added = true;
      }
      batch.add_item(static_cast<int32_t>(i / nu), static_cast<int32_t>(i % nu), r.weights[i]);
    }
  };
  cpu::ExpertFfn with_residual = q;
  with_residual.gate_r = gate_r;
  with_residual.up_r = up_r;
  with_residual.down_r = down_r;
  cpu::ExpertFfn source = q;
  source.gate = gate_r;
  source.up = up_r;
  source.down = down_r;
  if (!w.split()) {
    add(-1, q);
  } else if (w.critical_whole) {
    add(critical_only ? 1 : -1, source);
  } else {
    if (!critical_only) add(0, q);
    add(1, with_residual);
  }
}

void swiglu_ffn(const cpu::KernelTable& k, cpu::ThreadPool& pool, const cpu::WeightMatrix& gate,
                const cpu::WeightMatrix& up, const cpu::WeightMatrix& down, const float* x, int64_t n, float* out) {
  std::span<float> hidden = cpu::scratch<float, struct SwigluHiddenSite>(n * gate.n_rows);
  cpu::swiglu_matmul(k, pool, gate, up, x, n, hidden.data());
  cpu::matmul(k, pool, down, hidden.data(), n, out, down.n_rows);
}

void add_shared_experts(cpu::ExpertBatch& batch, const MoeWeights& w, int64_t n, int64_t n_used, const float* weights) {
  if (!w.has_shared) return;
  batch.add_expert(
      {.gate = w.gate_shexp, .up = w.up_shexp, .down = w.down_shexp, .swiglu_limit = w.shared_swiglu_limit});
  for (int64_t t = 0; t < n; ++t)
    batch.add_item(static_cast<int32_t>(t), static_cast<int32_t>(n_used), weights ? weights[t] : 1.0f);
}

bool shared_expert_weights(const cpu::KernelTable& k, const MoeWeights& w, const float* x, int64_t n, int64_t n_embd,
                           std::vector<float>& weights) {
  if (!w.has_shared || !w.shared_gate) return false;
  // An F32 product as llama.cpp's (its activations stay F32 for F32 weights), then the sigmoid.
  const cpu::VecDotFn dot = k.dot_for(quant::GgmlType::F32);
  weights.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) weights[t] = 1.0f / (1.0f + std::exp(-dot(n_embd, w.shared_gate, x + t * n_embd)));
  return true;
}

uint64_t routed_bytes(const MoeWeights& w, const RoutedItems& items, int64_t e, int64_t n_embd, bool whole) {
  bool critical = false;
  for (int64_t o = items.begin(e); o < items.end[e] && w.split(); ++o) critical |= items.critical[items.order[o]] != 0;
  auto part = [&](const cpu::WeightMatrix& gate, const cpu::WeightMatrix& up, const cpu::WeightMatrix& down) {
    return gate.row_bytes * w.n_ff_exp + up.row_bytes * w.n_ff_exp + down.row_bytes * n_embd;
  };
  if (w.critical_whole) return whole || critical ? part(w.gate_exps_r, w.up_exps_r, w.down_exps_r) : 0;
  uint64_t bytes = whole ? part(w.gate_exps, w.up_exps, w.down_exps) : 0;
  if (critical) bytes += part(w.gate_exps_r, w.up_exps_r, w.down_exps_r);
  return bytes;
}

void run_experts_on_cpu(const cpu::KernelTable& k, cpu::ThreadPool& pool, const MoeStep& step, const FfnRows& ffn) {
  const MoeWeights& w = step.w;
  const Routing& r = step.r;
  const int64_t n = ffn.n, n_embd = ffn.n_embd;
  const int64_t nu = static_cast<int64_t>(r.ids.size()) / n;
  thread_local cpu::ExpertBatch batch;
  batch.clear(n, nu + (w.has_shared ? 1 : 0));
  for (int64_t e = 0; e < w.n_expert; ++e) add_routed_expert(batch, w, step.items, r, e, nu, n_embd);
  add_shared_experts(batch, w, n, nu, step.shared_weights);
  cpu::run_experts(k, pool, batch, ffn.x, n_embd, ffn.out);
}

}  // namespace hetmoe::model
