// The forward pass, written once over Device ops: on the host device (the CPU, its weights where they lie) or with the
// residual stream on a GPU (or the emulated one). Per layer: norms and the architecture's attention on the pass's
// device, then the FFN step: a dense SwiGLU, or the router on the pass's device and the experts as the executor's plan
// places them (resident ones on the device while the CPU runs its own and the residuals); then the output head.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"
#include "quant/ref.h"
#include "runtime/error.h"
#include "runtime/model/model.h"

namespace hetmoe::model {
namespace {

// The pass's scratch slots (an architecture's attention numbers its own from Pass::kAttentionSlots).
// kSpare: a hyper-connected model's second state buffer (and the flattened norm's rows); kHyper: its mixes and
// coefficients.
enum Slot : size_t { kX, kNormed, kBranch, kTable, kRouterSlot, kSpare, kHyper };
static_assert(kHyper < Pass::kAttentionSlots);

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The diagnostic run's check after every layer: the first layer whose output holds a non-finite value.
class NonFiniteLayer final : public Trace {
 public:
  void values(int64_t layer, std::string_view name, const float* data, int64_t rows, int64_t cols) override {
    if (layer_ < 0 && name == "l_out" && !cpu::all_finite(data, rows * cols)) layer_ = layer;
  }
  void ids(int64_t, std::string_view, const int32_t*, int64_t, int64_t) override {}
  int64_t layer() const { return layer_; }

 private:
  int64_t layer_ = -1;
};

}  // namespace

cpu::HyperConnection Model::hyper(const Pass& pass, const HyperHandles& h, bool output_head) const {
  return {.n_streams = static_cast<int>(config_.hc_streams),
          .sinkhorn_iters = static_cast<int>(config_.hc_sinkhorn_iters),
          .output_head = output_head,
          .eps = config_.hc_eps,
          .scale = pass.vector(h.scale),
          .base = pass.vector(h.base)};
}

void Model::hyper_pre(Pass& pass, const HyperHandles& h, bool output_head, const float* x, int64_t n, float* flat,
                      float* mix, float* coef, float* xin) {
  device::Device& d = pass.device;
  const int64_t E = config_.n_embd, W = config_.hc_streams * E;
  // The mixes: fn . rms(flatten(X)), the norm without weight and with the model's RMS eps.
  d.rms_norm(pass.stream, x, W, nullptr, n, W, config_.rms_eps, flat, W);
  d.matmul(pass.stream, pass.matrix(h.fn), flat, n, mix);
  const cpu::HyperConnection hc = hyper(pass, h, output_head);
  d.hyper_pre(pass.stream, hc, mix, hc.n_mix(), x, E, n, coef, xin);
}

RoutingParams Model::routing_params() const {
  return {.n_expert = config_.n_expert,
          .n_used = config_.n_expert_used,
          .gating = config_.gating,
          .norm = config_.expert_weights_norm,
          .scale = config_.expert_weights_scale,
          .n_group = config_.n_group,
          .n_group_used = config_.n_group_used};
}

void Model::attach_device(device::Device& device, const DeviceExperts::Placement& placement, bool whole_pass) {
  if (device.is_host()) fail("attach_device: the host device is where the model already runs");
  device_pass_.reset();
  device_experts_.reset();
  std::vector<DeviceExperts::Expert> experts;
  // The output head first: every token reads all of it (a third of the bytes of a decode step of DeepSeek-V2-Lite).
  experts.push_back({-1, DeviceExperts::kOutput, output_, {}, {}});
  const int64_t E = config_.n_embd;
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    const MoeWeights& m = ffn_[l].moe;
    const int64_t ff = m.n_ff_exp;
    if (!config_.is_moe_layer(l)) {  // a dense layer's FFN
      experts.push_back({l, DeviceExperts::kDense, ffn_[l].gate, ffn_[l].up, ffn_[l].down});
      continue;
    }
    // The shared experts serve every token: they go first.
    if (m.n_expert > 0 && m.has_shared)
      experts.push_back(
          {l, DeviceExperts::kShared, m.gate_shexp, m.up_shexp, m.down_shexp, m.shared_swiglu_limit > 0.0f});
    // gpt-oss's routed experts (biases, clamped SwiGLU) and DeepSeek-V4's (clamped SwiGLU) have no device kernels
    // yet: they stay on the CPU.
    const bool cpu_only = m.gate_exps_bias != nullptr || m.clamped_swiglu || m.swiglu_limit > 0.0f;
    for (int64_t e = 0; e < m.n_expert; ++e)
      experts.push_back(
          {l, e, m.gate_exps.rows(e * ff, ff), m.up_exps.rows(e * ff, ff), m.down_exps.rows(e * E, E), cpu_only});
  }
  // The pass's own weights come first, all or nothing: placed once the experts' streams exist (the pass runs on their
  // compute stream).
  DeviceExperts::Placement rest = placement;
  std::unique_ptr<Pass> pass;
  if (whole_pass) {
    pass = std::make_unique<Pass>(device, -1, weights_);
    if (!pass->weights.supported() || pass->weights.bytes() > placement.budget_bytes) {
      pass.reset();
    } else {
      rest.budget_bytes -= pass->weights.bytes();
    }
  }
  device_experts_ = std::make_unique<DeviceExperts>(device, rest, experts);
  if (!pass) return;
  pass->stream = device_experts_->compute_stream();
  try {
    pass->weights.upload(pass->stream);
    device_pass_ = std::move(pass);
  } catch (const Error&) {
    // the device's memory ran out after all: the pass stays on the host
  }
}

void Model::forward(std::span<const int32_t> tokens, int64_t pos0, KvCache& cache, bool all_logits,
                    std::vector<float>& logits, Trace* trace, const std::atomic<bool>* cancel) {
  const SequenceBatch one{.tokens = tokens,
                          .pos0 = pos0,
                          .cache = &cache,
                          .logits = all_logits ? SequenceBatch::Logits::kAll : SequenceBatch::Logits::kLast};
  forward(std::span<const SequenceBatch>(&one, 1), logits, trace, cancel);
}

void Model::forward(std::span<const SequenceBatch> batch, std::vector<float>& logits, Trace* trace,
                    const std::atomic<bool>* cancel) {
  if (forward_once(batch, logits, trace, cancel)) return;
  // Broken weights: run the batch again (it rewrites the same cache rows) with a check after every layer, to say
  // where it breaks. The run it repeats was deterministic, so it breaks at the same place. Recurrent state must be
  // back where the batch started: a checkpoint there (the session takes one before each batch of a prompt).
  for (const SequenceBatch& b : batch)
    if (b.cache->has_recurrent() && b.cache->rollback(b.pos0) != b.pos0)
      fail(
          "the model computed NaN or infinity (its weights or scales are broken; no checkpoint to find the layer); "
          "generation stopped");
  NonFiniteLayer finder;
  std::vector<float> again;
  forward_once(batch, again, &finder, cancel);
  if (finder.layer() >= 0)
    fail(
        "the model computed NaN or infinity in layer {} (the output of blk.{}): its weights or scales are broken; "
        "generation stopped",
        finder.layer(), finder.layer());
  fail(
      "the model computed NaN or infinity in the logits (output_norm / output.weight): its weights are broken; "
      "generation stopped");
}

bool Model::forward_once(std::span<const SequenceBatch> batch, std::vector<float>& logits, Trace* trace,
                         const std::atomic<bool>* cancel) {
  const ModelConfig& c = config_;
  const int64_t E = c.n_embd, nd = c.rope.n_dims;
  if (batch.empty()) fail("nothing to evaluate: the batch is empty");
  // Every part is checked before anything changes.
  const device::Device* cache_device = batch.front().cache ? batch.front().cache->device() : nullptr;
  int64_t n = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceBatch& b = batch[i];
    const int64_t m = static_cast<int64_t>(b.tokens.size());
    if (!b.cache) fail("a sequence of the batch has no KV cache");
    if (m == 0) fail("nothing to evaluate: the token list is empty");
    for (int32_t t : b.tokens)
      if (t < 0 || t >= c.n_vocab) fail("token id {} is out of range (the vocabulary has {} tokens)", t, c.n_vocab);
    if (b.pos0 < 0 || b.pos0 + m > b.cache->n_ctx())
      fail("context full: {} more tokens do not fit after {} of {} positions", m, b.pos0, b.cache->n_ctx());
    if (b.cache->has_recurrent() && b.pos0 != b.cache->recurrent_pos())
      fail("the recurrent state holds {} positions; a batch at position {} needs a rollback first (KvCache::rollback)",
           b.cache->recurrent_pos(), b.pos0);
    if (b.cache->device() != cache_device) fail("the sequences of a batch need their KV caches on one device");
    if (b.hidden && c.hc_streams > 0) fail("a hyper-connected model's final hidden states are not kept");
    for (size_t j = 0; j < i; ++j)
      if (batch[j].cache == b.cache) fail("a KV cache appears twice in one batch");
    n += m;
  }
  // The pass runs where the caches live.
  if (cache_device && !(device_pass_ && cache_device == &device_pass_->device))
    fail("this KV cache lives on a device the model's forward pass does not run on");
  Pass& p = cache_device ? *device_pass_ : *host_pass_;
  device::Device& d = p.device;
  const int s = p.stream;
  batch_tokens_.clear();
  batch_sequences_.clear();
  int64_t n_out = 0;
  for (const SequenceBatch& b : batch) {
    const int64_t m = static_cast<int64_t>(b.tokens.size());
    batch_sequences_.push_back(
        {.row0 = static_cast<int64_t>(batch_tokens_.size()), .n = m, .pos0 = b.pos0, .cache = b.cache});
    batch_tokens_.insert(batch_tokens_.end(), b.tokens.begin(), b.tokens.end());
    n_out += b.logits == SequenceBatch::Logits::kAll ? m : b.logits == SequenceBatch::Logits::kLast ? 1 : 0;
  }
  const std::span<const int32_t> tokens(batch_tokens_);
  trace_ = trace;
  tokens_ = tokens;
  p.sequences = batch_sequences_;
  // trace_, tokens_ and the pass's sequences are cleared however the pass ends.
  struct ClearTrace {
    Trace*& trace;
    std::span<const int32_t>& tokens;
    std::span<const PassSequence>& sequences;
    ~ClearTrace() {
      trace = nullptr;
      tokens = {};
      sequences = {};
    }
  } clear_trace{trace_, tokens_, p.sequences};
  const auto t_start = std::chrono::steady_clock::now();
  double t_attention = 0, t_dense = 0, t_moe = 0;

  // Up: the embedding rows and the RoPE table of each row's position (the YaRN arithmetic stays on the host, in
  // cpu::rope_cache).
  float* up = p.staging_up(n * (E + nd));
  for (int64_t t = 0; t < n; ++t) {
    quant::dequantize_row(token_embd_->type, token_embd_->row(tokens[t]), up + t * E, E);
    if (!cpu::all_finite(up + t * E, E))
      fail(
          "the embedding of token {} (a row of token_embd.weight) holds NaN or infinity: the model's weights are "
          "broken",
          tokens[t]);
  }
  for (const PassSequence& q : batch_sequences_)
    for (int64_t t = 0; t < q.n; ++t) cpu::rope_cache(c.rope, q.pos0 + t, up + n * E + (q.row0 + t) * nd);
  // The residual stream (a hyper-connected model's: S copies of the hidden state, each starting as the embedding),
  // its normalised copy and a branch's output, in the pass's memory.
  const bool mixed = c.hc_streams > 0;
  const int64_t S = mixed ? c.hc_streams : 1;
  float* x = p.scratch(kX, n * S * E);
  float* xn = p.scratch(kNormed, n * E);
  float* branch = p.scratch(kBranch, n * E);
  float* table = p.scratch(kTable, std::max<int64_t>(n * nd, 1));
  float* spare = mixed ? p.scratch(kSpare, n * S * E) : nullptr;
  const int64_t n_mix = (2 + S) * S;
  float* mix = mixed ? p.scratch(kHyper, 2 * n * n_mix) : nullptr;
  float* coef = mixed ? mix + n * n_mix : nullptr;
  if (mixed) {
    d.copy_to_device(s, xn, up, n * E * sizeof(float));
    for (int64_t h = 0; h < S; ++h) d.copy_rows(s, xn, E, n, E, x + h * E, S * E);
  } else {
    d.copy_to_device(s, x, up, n * E * sizeof(float));
  }
  d.copy_to_device(s, table, up + n * E, n * nd * sizeof(float));
  p.rope_table = table;
  begin_batch(p);

  // The recurrent state is half-updated until the last layer ran: a pass that stops early leaves it for a rollback.
  for (const SequenceBatch& b : batch) b.cache->invalidate_recurrent();
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (cancel && cancel->load(std::memory_order_relaxed)) {
      d.synchronize();  // the staging buffers are reused by the next call
      throw Cancelled();
    }
    const LayerHandles& h = handles_[l];
    // A sub-block's input: the residual stream normalised, or of a hyper-connected one its mix normalised.
    auto sub_block_input = [&](const HyperHandles* hh, PassWeights::Handle norm) {
      if (!mixed) return d.rms_norm(s, x, E, p.vector(norm), n, E, c.rms_eps, xn, E);
      hyper_pre(p, *hh, false, x, n, spare, mix, coef, branch);
      d.rms_norm(s, branch, E, p.vector(norm), n, E, c.rms_eps, xn, E);
    };
    // Its output back into the residual stream: added, or mixed into the new state.
    auto sub_block_output = [&](const HyperHandles* hh) {
      if (!mixed) return d.add(s, branch, n * E, x);
      d.hyper_post(s, hyper(p, *hh, false), coef, branch, x, E, n, spare);
      std::swap(x, spare);
    };
    sub_block_input(mixed ? &hyper_attn_[l] : nullptr, h.attn_norm);
    const auto t_attn = std::chrono::steady_clock::now();
    attention(p, l, xn, n, branch);
    if (profile_enabled_) t_attention += seconds_since(t_attn);
    sub_block_output(mixed ? &hyper_attn_[l] : nullptr);
    sub_block_input(mixed ? &hyper_ffn_[l] : nullptr, h.ffn_norm);
    const auto t_ffn = std::chrono::steady_clock::now();
    ffn(p, l, xn, n, branch);
    if (profile_enabled_) (c.is_moe_layer(l) ? t_moe : t_dense) += seconds_since(t_ffn);
    sub_block_output(mixed ? &hyper_ffn_[l] : nullptr);
    if (trace) trace->values(l, "l_out", p.to_host(x, n * S * E), n, S * E);
  }
  for (const SequenceBatch& b : batch) b.cache->set_recurrent_pos(b.pos0 + static_cast<int64_t>(b.tokens.size()));
  // Every row's final hidden state when a sequence asked for them (an MTP drafter's input).
  hidden_.clear();
  if (std::any_of(batch.begin(), batch.end(), [](const SequenceBatch& b) { return b.hidden; })) {
    d.rms_norm(s, x, E, p.vector(output_norm_), n, E, c.rms_eps, xn, E);
    const float* rows = p.to_host(xn, n * E);
    hidden_.assign(rows, rows + n * E);
  }

  // The rows whose logits are asked for: the last ones of a single sequence, else gathered to the front row by row
  // (a row only moves down, past rows already read).
  logits.resize(n_out * c.n_vocab);
  if (n_out == 0) {
    d.synchronize(d.record(s));
    return true;
  }
  int64_t first = n - n_out;
  if (batch.size() > 1) {
    int64_t to = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const PassSequence& q = batch_sequences_[i];
      const SequenceBatch::Logits want = batch[i].logits;
      if (want == SequenceBatch::Logits::kNone) continue;
      for (int64_t from = want == SequenceBatch::Logits::kAll ? q.row0 : q.row0 + q.n - 1; from < q.row0 + q.n;
           ++from, ++to)
        if (from != to) d.copy_rows(s, x + from * S * E, S * E, 1, S * E, x + to * S * E, S * E);
    }
    first = 0;
  }
  if (mixed) {
    hyper_pre(p, hyper_out_, true, x + first * S * E, n_out, spare, mix, coef, branch);
    d.rms_norm(s, branch, E, p.vector(output_norm_), n_out, E, c.rms_eps, xn, E);
  } else {
    d.rms_norm(s, x + first * E, E, p.vector(output_norm_), n_out, E, c.rms_eps, xn, E);
  }
  const auto t_out = std::chrono::steady_clock::now();
  // The rows the head reads, checked on the host: its quantized activations would turn a NaN into zero logits.
  const float* rows = p.to_host(xn, n_out * E);
  bool finite = cpu::all_finite(rows, n_out * E);
  // The output head where it is resident on a device, else on the CPU.
  const float* device_rows = p.on_host() ? nullptr : xn;
  const float* host_rows = p.on_host() ? xn : nullptr;
  if (!(device_experts_ &&
        device_experts_->run_matrix(-1, DeviceExperts::kOutput, host_rows, n_out, logits.data(), device_rows)))
    cpu::matmul(kernels_, *pool_, output_, rows, n_out, logits.data(), c.n_vocab);
  d.synchronize(d.record(s));
  finite = finite && cpu::all_finite(logits.data(), n_out * c.n_vocab);
  if (profile_enabled_) {
    const double t_output = seconds_since(t_out), t_total = seconds_since(t_start);
    Profile& pr = profile_[n > 1 ? 1 : 0];
    pr.attention += t_attention;
    pr.dense_ffn += t_dense;
    pr.moe_ffn += t_moe;
    pr.output += t_output;
    pr.rest += t_total - t_attention - t_dense - t_moe - t_output;  // embedding, norms, residual adds
    pr.calls += 1;
    pr.tokens += n;
  }
  return finite;
}

void Model::forward_mtp(std::span<const int32_t> next, const float* hidden, int64_t pos0, KvCache& cache,
                        float* out_hidden, std::vector<float>& logits) {
  const ModelConfig& c = config_;
  const int64_t E = c.n_embd, nd = c.rope.n_dims, n = static_cast<int64_t>(next.size());
  if (c.n_mtp == 0) fail("{}: the model has no MTP block to draft with", file_->path());
  if (n == 0) fail("nothing to evaluate: the token list is empty");
  for (int32_t t : next)
    if (t < 0 || t >= c.n_vocab) fail("token id {} is out of range (the vocabulary has {} tokens)", t, c.n_vocab);
  if (cache.device() || cache.n_layer() != c.n_layer + c.n_mtp)
    fail("the MTP block runs on a cache from make_mtp_cache");
  if (pos0 < 0 || pos0 + n > cache.n_ctx())
    fail("context full: {} more tokens do not fit after {} of {} positions", n, pos0, cache.n_ctx());
  const int64_t layer = c.n_layer;
  const MtpHandles& m = mtp_.front();
  const LayerHandles& h = handles_[layer];
  Pass& p = *host_pass_;
  device::Device& d = p.device;
  const int s = p.stream;
  // The trunk's observers and overrides number the trunk's layers: the block runs without them.
  struct Hooks {
    Model& model;
    RoutingObserver* observer;
    RoutingOverride* routing;
    SelectionOverride* selection;
    ~Hooks() {
      model.routing_observer_ = observer;
      model.routing_override_ = routing;
      model.selection_override_ = selection;
      model.tokens_ = {};
    }
  } hooks{*this, routing_observer_, routing_override_, selection_override_};
  routing_observer_ = nullptr;
  routing_override_ = nullptr;
  selection_override_ = nullptr;
  tokens_ = next;
  batch_sequences_.assign(1, PassSequence{.row0 = 0, .n = n, .pos0 = pos0, .cache = &cache});
  p.sequences = batch_sequences_;

  // The concatenation's halves, [n][2E]: the embedding of the next token (zero at position 0), the hidden state.
  float* up = p.staging_up(n * (2 * E + nd));
  for (int64_t t = 0; t < n; ++t) {
    float* row = up + t * 2 * E;
    if (pos0 + t == 0 && c.mtp_zero_first) {
      std::fill_n(row, E, 0.0f);
    } else {
      quant::dequantize_row(m.embed->type, m.embed->row(next[t]), row, E);
    }
    std::copy_n(hidden + t * E, E, row + E);
    cpu::rope_cache(c.rope, pos0 + t, up + n * 2 * E + t * nd);
  }
  float* x = p.scratch(kX, n * E);
  float* xn = p.scratch(kNormed, n * E);
  float* branch = p.scratch(kBranch, n * E);
  float* table = p.scratch(kTable, std::max<int64_t>(n * nd, 1));
  float* joined = p.scratch(kSpare, n * 2 * E);
  d.copy_to_device(s, joined, up, n * 2 * E * sizeof(float));
  d.copy_to_device(s, table, up + n * 2 * E, n * nd * sizeof(float));
  p.rope_table = table;
  d.rms_norm(s, joined, 2 * E, p.vector(m.enorm), n, E, c.rms_eps, joined, 2 * E);
  d.rms_norm(s, joined + E, 2 * E, p.vector(m.hnorm), n, E, c.rms_eps, joined + E, 2 * E);
  d.matmul(s, p.matrix(m.eh_proj), joined, n, x);
  begin_batch(p);
  d.rms_norm(s, x, E, p.vector(h.attn_norm), n, E, c.rms_eps, xn, E);
  attention(p, layer, xn, n, branch);
  d.add(s, branch, n * E, x);
  d.rms_norm(s, x, E, p.vector(h.ffn_norm), n, E, c.rms_eps, xn, E);
  ffn(p, layer, xn, n, branch);
  d.add(s, branch, n * E, x);
  // The last row: its state for a chained draft, its logits through the block's head.
  const float* last = x + (n - 1) * E;
  std::copy_n(p.to_host(last, E), E, out_hidden);
  d.rms_norm(s, last, E, p.vector(m.head_norm), 1, E, c.rms_eps, xn, E);
  logits.resize(c.n_vocab);
  cpu::matmul(kernels_, *pool_, m.head, p.to_host(xn, E), 1, logits.data(), c.n_vocab);
  d.synchronize(d.record(s));
  p.sequences = {};
}

void Model::ffn(Pass& p, int64_t layer, const float* x, int64_t n, float* out) {
  const ModelConfig& c = config_;
  device::Device& d = p.device;
  const int s = p.stream;
  const int64_t E = c.n_embd;
  const FfnWeights& w = ffn_[layer];
  // The FFN's rows where the CPU reads and writes them: the pass's own on the host, else host copies (the rows come
  // down, the CPU's result goes up); the executor then works from the device's rows too (io).
  const bool on_host = p.on_host();
  const StepOnDevice on_device = on_host ? StepOnDevice{} : StepOnDevice{x, out};
  float* host_out = on_host ? out : cpu::scratch<float, struct FfnHostOutSite>(n * E).data();
  if (!c.is_moe_layer(layer)) {
    if (device_experts_ && layer < c.n_layer &&
        device_experts_->run_dense(kernels_, *pool_, layer, w.gate.n_rows,
                                   {on_host ? x : nullptr, host_out, n, E, on_device}))
      return;
    swiglu_ffn(kernels_, *pool_, w.gate, w.up, w.down, p.to_host(x, n * E), n, host_out);
    p.from_host(host_out, n * E, out);
    return;
  }

  // The router on the pass's device. Its choice comes down with the rows the CPU needs (for its experts and the
  // critical experts' residuals); with a trace, or a device whose selection kernel cannot take this router, the logits
  // come down instead and the host routes, reporting every step of it.
  const LayerHandles& h = handles_[layer];
  const int64_t ne = c.n_expert, nu = c.n_expert_used;
  const bool select_here = !trace_ && c.gating != Gating::kSoftmaxSelected && c.gating != Gating::kSqrtSoftplus &&
                           d.selects_experts(c.n_expert, c.n_group);
  const RoutingParams rp = routing_params();
  float* router_logits = p.scratch(kRouterSlot, n * ne + 2 * n * nu);
  d.matmul(s, p.matrix(h.router), x, n, router_logits);
  if (h.router_logit_bias) d.add_bias(s, p.vector(h.router_logit_bias), ne, n, router_logits, ne);
  // One round trip brings the choice (or the logits) and the rows down.
  const float* host_x = nullptr;
  const float* host_routing = nullptr;
  const int64_t routing_floats = select_here ? 2 * n * nu : n * ne;
  float* routing_rows = router_logits;
  if (select_here) {
    routing_rows = router_logits + n * ne;  // ids [n][nu] (int32), then weights [n][nu]
    d.select_experts(s, rp.selection(), router_logits, w.moe.probs_bias ? p.vector(h.router_bias) : nullptr, n,
                     reinterpret_cast<int32_t*>(routing_rows), routing_rows + n * nu);
  }
  p.to_host(
      {{routing_rows, static_cast<size_t>(routing_floats), &host_routing}, {x, static_cast<size_t>(n * E), &host_x}});
  thread_local Routing r;
  if (select_here) {
    r.ids.resize(n * nu);
    r.weights.resize(n * nu);
    std::memcpy(r.ids.data(), host_routing, n * nu * sizeof(int32_t));
    std::copy_n(host_routing + n * nu, n * nu, r.weights.data());
  } else {
    // The logits become probabilities in place (the pass's own buffer on the host, else the staging copy). A
    // hash-routed layer takes each token's experts from its table.
    thread_local std::vector<int32_t> fixed;
    if (w.moe.hash_ids) {
      fixed.resize(static_cast<size_t>(n * nu));
      for (int64_t t = 0; t < n; ++t) std::copy_n(w.moe.hash_ids + tokens_[t] * nu, nu, fixed.data() + t * nu);
    }
    route(rp, const_cast<float*>(host_routing), w.moe.hash_ids ? nullptr : w.moe.probs_bias, n, r, trace_, layer,
          w.moe.hash_ids ? fixed.data() : nullptr);
  }
  if (routing_override_) routing_override_->reroute(layer, n, nu, r.ids.data(), r.weights.data());
  if (routing_observer_) routing_observer_->routed(layer, n, nu, r.ids.data(), r.weights.data());
  // Every (token, slot) item grouped by expert; the shared experts come last in each token's sum, as llama.cpp adds
  // them after the routed ones, and the sum over a token's items runs in slot order, as llama.cpp's chain of adds.
  const RoutedItems items = group_items(w.moe, r, n, nu);
  thread_local std::vector<float> shared_weights;
  const bool gated = shared_expert_weights(kernels_, w.moe, host_x, n, E, shared_weights);
  const MoeStep step{
      .layer = layer, .w = w.moe, .r = r, .items = items, .shared_weights = gated ? shared_weights.data() : nullptr};
  const FfnRows rows{.x = host_x, .out = host_out, .n = n, .n_embd = E, .device = on_device};
  // An MTP block's experts run on the CPU (the executor places the trunk's).
  if (device_experts_ && layer < c.n_layer) return device_experts_->run(kernels_, *pool_, step, rows);
  for (int64_t e = 0; e < w.moe.n_expert; ++e)
    if (items.end[e] > items.begin(e)) cpu_expert_bytes_ += routed_bytes(w.moe, items, e, E, true);
  run_experts_on_cpu(kernels_, *pool_, step, rows);
  p.from_host(host_out, n * E, out);
}

}  // namespace hetmoe::model
