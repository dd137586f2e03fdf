// DeepSeek-V4 (GGUF arch "deepseek4"), as llama.cpp's graph computes it:
//  - hyper-connections: the residual stream is hc_streams copies of the hidden state, mixed around every sub-block
//    (Model::forward_once; cpu_kernels/hyper_connection.h);
//  - attention: q from a LoRA (attn_q_a, its norm, attn_q_b), each head RMS-normalised without weight; one key head kv
//    (attn_kv, its norm) that is key and value alike; RoPE (ggml's adjacent pairs) on the last rope.n_dims of a head;
//    a per-head sink logit; the output de-roped at the query's position, then the grouped output LoRA (attn_output_a
//    per group of heads, attn_output_b);
//  - visible keys: the raw keys of the last sliding_window positions, and per the layer's compression ratio the
//    compressed blocks of the KV compressor: ratio 4 (CSA) the lightning indexer's top-k of them, ratio 128 (HCA) all
//    of them, ratio 0 none. Compressed layers rotate with their own RoPE (compress_rope_freq_base, YaRN);
//  - the indexer (CSA layers): its keys are compressed the same way, rotated by a Walsh-Hadamard matrix, and scored
//    against queries from the q latent (roped, rotated) weighted by indexer.proj . x;
//  - MoE: sqrt(softplus) scores, selection by score plus bias, or by token id in the first hash_layer_count blocks
//    (ffn_gate_tid2eid); weights normalised and scaled; clamped SwiGLU in the routed and the shared experts.
// What a layer keeps of a sequence (cache_layer): the window's raw keys in a ring and the compressor's rows of
// incomplete blocks, as recurrent state (checkpoints give exact rollback), and one entry per completed block
// (compressed key, indexer key). The MTP block that the converter writes to a separate file is not read.
#include <cmath>

#include "runtime/error.h"
#include "runtime/model/archs.h"
#include "runtime/model/model.h"

namespace hetmoe::model {
namespace {

// A key that holds one value for every layer or an array of at least n_layer values (llama.cpp's get_key_or_arr).
std::vector<double> per_layer(const ConfigKeys& k, std::string_view key, int64_t n_layer, bool required) {
  const gguf::Value* v = k.find(key);
  if (!v) {
    if (required) fail("{}: missing key '{}'", k.file().path(), k.key(key));
    return {};
  }
  std::vector<double> out(static_cast<size_t>(n_layer));
  if (!v->is_array()) {
    const std::optional<double> x = v->as_float();
    if (!x) k.bad(key, v->to_display(), "is not a number");
    std::fill(out.begin(), out.end(), *x);
    return out;
  }
  if (static_cast<int64_t>(v->array_size()) < n_layer)
    k.bad(key, v->to_display(), fmt::format("has fewer than one value per block ({})", n_layer));
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::optional<double> x = v->array_float(static_cast<size_t>(l));
    if (!x) k.bad(key, v->to_display(), "holds a value that is not a number");
    out[l] = *x;
  }
  return out;
}

float required_float(const ConfigKeys& k, std::string_view key, double lo, double hi) {
  const std::optional<double> v = k.file().get_float(k.key(key));
  if (!v) fail("{}: missing key '{}'", k.file().path(), k.key(key));
  if (!(*v >= lo && *v <= hi)) k.bad(key, *v, fmt::format("is out of range ({}..{})", lo, hi));
  return static_cast<float>(*v);
}

void configure(const ConfigKeys& k, ModelConfig& c) {
  // An MTP block is read past only when the file has one (the converter writes it to a separate file).
  const int64_t nextn = k.opt_int("nextn_predict_layers", 0);
  if (nextn > 0 && nextn < c.n_layer &&
      k.file().find_tensor("blk." + std::to_string(c.n_layer - nextn) + ".nextn.eh_proj.weight"))
    drop_mtp_blocks(k, c, false);
  c.rms_eps = required_float(k, "attention.layer_norm_rms_epsilon", 1e-30, 0.5);
  if (c.n_head_kv != 1) k.bad("attention.head_count_kv", c.n_head_kv, "is not 1 (one key head serves every head)");
  if (c.head_dim_k != c.head_dim_v)
    k.bad("attention.value_length", c.head_dim_v,
          fmt::format("differs from {} = {}", k.key("attention.key_length"), c.head_dim_k));
  c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
  c.q_lora_rank = k.req_int("attention.q_lora_rank");
  k.check_positive("attention.q_lora_rank", c.q_lora_rank, ConfigKeys::kMaxDim);
  c.sliding_window = k.req_int("attention.sliding_window");
  k.check_positive("attention.sliding_window", c.sliding_window, 1 << 20);
  c.out_groups = k.req_int("attention.output_group_count");
  c.out_lora_rank = k.req_int("attention.output_lora_rank");
  k.check_positive("attention.output_group_count", c.out_groups, c.n_head);
  k.check_positive("attention.output_lora_rank", c.out_lora_rank, ConfigKeys::kMaxDim);
  if (c.n_head % c.out_groups != 0)
    k.bad("attention.output_group_count", c.out_groups,
          fmt::format("does not divide {} = {}", k.key("attention.head_count"), c.n_head));

  // MoE: sqrt(softplus) scores, selection bias, normalised and scaled weights, clamped SwiGLU.
  k.check_positive("expert_count", c.n_expert, 65536);
  const int64_t gating = k.req_int("expert_gating_func");
  if (gating != static_cast<int>(Gating::kSqrtSoftplus))
    k.bad("expert_gating_func", gating, "is not 4 (sqrt-softplus), the only scoring DeepSeek-V4 uses");
  c.gating = Gating::kSqrtSoftplus;
  // Only block 0's width counts (llama.cpp reads it so), whether the key is one value or one per block.
  const double ff = per_layer(k, "expert_feed_forward_length", 1, true)[0];
  if (!(ff >= 1 && ff <= ConfigKeys::kMaxDim))
    k.bad("expert_feed_forward_length", ff, fmt::format("is out of range (1..{})", ConfigKeys::kMaxDim));
  c.n_ff_exp = static_cast<int64_t>(ff);
  c.n_expert_shared = k.req_int("expert_shared_count");
  c.expert_weights_scale = required_float(k, "expert_weights_scale", 0, 1e6);
  const std::optional<bool> norm = k.file().get_bool(k.key("expert_weights_norm"));
  if (!norm) fail("{}: missing key '{}'", k.file().path(), k.key("expert_weights_norm"));
  c.expert_weights_norm = *norm;
  const std::vector<double> exp = per_layer(k, "swiglu_clamp_exp", c.n_layer, true);
  std::vector<double> shexp = per_layer(k, "swiglu_clamp_shexp", c.n_layer, false);
  if (shexp.empty()) shexp = exp;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!(exp[l] >= 0 && exp[l] <= 1e30)) k.bad("swiglu_clamp_exp", exp[l], "holds a limit out of range (0..1e30)");
    if (!(shexp[l] >= 0 && shexp[l] <= 1e30))
      k.bad("swiglu_clamp_shexp", shexp[l], "holds a limit out of range (0..1e30)");
    // llama.cpp clamps only above 1e-6.
    c.swiglu_limits.push_back(exp[l] > 1e-6 ? static_cast<float>(exp[l]) : 0.0f);
    c.shared_swiglu_limits.push_back(shexp[l] > 1e-6 ? static_cast<float>(shexp[l]) : 0.0f);
  }
  c.n_hash_layers = k.req_int("hash_layer_count");
  if (c.n_hash_layers < 0 || c.n_hash_layers > c.n_layer)
    k.bad("hash_layer_count", c.n_hash_layers, fmt::format("is out of range (0..{})", c.n_layer));

  // Hyper-connections.
  c.hc_streams = k.req_int("hyper_connection.count");
  k.check_positive("hyper_connection.count", c.hc_streams, 8);
  c.hc_sinkhorn_iters = k.req_int("hyper_connection.sinkhorn_iterations");
  k.check_positive("hyper_connection.sinkhorn_iterations", c.hc_sinkhorn_iters, 1000);
  c.hc_eps = required_float(k, "hyper_connection.epsilon", 0, 0.5);

  // The indexer.
  c.indexer_heads = k.req_int("attention.indexer.head_count");
  c.indexer_dim = k.req_int("attention.indexer.key_length");
  c.indexer_top_k = k.req_int("attention.indexer.top_k");
  k.check_positive("attention.indexer.head_count", c.indexer_heads, 4096);
  k.check_positive("attention.indexer.key_length", c.indexer_dim, 1 << 14);
  k.check_positive("attention.indexer.top_k", c.indexer_top_k, 1 << 20);
  if (c.indexer_dim % 64 != 0)
    k.bad("attention.indexer.key_length", c.indexer_dim, "is not a multiple of 64 (its Hadamard rotation's blocks)");
  if (c.rope.n_dims > c.indexer_dim)
    k.bad("attention.indexer.key_length", c.indexer_dim,
          fmt::format("is shorter than {} = {}", k.key("rope.dimension_count"), c.rope.n_dims));

  // Per-layer compression.
  const gguf::Value* ratios = k.find("attention.compress_ratios");
  if (!ratios || !ratios->is_array() || static_cast<int64_t>(ratios->array_size()) < c.n_layer)
    fail("{}: {} must be an array of one ratio per block", k.file().path(), k.key("attention.compress_ratios"));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int64_t r = ratios->array_int(static_cast<size_t>(l)).value_or(-1);
    if (r != 0 && r != 4 && r != 128)
      k.bad("attention.compress_ratios", ratios->to_display(), fmt::format("holds {} (block {}; 0, 4 or 128)", r, l));
    c.compress_ratios.push_back(r);
  }

  // RoPE: ggml's adjacent pairs on the last rope.n_dims of a head. The sliding-window layers rotate with
  // rope.freq_base and no scaling; the compressed layers, the indexer and the compressed entries with
  // compress_rope_freq_base and YaRN (beta 32/1, as llama.cpp, whatever the file says).
  c.rope.neox = false;
  c.compress_rope = c.rope;
  const double cbase = required_float(k, "attention.compress_rope_freq_base", 1, 1e12);
  c.compress_rope.freq_base = static_cast<float>(cbase);
  const std::string type = k.opt_string("rope.scaling.type").value_or("linear");
  float factor = static_cast<float>(k.opt_float("rope.scaling.factor", 0.0));
  if (factor == 0.0f || type == "none") factor = 1.0f;
  if (!(factor >= 1.0f && factor < 1e6f)) k.bad("rope.scaling.factor", factor, "is out of range (1..1e6)");
  c.compress_rope.freq_scale = 1.0f / factor;
  c.compress_rope.ext_factor = type == "yarn" ? 1.0f : 0.0f;
  c.compress_rope.attn_factor =
      c.compress_rope.ext_factor != 0.0f ? 1.0f / (1.0f + 0.1f * std::log(1.0f / c.compress_rope.freq_scale)) : 1.0f;
  c.compress_rope.beta_fast = 32.0f;
  c.compress_rope.beta_slow = 1.0f;
  c.compress_rope.n_ctx_orig = static_cast<int>(k.opt_int("rope.scaling.original_context_length", c.n_ctx_train));
}

// The orthonormal Walsh-Hadamard rotation of an indexer head: block-diagonal with blocks of the largest power of two
// (from 64) dividing `dim`, H[i][j] = (-1)^popcount(i & j) / sqrt(block), as llama.cpp rotates its indexer keys.
std::vector<float> hadamard(int64_t dim) {
  int64_t block = 64;
  while (dim % (2 * block) == 0) block *= 2;
  std::vector<float> h(static_cast<size_t>(dim * dim), 0.0f);
  const float v = 1.0f / std::sqrt(static_cast<float>(block));
  for (int64_t b = 0; b < dim; b += block)
    for (int64_t i = 0; i < block; ++i)
      for (int64_t j = 0; j < block; ++j)
        h[(b + i) * dim + b + j] = (__builtin_popcountll(static_cast<uint64_t>(i & j)) & 1) ? -v : v;
  return h;
}

// One layer's attention weights, as handles of the pass's weights.
struct Layer {
  PassWeights::Handle q_a = 0, q_a_norm = 0, q_b = 0, kv = 0, kv_norm = 0, out_a = 0, out_b = 0, sinks = 0;
  // Compressed layers: the compressor (ape [ratio][row width]); CSA layers also the indexer's.
  PassWeights::Handle comp_kv = 0, comp_gate = 0, comp_ape = 0, comp_norm = 0;
  PassWeights::Handle ix_q_b = 0, ix_proj = 0, ix_kv = 0, ix_gate = 0, ix_ape = 0, ix_norm = 0;
};

class DeepSeek4 final : public Model {
 public:
  DeepSeek4(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads)
      : Model(std::move(file), std::move(config), n_threads) {
    bind_common();
    bind_hyper_connections();
    const ModelConfig& c = config_;
    const int64_t E = c.n_embd, H = c.n_head, D = c.head_dim_k, QL = c.q_lora_rank, G = c.out_groups;
    const int64_t OL = c.out_lora_rank, IH = c.indexer_heads, ID = c.indexer_dim;
    hadamard_values_ = hadamard(ID);
    hadamard_ = weights_.add(cpu::WeightMatrix{quant::GgmlType::F32, ID, ID, static_cast<size_t>(ID) * sizeof(float),
                                               reinterpret_cast<const uint8_t*>(hadamard_values_.data())});
    layers_.resize(c.n_layer);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      Layer& L = layers_[l];
      L.q_a = weights_.add(matrix(blk(l, "attn_q_a"), E, QL));
      L.q_a_norm = weights_.add(vector(blk(l, "attn_q_a_norm"), QL), QL);
      L.q_b = weights_.add(matrix(blk(l, "attn_q_b"), QL, H * D));
      L.kv = weights_.add(matrix(blk(l, "attn_kv"), E, D));
      L.kv_norm = weights_.add(vector(blk(l, "attn_kv_a_norm"), D), D);
      L.out_a = weights_.add(matrix(blk(l, "attn_output_a"), H * D / G, OL * G));
      L.out_b = weights_.add(matrix(blk(l, "attn_output_b"), G * OL, E));
      L.sinks = weights_.add(vector(blk(l, "attn_sinks"), H), H);
      const int64_t r = c.compress_ratios[l];
      if (r > 0) {
        const int64_t cw = (r == 4 ? 2 : 1) * D;
        L.comp_kv = weights_.add(matrix(blk(l, "attn_compressor_kv"), E, cw));
        L.comp_gate = weights_.add(matrix(blk(l, "attn_compressor_gate"), E, cw));
        L.comp_ape = weights_.add(as_floats(tensor(blk(l, "attn_compressor_ape"), {cw, r})), cw * r);
        L.comp_norm = weights_.add(vector(blk(l, "attn_compressor_norm"), D), D);
      }
      if (r == 4) {
        L.ix_q_b = weights_.add(matrix("blk." + std::to_string(l) + ".indexer.attn_q_b.weight", QL, IH * ID));
        L.ix_proj = weights_.add(matrix("blk." + std::to_string(l) + ".indexer.proj.weight", E, IH));
        L.ix_kv = weights_.add(matrix(blk(l, "indexer_compressor_kv"), E, 2 * ID));
        L.ix_gate = weights_.add(matrix(blk(l, "indexer_compressor_gate"), E, 2 * ID));
        L.ix_ape = weights_.add(as_floats(tensor(blk(l, "indexer_compressor_ape"), {2 * ID, 4})), 2 * ID * 4);
        L.ix_norm = weights_.add(vector(blk(l, "indexer_compressor_norm"), ID), ID);
      }
      // The experts' clamps and, in the hash-routed blocks, each token id's experts.
      MoeWeights& m = ffn_[l].moe;
      m.swiglu_limit = c.swiglu_limits[l];
      m.shared_swiglu_limit = c.shared_swiglu_limits[l];
      if (l < c.n_hash_layers) {
        const gguf::TensorInfo& t = tensor(blk(l, "ffn_gate_tid2eid"), {c.n_expert_used, c.n_vocab}, true);
        const auto* ids = reinterpret_cast<const int32_t*>(t.data);
        for (int64_t i = 0; i < c.n_expert_used * c.n_vocab; ++i)
          if (ids[i] < 0 || ids[i] >= c.n_expert)
            fail("{}: tensor '{}' names expert {} (the model has {})", file_->path(), t.name, ids[i], c.n_expert);
        m.hash_ids = ids;
      }
    }
  }

 protected:
  LayerCache cache_layer(int64_t layer) const override {
    const ModelConfig& c = config_;
    const int64_t r = c.compress_ratios[layer];
    LayerCache lc{.recurrent = ring_rows() * c.head_dim_k};
    if (r == 0) return lc;
    lc.recurrent += compressor(layer, false, nullptr).state_floats();
    if (r == 4) lc.recurrent += compressor(layer, true, nullptr).state_floats();
    lc.block_ratio = r;
    lc.block_width = c.head_dim_k + (r == 4 ? c.indexer_dim : 0);
    return lc;
  }

  // The RoPE tables of the batch besides the pass's own (config().rope at each row's position: the window layers'
  // forwards): per row, the window layers' backwards (the de-rope) and the compressed layers' both ways; per sequence,
  // the starts of the blocks it completes, per ratio.
  void begin_batch(Pass& pass) override {
    const ModelConfig& c = config_;
    const int64_t R = c.rope.n_dims;
    int64_t n = 0, n4 = 0, n128 = 0;
    for (const PassSequence& sq : pass.sequences) {
      n += sq.n;
      n4 += (sq.pos0 + sq.n) / 4 - sq.pos0 / 4;
      n128 += (sq.pos0 + sq.n) / 128 - sq.pos0 / 128;
    }
    host_tables_.resize(static_cast<size_t>((3 * n + n4 + n128) * R));
    auto table = [&](float* t, const cpu::RopeParams& p, int64_t first, int64_t step, int64_t count, bool back) {
      for (int64_t i = 0; i < count; ++i) {
        float* row = t + i * R;
        cpu::rope_cache(p, (first + i) * step, row);
        if (back)
          for (int64_t j = 1; j < R; j += 2) row[j] = -row[j];
      }
    };
    // [raw_back | comp | comp_back] of n rows each, then every sequence's blocks of 4, then its blocks of 128.
    float* const t = host_tables_.data();
    int64_t at4 = 3 * n, at128 = 3 * n + n4;
    block_rows_.clear();
    for (const PassSequence& sq : pass.sequences) {
      table(t + sq.row0 * R, c.rope, sq.pos0, 1, sq.n, true);
      table(t + (n + sq.row0) * R, c.compress_rope, sq.pos0, 1, sq.n, false);
      table(t + (2 * n + sq.row0) * R, c.compress_rope, sq.pos0, 1, sq.n, true);
      const int64_t b4 = sq.pos0 / 4, c4 = (sq.pos0 + sq.n) / 4 - b4;
      const int64_t b128 = sq.pos0 / 128, c128 = (sq.pos0 + sq.n) / 128 - b128;
      table(t + at4 * R, c.compress_rope, b4, 4, c4, false);
      table(t + at128 * R, c.compress_rope, b128, 128, c128, false);
      block_rows_.push_back({at4, at128});
      at4 += c4;
      at128 += c128;
    }
    float* dev = pass.scratch(kTablesSlot, host_tables_.size());
    pass.from_host(host_tables_.data(), host_tables_.size(), dev);
    device_tables_ = dev;
    n_rows_ = n;
  }

  // Sequence i's tables: each row's entries from its first row, its blocks'.
  struct Tables {
    const float* raw = nullptr;  // [n][R] each (the pass's own table)
    const float* raw_back = nullptr;
    const float* comp = nullptr;
    const float* comp_back = nullptr;
    const float* blocks4 = nullptr;    // [blocks of 4 the sequence completes][R]
    const float* blocks128 = nullptr;  // [blocks of 128][R]
  };
  Tables tables(const Pass& pass, size_t i) const {
    const PassSequence& sq = pass.sequences[i];
    const int64_t R = config_.rope.n_dims, at = sq.row0 * R;
    return {.raw = pass.rope_table + at,
            .raw_back = device_tables_ + at,
            .comp = device_tables_ + n_rows_ * R + at,
            .comp_back = device_tables_ + 2 * n_rows_ * R + at,
            .blocks4 = device_tables_ + block_rows_[i].first * R,
            .blocks128 = device_tables_ + block_rows_[i].second * R};
  }

  void attention(Pass& pass, int64_t layer, const float* x, int64_t n, float* out) override {
    const ModelConfig& c = config_;
    const Layer& L = layers_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t H = c.n_head, D = c.head_dim_k, R = c.rope.n_dims, QL = c.q_lora_rank, G = c.out_groups;
    const int64_t OL = c.out_lora_rank, r = c.compress_ratios[layer];
    const size_t slot = Pass::kAttentionSlots;
    float* qr = pass.scratch(slot, n * QL);
    float* q = pass.scratch(slot + 1, n * H * D);
    float* kv = pass.scratch(slot + 2, n * D);
    float* heads = pass.scratch(slot + 3, n * H * D);
    float* oa = pass.scratch(slot + 4, n * G * OL);
    const Tables all = tables(pass, 0);  // the first sequence's rows are the batch's first
    const float* rope_fwd = r == 0 ? all.raw : all.comp;
    const float* rope_back = r == 0 ? all.raw_back : all.comp_back;

    // q: the LoRA, each head normalised without weight, roped; kv: one head, normalised, roped.
    d.matmul(s, pass.matrix(L.q_a), x, n, qr);
    d.rms_norm(s, qr, QL, pass.vector(L.q_a_norm), n, QL, c.rms_eps, qr, QL);
    d.matmul(s, pass.matrix(L.q_b), qr, n, q);
    d.rms_norm(s, q, D, nullptr, n * H, D, c.rms_eps, q, D);
    d.rope(s, rope_fwd, q + D - R, n, H, H * D, D, static_cast<int>(R), false);
    d.matmul(s, pass.matrix(L.kv), x, n, kv);
    d.rms_norm(s, kv, D, pass.vector(L.kv_norm), n, D, c.rms_eps, kv, D);
    d.rope(s, rope_fwd, kv + D - R, n, 1, D, D, static_cast<int>(R), false);

    const int64_t rows = ring_rows();
    const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                    .n_head_kv = 1,
                                    .head_dim_k = static_cast<int>(D),
                                    .head_dim_v = static_cast<int>(D),
                                    .scale = c.kq_scale,
                                    .sinks = pass.vector(L.sinks),
                                    .window = c.sliding_window};
    for (size_t i = 0; i < pass.sequences.size(); ++i) {
      const PassSequence& sq = pass.sequences[i];
      KvCache& cache = *sq.cache;
      const Tables t = tables(pass, i);
      const float* sx = x + sq.row0 * c.n_embd;
      // The compressor's new blocks (and the indexer's keys and choice): before the attention reads them.
      float* state = cache.recurrent(layer) + ring_rows() * D;
      const int32_t* chosen = nullptr;
      if (r > 0) {
        compress_blocks(pass, t, layer, false, sx, sq.n, sq.pos0, cache, state);
        if (r == 4) {
          compress_blocks(pass, t, layer, true, sx, sq.n, sq.pos0, cache,
                          state + compressor(layer, false, nullptr).state_floats());
          chosen = select_blocks(pass, t, layer, sx, qr + sq.row0 * QL, sq.n, sq.pos0, cache);
        }
      }
      // The raw keys into the window's ring and the attention, a chunk of queries at a time (the ring holds the
      // window and one chunk).
      float* ring = cache.recurrent(layer);
      const LayerCache lc = cache.layer(layer);
      for (int64_t a = 0; a < sq.n; a += kChunk) {
        const int64_t m = std::min(kChunk, sq.n - a), row0 = sq.row0 + a;
        for (int64_t j = 0; j < m;) {  // contiguous runs of ring rows
          const int64_t row = (sq.pos0 + a + j) % rows, run = std::min(m - j, rows - row);
          d.copy_rows(s, kv + (row0 + j) * D, D, run, D, ring + row * D, D);
          j += run;
        }
        cpu::AttentionInput in{.q = q + row0 * H * D,
                               .q_token_stride = H * D,
                               .q_head_stride = D,
                               .k = ring,
                               .k_stride = D,
                               .v = ring,
                               .v_stride = D,
                               .ring = rows};
        if (r > 0) {
          in.compressed = cache.block(layer, 0);
          in.compressed_stride = lc.block_width;
          in.ratio = r;
          in.chosen = chosen ? chosen + a * c.indexer_top_k : nullptr;
          in.chosen_per_query = chosen ? c.indexer_top_k : 0;
        }
        d.attention(s, shape, in, m, sq.pos0 + a, heads + row0 * H * D);
      }
    }
    // De-rope at the query's position, then the grouped output LoRA: group g's heads through its OL rows of
    // attn_output_a, the groups' results side by side through attn_output_b.
    d.rope(s, rope_back, heads + D - R, n, H, H * D, D, static_cast<int>(R), false);
    const cpu::HeadsLayout groups{.n_heads = G,
                                  .x_token_stride = H * D,
                                  .x_head_stride = H * D / G,
                                  .y_token_stride = G * OL,
                                  .y_head_stride = OL};
    d.matmul_heads(s, pass.matrix(L.out_a), groups, heads, n, oa);
    d.matmul(s, pass.matrix(L.out_b), oa, n, out);
  }

 private:
  // Queries per attention call: the window's ring holds sliding_window - 1 + kChunk raw keys.
  static constexpr int64_t kChunk = 64;
  static constexpr size_t kTablesSlot = Pass::kAttentionSlots + 12;
  int64_t ring_rows() const { return config_.sliding_window - 1 + kChunk; }

  // The layer's KV compressor, or its indexer's (ape: device memory of the pass, or null for sizes only).
  cpu::Compressor compressor(int64_t layer, bool indexer, const Pass* pass) const {
    const ModelConfig& c = config_;
    const int64_t r = c.compress_ratios[layer];
    const Layer& L = layers_[layer];
    const PassWeights::Handle ape = indexer ? L.ix_ape : L.comp_ape;
    return {.width = indexer ? c.indexer_dim : c.head_dim_k,
            .ratio = r,
            .overlap = r == 4,
            .ape = pass ? pass->vector(ape) : nullptr};
  }

  // The compressed entries of the blocks the batch completes: pooled by the compressor, normalised, roped at the
  // block's start, the indexer's rotated by the Hadamard matrix; into the layer's block entries (the indexer's after
  // the key's D floats).
  void compress_blocks(Pass& pass, const Tables& tables, int64_t layer, bool indexer, const float* x, int64_t n,
                       int64_t pos0, KvCache& cache, float* state) {
    const ModelConfig& c = config_;
    const Layer& L = layers_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const cpu::Compressor comp = compressor(layer, indexer, &pass);
    const int64_t W = comp.width, rw = comp.row_width(), R = c.rope.n_dims;
    const int64_t b0 = comp.first_block(pos0), nb = comp.end_block(pos0 + n) - b0;
    const size_t slot = Pass::kAttentionSlots + (indexer ? 7 : 5);
    float* rows = pass.scratch(slot, n * 2 * rw);  // per token [kv | score]
    float* entries = pass.scratch(slot + 1, std::max<int64_t>(2 * nb * W, 1));
    d.matmul(s, pass.matrix(indexer ? L.ix_kv : L.comp_kv), x, c.n_embd, n, rows, 2 * rw);
    d.matmul(s, pass.matrix(indexer ? L.ix_gate : L.comp_gate), x, c.n_embd, n, rows + rw, 2 * rw);
    d.compress(s, comp, rows, rows + rw, 2 * rw, n, pos0, state, entries);
    if (nb == 0) return;
    d.rms_norm(s, entries, W, pass.vector(indexer ? L.ix_norm : L.comp_norm), nb, W, c.rms_eps, entries, W);
    d.rope(s, comp.ratio == 4 ? tables.blocks4 : tables.blocks128, entries + W - R, nb, 1, W, W, static_cast<int>(R),
           false);
    const int64_t width = cache.layer(layer).block_width;
    if (!indexer) return d.copy_rows(s, entries, W, nb, W, cache.block(layer, b0), width);
    float* rotated = entries + nb * W;
    d.matmul(s, pass.matrix(hadamard_), entries, nb, rotated);
    d.copy_rows(s, rotated, W, nb, W, cache.block(layer, b0) + c.head_dim_k, width);
  }

  // The lightning indexer's choice of compressed blocks for each query [n][top_k] (-1 after the last), in the pass's
  // memory: queries from the q latent (roped with the compressed layers' RoPE, rotated), weights indexer.proj . x.
  const int32_t* select_blocks(Pass& pass, const Tables& tables, int64_t layer, const float* x, const float* qr,
                               int64_t n, int64_t pos0, KvCache& cache) {
    const ModelConfig& c = config_;
    const Layer& L = layers_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t IH = c.indexer_heads, ID = c.indexer_dim, R = c.rope.n_dims, K = c.indexer_top_k;
    const size_t slot = Pass::kAttentionSlots + 9;
    float* qi = pass.scratch(slot, 2 * n * IH * ID);
    float* rotated = qi + n * IH * ID;
    float* w = pass.scratch(slot + 1, n * IH);
    auto* selected = reinterpret_cast<int32_t*>(pass.scratch(slot + 2, n * K));
    d.matmul(s, pass.matrix(L.ix_q_b), qr, n, qi);
    d.rope(s, tables.comp, qi + ID - R, n, IH, IH * ID, ID, static_cast<int>(R), false);
    d.matmul(s, pass.matrix(hadamard_), qi, ID, n * IH, rotated, ID);
    d.matmul(s, pass.matrix(L.ix_proj), x, n, w);
    const cpu::IndexerInput in{.q = rotated,
                               .w = w,
                               .w_scale = 1.0f / std::sqrt(static_cast<float>(ID * IH)),
                               .k = cache.block(layer, 0) + c.head_dim_k,
                               .k_stride = cache.layer(layer).block_width,
                               .n_head = static_cast<int>(IH),
                               .dim = static_cast<int>(ID),
                               .top_k = K,
                               .ratio = 4};
    d.indexer_select(s, in, n, pos0, selected);
    if (trace_ && d.is_host()) trace_->ids(layer, "indexer_topk", selected, n, K);
    if (selection_override_ && d.is_host()) selection_override_->reselect(layer, n, K, selected);
    return selected;
  }

  std::vector<Layer> layers_;
  std::vector<float> hadamard_values_;  // [indexer_dim][indexer_dim]
  PassWeights::Handle hadamard_ = 0;
  std::vector<float> host_tables_;
  const float* device_tables_ = nullptr;                 // host_tables_ in the pass's memory
  int64_t n_rows_ = 0;                                   // the batch's rows
  std::vector<std::pair<int64_t, int64_t>> block_rows_;  // per sequence: its first rows of blocks4 and blocks128
};

}  // namespace

extern const ArchSpec deepseek4_arch{
    .name = "deepseek4",
    .configure = configure,
    .make = [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) -> std::unique_ptr<Model> {
      return std::make_unique<DeepSeek4>(std::move(file), std::move(config), n_threads);
    },
};

}  // namespace hetmoe::model
