// The forward pass with its residual stream on the device: norms, attention (the architecture's
// device_attention), router logits and the FFNs' device part run on the device's compute stream; the host routes,
// runs the CPU's experts and residuals, and reads the logits.
#include <algorithm>
#include <cstring>

#include "cpu_kernels/scratch.h"
#include "quant/ref.h"
#include "runtime/error.h"
#include "runtime/model/model.h"

namespace hetmoe::model {
namespace {

// The pass's scratch slots (an architecture's attention numbers its own from DevicePass::kAttentionSlots).
enum Slot : size_t { kX, kNormed, kBranch, kTable, kRouterSlot };
static_assert(kRouterSlot < DevicePass::kAttentionSlots);

}  // namespace

void Model::attach_device(device::Device& device, const DeviceExperts::Placement& placement, bool whole_pass) {
  const int64_t E = config_.n_embd;
  device_forward_.reset();
  device_experts_.reset();
  std::vector<DeviceExperts::Expert> experts;
  // The output head first: every token reads all of it (a third of the bytes of a decode step of DeepSeek-V2-Lite).
  experts.push_back({-1, DeviceExperts::kOutput, output_, {}, {}});
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    const MoeWeights& m = ffn_[l].moe;
    const int64_t ff = m.n_ff_exp;
    if (!config_.is_moe_layer(l)) {  // a dense layer's FFN
      experts.push_back({l, DeviceExperts::kDense, ffn_[l].gate, ffn_[l].up, ffn_[l].down});
      continue;
    }
    // The shared experts serve every token: they go first.
    if (m.n_expert > 0 && m.has_shared)
      experts.push_back({l, DeviceExperts::kShared, m.gate_shexp, m.up_shexp, m.down_shexp});
    for (int64_t e = 0; e < m.n_expert; ++e)
      experts.push_back({l, e, m.gate_exps.rows(e * ff, ff), m.up_exps.rows(e * ff, ff), m.down_exps.rows(e * E, E)});
  }
  // The pass's own weights come first: planned here, placed once the experts' streams exist (the pass runs on their
  // compute stream), all or nothing.
  DeviceExperts::Placement rest = placement;
  if (whole_pass) {
    device_forward_ = std::make_unique<DeviceForward>(device, -1);
    DeviceForward& f = *device_forward_;
    for (int64_t l = 0; l < config_.n_layer; ++l) {
      f.attn_norm.push_back(f.weights.add(attn_norm_[l], E));
      f.ffn_norm.push_back(f.weights.add(ffn_[l].norm, E));
      const bool moe = config_.is_moe_layer(l);
      const float* bias = moe ? ffn_[l].moe.probs_bias : nullptr;
      f.router.push_back(moe ? f.weights.add(ffn_[l].moe.gate_inp) : 0);
      f.router_bias.push_back(bias ? f.weights.add(bias, config_.n_expert) : 0);
    }
    f.output_norm = f.weights.add(output_norm_, E);
    plan_device_attention(f.weights);
    if (!f.weights.supported() || f.weights.bytes() > placement.budget_bytes) {
      device_forward_.reset();
    } else {
      rest.budget_bytes -= f.weights.bytes();
    }
  }
  device_experts_ = std::make_unique<DeviceExperts>(device, rest, experts);
  for (FfnWeights& f : ffn_)
    if (f.moe.n_expert > 0) f.moe.device = device_experts_.get();
  if (!device_forward_) return;
  device_forward_->pass.stream = device_experts_->compute_stream();
  try {
    device_forward_->weights.upload(device_forward_->pass.stream);
  } catch (const Error&) {
    device_forward_.reset();  // the device's memory ran out after all: the pass stays on the host
  }
}

void Model::forward_on_device(std::span<const int32_t> tokens, int64_t pos0, KvCache& cache, bool all_logits,
                              std::vector<float>& logits, Trace* trace, const std::atomic<bool>* cancel) {
  const ModelConfig& c = config_;
  DeviceForward& f = *device_forward_;
  device::Device& d = f.pass.device;
  const int s = f.pass.stream;
  const int64_t n = static_cast<int64_t>(tokens.size()), E = c.n_embd, nd = c.rope.n_dims;
  trace_ = trace;
  // trace_ is cleared however the pass ends.
  struct ClearTrace {
    Trace*& trace;
    ~ClearTrace() { trace = nullptr; }
  } clear_trace{trace_};
  // Up: the embedding rows and the RoPE table of the batch's positions (the YaRN arithmetic stays on the host, in
  // cpu::rope_cache).
  float* up = f.up.reserve(n * (E + nd));
  for (int64_t t = 0; t < n; ++t) {
    quant::dequantize_row(token_embd_->type, token_embd_->row(tokens[t]), up + t * E, E);
    cpu::rope_cache(c.rope, pos0 + t, up + n * E + t * nd);
  }
  float* x = f.pass.scratch(kX, n * E);
  float* xn = f.pass.scratch(kNormed, n * E);
  float* branch = f.pass.scratch(kBranch, n * E);
  float* table = f.pass.scratch(kTable, std::max<int64_t>(n * nd, 1));
  d.copy_to_device(s, x, up, n * E * sizeof(float));
  d.copy_to_device(s, table, up + n * E, n * nd * sizeof(float));
  f.pass.rope_table = table;
  std::span<float> host_x = cpu::scratch<float, struct DeviceTraceSite>(trace ? n * E : 0);

  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (cancel && cancel->load(std::memory_order_relaxed)) {
      d.synchronize();  // the staging buffers are reused by the next call
      throw Cancelled();
    }
    d.rms_norm(s, x, E, f.weights.vector(f.attn_norm[l]), n, E, c.rms_eps, xn, E);
    device_attention(f.pass, l, xn, n, pos0, cache, branch);
    d.add(s, branch, n * E, x);
    d.rms_norm(s, x, E, f.weights.vector(f.ffn_norm[l]), n, E, c.rms_eps, xn, E);
    ffn_on_device(l, xn, n, branch);
    d.add(s, branch, n * E, x);
    if (trace) {
      float* down = f.down.reserve(n * E);
      d.copy_to_host(s, down, x, n * E * sizeof(float));
      d.synchronize(d.record(s));
      std::copy_n(down, n * E, host_x.data());
      trace->values(l, "l_out", host_x.data(), n, E);
    }
  }

  const int64_t first = all_logits ? 0 : n - 1, n_out = n - first;
  d.rms_norm(s, x + first * E, E, f.weights.vector(f.output_norm), n_out, E, c.rms_eps, xn, E);
  logits.resize(n_out * c.n_vocab);
  if (!device_experts_->run_matrix(-1, DeviceExperts::kOutput, nullptr, n_out, logits.data(), xn)) {
    std::span<float> normed = cpu::scratch<float, struct DeviceOutputSite>(n_out * E);
    float* down = f.down.reserve(n_out * E);
    d.copy_to_host(s, down, xn, n_out * E * sizeof(float));
    d.synchronize(d.record(s));
    std::copy_n(down, n_out * E, normed.data());
    matmul(output_, normed.data(), n_out, logits.data(), c.n_vocab);
  }
  d.synchronize(d.record(s));
}

void Model::ffn_on_device(int64_t layer, const float* x, int64_t n, float* out) {
  const ModelConfig& c = config_;
  DeviceForward& f = *device_forward_;
  device::Device& d = f.pass.device;
  const int s = f.pass.stream;
  const int64_t E = c.n_embd;
  const FfnWeights& w = ffn_[layer];
  std::span<float> host_out = cpu::scratch<float, struct DeviceFfnOutSite>(n * E);
  const StepOnDevice io{x, out};
  if (!c.is_moe_layer(layer) &&
      device_experts_->run_dense(kernels_, *pool_, layer, w.gate.n_rows, nullptr, n, E, host_out.data(), io))
    return;

  // The rows come down for the CPU: all of a dense FFN that is not resident; for an MoE layer, for the CPU's experts
  // and the critical experts' residuals, with the router's choice (made on the device; with a trace, the logits come
  // down and the host routes, reporting every step of it).
  const int64_t ne = c.is_moe_layer(layer) ? c.n_expert : 0, nu = c.n_expert_used;
  const bool select_here = ne > 0 && !trace_ && d.selects_experts(c.n_expert, c.n_group);
  const RoutingParams p = routing_params();
  const int64_t routing_floats = select_here ? 2 * n * nu : n * ne;
  float* down = f.down.reserve(n * E + routing_floats);
  if (ne > 0) {
    float* router_logits = f.pass.scratch(kRouterSlot, n * ne + 2 * n * nu);
    d.matmul(s, f.weights.matrix(f.router[layer]), x, n, router_logits);
    if (select_here) {
      float* chosen = router_logits + n * ne;  // ids [n][nu] (int32), then weights [n][nu]
      d.select_experts(s, p.selection(), router_logits,
                       w.moe.probs_bias ? f.weights.vector(f.router_bias[layer]) : nullptr, n,
                       reinterpret_cast<int32_t*>(chosen), chosen + n * nu);
      d.copy_to_host(s, down + n * E, chosen, 2 * n * nu * sizeof(float));
    } else {
      d.copy_to_host(s, down + n * E, router_logits, n * ne * sizeof(float));
    }
  }
  d.copy_to_host(s, down, x, n * E * sizeof(float));
  d.synchronize(d.record(s));
  const float* host_x = down;  // the pinned rows are read where they came down (nothing reuses them this step)
  if (ne == 0) {
    swiglu_ffn(kernels_, *pool_, w.gate, w.up, w.down, host_x, n, host_out.data());
    device_experts_->upload_result(host_out.data(), n, E, io);
    return;
  }
  thread_local Routing r;
  if (select_here) {
    r.ids.resize(n * nu);
    r.weights.resize(n * nu);
    std::memcpy(r.ids.data(), down + n * E, n * nu * sizeof(int32_t));
    std::copy_n(down + n * E + n * nu, n * nu, r.weights.data());
  } else {
    route(p, down + n * E, w.moe.probs_bias, n, r, trace_, layer);  // the logits become probabilities in place
  }
  if (routing_override_) routing_override_->reroute(layer, n, nu, r.ids.data(), r.weights.data());
  if (routing_observer_) routing_observer_->routed(layer, n, nu, r.ids.data(), r.weights.data());
  const RoutedItems items = group_items(w.moe, r, n, nu);
  device_experts_->run(kernels_, *pool_, w.moe, r, items, layer, host_x, n, E, host_out.data(), io);
}

}  // namespace hetmoe::model
