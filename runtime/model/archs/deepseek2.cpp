// DeepSeek-V2/V2-Lite/V2.5/V3/R1 and Kimi-K2 (GGUF arch "deepseek2"): multi-head latent attention (MLA) with an
// optional low-rank query, leading dense blocks, routed plus shared experts. DeepSeek-V3.2 (arch "deepseek32") is
// the same model plus its lightning indexer, so both are defined here.
#include <algorithm>
#include <cmath>

#include "cpu_kernels/ops.h"
#include "runtime/error.h"
#include "runtime/model/archs.h"
#include "runtime/model/model.h"

namespace hetmoe::model {
namespace {

// expert_feed_forward_length may be a scalar or one value per layer (all equal in known files).
int64_t expert_ff(const ConfigKeys& k) {
  const gguf::Value* v = k.find("expert_feed_forward_length");
  if (!v) return 0;
  if (!v->is_array()) return k.req_int("expert_feed_forward_length");
  int64_t ff = 0;
  for (size_t i = 0; i < v->array_size(); ++i) {
    int64_t x = v->array_int(i).value_or(0);
    if (x > 0 && ff > 0 && x != ff) k.bad("expert_feed_forward_length", x, "differs between layers");
    if (x > 0) ff = x;
  }
  return ff;
}

// The MLA, expert and routing keys, and YaRN as llama.cpp's deepseek2 loader applies it.
void configure(const ConfigKeys& k, ModelConfig& c) {
  c.n_expert_shared = k.req_int("expert_shared_count");
  c.n_leading_dense = k.opt_int("leading_dense_block_count", 0);
  c.n_ff_exp = expert_ff(k);
  c.q_lora_rank = k.opt_int("attention.q_lora_rank", 0);
  c.kv_lora_rank = k.req_int("attention.kv_lora_rank");
  c.qk_rope = c.rope.n_dims;
  const int64_t key_mla = k.opt_int("attention.key_length_mla", 0);
  const int64_t value_mla = k.opt_int("attention.value_length_mla", 0);
  if (key_mla > 0 && value_mla > 0) {
    c.qk_nope = key_mla - c.qk_rope;
    c.v_head = value_mla;
  } else {  // legacy files: key_length is nope + rope per head, value_length is v_head
    c.qk_nope = c.head_dim_k - c.qk_rope;
    c.v_head = c.head_dim_v;
  }
  k.check_positive("attention.kv_lora_rank", c.kv_lora_rank, ConfigKeys::kMaxDim);
  if (c.qk_nope <= 0 || c.qk_nope > ConfigKeys::kMaxDim)
    k.bad(key_mla > 0 ? "attention.key_length_mla" : "attention.key_length", c.qk_nope + c.qk_rope,
          fmt::format("leaves {} dims per head beside the rope's {}", c.qk_nope, c.qk_rope));
  k.check_positive(value_mla > 0 ? "attention.value_length_mla" : "attention.value_length", c.v_head,
                   ConfigKeys::kMaxDim);
  read_expert_routing(k, c, Gating::kSoftmax);

  // YaRN as llama.cpp's deepseek2 loader applies it: beta 32/1 whatever the file says, ext_factor 1, the
  // rope magnitude kept at 1 and the whole YaRN magnitude moved into the softmax scale.
  float factor = 1.0f;
  if (k.opt_string("rope.scaling.type").value_or("none") == "yarn")
    factor = static_cast<float>(k.opt_float("rope.scaling.factor", 1.0));
  if (!(factor >= 1.0f && factor < 1e6f)) k.bad("rope.scaling.factor", factor, "is out of range (1..1e6)");
  const float freq_scale = 1.0f / factor;
  const double log_mul_value = k.opt_float("rope.scaling.yarn_log_multiplier", 0.0);
  if (!(std::fabs(log_mul_value) <= 100.0))  // DeepSeek's files hold 0.1; far beyond it the attention scale overflows
    k.bad("rope.scaling.yarn_log_multiplier", static_cast<float>(log_mul_value), "is out of range (-100..100)");
  const auto log_mul = static_cast<float>(log_mul_value);
  c.rope.freq_scale = freq_scale;
  c.rope.ext_factor = factor > 1.0f ? 1.0f : 0.0f;
  c.rope.n_ctx_orig = static_cast<int>(k.opt_int("rope.scaling.original_context_length", c.n_ctx_train));
  c.rope.beta_fast = 32.0f;
  c.rope.beta_slow = 1.0f;
  // ggml multiplies sin/cos by (1 + 0.1 ln factor) under YaRN; this attn_factor cancels it.
  c.rope.attn_factor = 1.0f / (1.0f + 0.1f * std::log(1.0f / freq_scale));
  const float mscale = 1.0f + log_mul * std::log(1.0f / freq_scale);
  c.kq_scale = mscale * mscale / std::sqrt(static_cast<float>(c.qk_nope + c.qk_rope));
}

// One layer's attention weights, as handles of the pass's weights.
struct MlaLayer {
  bool q_lora = false;
  int64_t q_rank = 0;
  PassWeights::Handle q = 0;          // [H * (nope + rope), E] without q LoRA
  PassWeights::Handle q_a = 0;        // [q_lora, E]
  PassWeights::Handle q_a_norm = 0;   // [q_lora]
  PassWeights::Handle q_b = 0;        // [H * (nope + rope), q_lora]
  PassWeights::Handle kv_a = 0;       // [kv_lora + rope, E]
  PassWeights::Handle kv_a_norm = 0;  // [kv_lora]
  PassWeights::Handle k_b = 0;        // [H * kv_lora, nope]: per head, q_nope -> latent space
  PassWeights::Handle v_b = 0;        // [H * v_head, kv_lora]: per head, latent -> value
  PassWeights::Handle kv_b = 0;       // legacy [H * (nope + v_head), kv_lora]
  PassWeights::Handle out = 0;        // [E, H * v_head]
  // DeepSeek-V3.2's indexer: q from the q LoRA latent, one key head from x (LayerNorm with weight and bias), the
  // heads' weights from x.
  PassWeights::Handle ix_q = 0;       // [Hi * Di, q_lora]
  PassWeights::Handle ix_k = 0;       // [Di, E]
  PassWeights::Handle ix_norm_w = 0;  // [Di]
  PassWeights::Handle ix_norm_b = 0;  // [Di]
  PassWeights::Handle ix_proj = 0;    // [Hi, E]
};

class Deepseek2 final : public Model {
 public:
  Deepseek2(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads)
      : Model(std::move(file), std::move(config), n_threads) {
    bind_common();
    const ModelConfig& c = config_;
    const int64_t E = c.n_embd, H = c.n_head, nope = c.qk_nope, rope = c.qk_rope, kvl = c.kv_lora_rank;
    const int64_t vh = c.v_head, qk = nope + rope;
    if (c.n_head_kv != 1 && !file_->find_tensor(blk(0, "attn_kv_b")))
      fail("{}: {}.attention.head_count_kv = {}: MLA files have 1 (or the old attn_kv_b)", file_->path(), c.arch_name,
           c.n_head_kv);
    // The current converter splits kv_b into attn_k_b/attn_v_b (absorbed MLA, latent cache); older files carry
    // the fused attn_kv_b and cache full per-head keys and values instead.
    absorbed_ = file_->find_tensor(blk(0, "attn_k_b")) != nullptr;
    layers_.resize(c.n_layer + c.n_mtp);
    for (int64_t l = 0; l < c.n_layer + c.n_mtp; ++l) {
      weights_.host_only(l >= c.n_layer);  // the MTP block runs on the host pass only
      MlaLayer& L = layers_[l];
      L.q_lora = file_->find_tensor(blk(l, "attn_q")) == nullptr;
      if (L.q_lora) {
        const gguf::TensorInfo* qa_info = file_->find_tensor(blk(l, "attn_q_a"));
        if (!qa_info) fail("{}: missing tensor '{}' (or attn_q_a/attn_q_b)", file_->path(), blk(l, "attn_q"));
        const int64_t rank = qa_info->ne[1];
        const gguf::TensorInfo& qa = tensor(blk(l, "attn_q_a"), {E, rank});
        if (c.q_lora_rank > 0 && rank != c.q_lora_rank)
          fail("{}: tensor '{}' has rank {}, but q_lora_rank is {}", file_->path(), qa.name, rank, c.q_lora_rank);
        L.q_rank = rank;
        L.q_a = weights_.add(as_matrix(qa));
        L.q_a_norm = weights_.add(vector(blk(l, "attn_q_a_norm"), rank), rank);
        L.q_b = weights_.add(matrix(blk(l, "attn_q_b"), rank, H * qk));
      } else {
        L.q = weights_.add(matrix(blk(l, "attn_q"), E, H * qk));
      }
      L.kv_a = weights_.add(matrix(blk(l, "attn_kv_a_mqa"), E, kvl + rope));
      L.kv_a_norm = weights_.add(vector(blk(l, "attn_kv_a_norm"), kvl), kvl);
      if (absorbed_) {
        L.k_b = weights_.add(as_matrix(tensor(blk(l, "attn_k_b"), {nope, kvl, H})));
        L.v_b = weights_.add(as_matrix(tensor(blk(l, "attn_v_b"), {kvl, vh, H})));
      } else {
        L.kv_b = weights_.add(matrix(blk(l, "attn_kv_b"), kvl, H * (nope + vh)));
      }
      L.out = weights_.add(matrix(blk(l, "attn_output"), H * vh, E));
      if (c.indexer_heads > 0) {
        if (!L.q_lora || !absorbed_)
          fail("{}: the indexer needs the q LoRA and the split attn_k_b/attn_v_b (block {})", file_->path(), l);
        const int64_t Hi = c.indexer_heads, Di = c.indexer_dim;
        L.ix_q = weights_.add(matrix(blk(l, "indexer.attn_q_b"), L.q_rank, Hi * Di));
        L.ix_k = weights_.add(matrix(blk(l, "indexer.attn_k"), E, Di));
        L.ix_norm_w = weights_.add(vector(blk(l, "indexer.k_norm"), Di), Di);
        L.ix_norm_b = weights_.add(vector(blk(l, "indexer.k_norm", "bias"), Di), Di);
        L.ix_proj = weights_.add(matrix(blk(l, "indexer.proj"), E, Hi));
      }
    }
    weights_.host_only(false);
  }

 protected:
  // The absorbed layout caches no values; DeepSeek-V3.2 keeps its indexer keys in that room.
  LayerCache cache_layer(int64_t) const override {
    const ModelConfig& c = config_;
    return {.k_width = absorbed_ ? c.kv_lora_rank + c.qk_rope : c.n_head * (c.qk_nope + c.qk_rope),
            .v_width = absorbed_ ? c.indexer_dim : c.n_head * c.v_head};
  }

  void attention(Pass& pass, int64_t layer, const float* x, int64_t n, float* out) override {
    const ModelConfig& c = config_;
    const MlaLayer& L = layers_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t H = c.n_head, nope = c.qk_nope, rope = c.qk_rope, kvl = c.kv_lora_rank, vh = c.v_head;
    const int64_t qk = nope + rope, width = kvl + rope;
    const size_t slot = Pass::kAttentionSlots;
    // Queries: [n][H][nope | rope].
    float* q = pass.scratch(slot, n * H * qk);
    const int32_t* selected = nullptr;
    // Compressed key/value: [n][kv_lora | rope]; only the latent part is normalised, k_pe is shared by all heads.
    // The projections of x (q or q_a, and kv_a) in one call.
    float* kv = pass.scratch(slot + 2, n * width);
    if (L.q_lora) {
      float* qa = pass.scratch(slot + 1, n * L.q_rank);
      const device::Device::MatmulOutput outs[] = {{pass.matrix(L.q_a), qa}, {pass.matrix(L.kv_a), kv}};
      d.matmuls(s, outs, x, n);
      d.rms_norm(s, qa, L.q_rank, pass.vector(L.q_a_norm), n, L.q_rank, c.rms_eps, qa, L.q_rank);
      d.matmul(s, pass.matrix(L.q_b), qa, n, q);
      if (L.ix_q) selected = select_keys(pass, layer, x, qa, n);
    } else {
      const device::Device::MatmulOutput outs[] = {{pass.matrix(L.q), q}, {pass.matrix(L.kv_a), kv}};
      d.matmuls(s, outs, x, n);
    }
    d.rms_norm(s, kv, width, pass.vector(L.kv_a_norm), n, kvl, c.rms_eps, kv, width);
    d.rope(s, pass.rope_table, kv + kvl, n, 1, width, 0, c.rope.n_dims, c.rope.neox);
    d.rope(s, pass.rope_table, q + nope, n, H, H * qk, qk, c.rope.n_dims, c.rope.neox);
    float* heads = pass.scratch(slot + 3, n * H * vh);
    if (absorbed_) {
      // The latent cache holds [kv_lora | k_pe] per position. Each head's q_nope is mapped into latent space by
      // attn_k_b, so keys never need decompressing; the attention output is mapped back per head by attn_v_b.
      // Each head's query in latent space beside its rotated part: [n][H][kv_lora | rope].
      float* q_lat = pass.scratch(slot + 4, n * H * width);
      d.copy_rows(s, q + nope, qk, n * H, rope, q_lat + kvl, width);
      d.matmul_heads(s, pass.matrix(L.k_b),
                     {.n_heads = H,
                      .x_token_stride = H * qk,
                      .x_head_stride = qk,
                      .y_token_stride = H * width,
                      .y_head_stride = width},
                     q, n, q_lat);
      float* lat = pass.scratch(slot + 5, n * H * kvl);
      const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                      .n_head_kv = 1,
                                      .head_dim_k = static_cast<int>(width),
                                      .head_dim_v = static_cast<int>(kvl),
                                      .scale = c.kq_scale,
                                      .keys = selected,
                                      .keys_per_query = selected ? c.indexer_top_k : 0};
      for (const PassSequence& sq : pass.sequences) {  // each sequence's latent rows into its cache, its queries
        KvCache& cache = *sq.cache;
        d.copy_rows(s, kv + sq.row0 * width, width, sq.n, width, cache.k(layer, sq.pos0), width);
        cpu::AttentionShape seq_shape = shape;
        if (selected) seq_shape.keys = selected + sq.row0 * c.indexer_top_k;
        d.attention(s, seq_shape,
                    {q_lat + sq.row0 * H * width, H * width, width, cache.k(layer, 0), width, cache.k(layer, 0), width},
                    sq.n, sq.pos0, lat + sq.row0 * H * kvl);
      }
      d.matmul_heads(s, pass.matrix(L.v_b),
                     {.n_heads = H,
                      .x_token_stride = H * kvl,
                      .x_head_stride = kvl,
                      .y_token_stride = H * vh,
                      .y_head_stride = vh},
                     lat, n, heads);
    } else {
      // Old files with a fused attn_kv_b: keys and values decompressed per head and cached like plain MHA,
      // k = [k_nope | k_pe (shared by the heads)], v.
      float* kvb = pass.scratch(slot + 4, n * H * (nope + vh));
      d.matmul(s, pass.matrix(L.kv_b), kv, width, n, kvb, H * (nope + vh));
      const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                      .n_head_kv = static_cast<int>(H),
                                      .head_dim_k = static_cast<int>(qk),
                                      .head_dim_v = static_cast<int>(vh),
                                      .scale = c.kq_scale};
      for (const PassSequence& sq : pass.sequences) {
        KvCache& cache = *sq.cache;
        const float* seq_kvb = kvb + sq.row0 * H * (nope + vh);
        const float* seq_kv = kv + sq.row0 * width;
        d.copy_rows(s, seq_kvb, nope + vh, sq.n * H, nope, cache.k(layer, sq.pos0), qk);
        for (int64_t h = 0; h < H; ++h)
          d.copy_rows(s, seq_kv + kvl, width, sq.n, rope, cache.k(layer, sq.pos0) + h * qk + nope, H * qk);
        d.copy_rows(s, seq_kvb + nope, nope + vh, sq.n * H, vh, cache.v(layer, sq.pos0), vh);
        d.attention(s, shape, {q + sq.row0 * H * qk, H * qk, qk, cache.k(layer, 0), H * qk, cache.v(layer, 0), H * vh},
                    sq.n, sq.pos0, heads + sq.row0 * H * vh);
      }
    }
    d.matmul(s, pass.matrix(L.out), heads, n, out);
  }

 private:
  // DeepSeek-V3.2's lightning indexer: this layer's indexer keys for the new positions into the cache's value room,
  // then each query's top-k key positions (the MLA attends to those only). x: the normalised block input; qa: the
  // normalised q LoRA latent. Both q and k are roped on their first rope dims (NEOX), head layout [rope | nope].
  // llama.cpp also multiplies both by a Walsh-Hadamard matrix; being orthonormal and applied to both, it leaves
  // q . k unchanged, so it is left out.
  const int32_t* select_keys(Pass& pass, int64_t layer, const float* x, const float* qa, int64_t n) {
    const ModelConfig& c = config_;
    const MlaLayer& L = layers_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t Hi = c.indexer_heads, Di = c.indexer_dim;
    const size_t slot = Pass::kAttentionSlots + 6;
    float* k = pass.scratch(slot, n * Di);
    d.matmul(s, pass.matrix(L.ix_k), x, n, k);
    d.layer_norm(s, k, Di, pass.vector(L.ix_norm_w), pass.vector(L.ix_norm_b), n, Di, 1e-6f, k, Di);
    d.rope(s, pass.rope_table, k, n, 1, Di, 0, c.rope.n_dims, true);
    float* q = pass.scratch(slot + 1, n * Hi * Di);
    d.matmul(s, pass.matrix(L.ix_q), qa, n, q);
    d.rope(s, pass.rope_table, q, n, Hi, Hi * Di, Di, c.rope.n_dims, true);
    float* w = pass.scratch(slot + 2, n * Hi);
    d.matmul(s, pass.matrix(L.ix_proj), x, n, w);
    auto* selected = reinterpret_cast<int32_t*>(pass.scratch(slot + 3, n * c.indexer_top_k));
    for (const PassSequence& sq : pass.sequences) {  // each sequence's keys into its cache, its queries over them
      KvCache& cache = *sq.cache;
      d.copy_rows(s, k + sq.row0 * Di, Di, sq.n, Di, cache.v(layer, sq.pos0), Di);
      const cpu::IndexerInput in{.q = q + sq.row0 * Hi * Di,
                                 .w = w + sq.row0 * Hi,
                                 .w_scale = 1.0f / std::sqrt(static_cast<float>(Di * Hi)),
                                 .k = cache.v(layer, 0),
                                 .k_stride = Di,
                                 .n_head = static_cast<int>(Hi),
                                 .dim = static_cast<int>(Di),
                                 .top_k = c.indexer_top_k};
      d.indexer_select(s, in, sq.n, sq.pos0, selected + sq.row0 * c.indexer_top_k);
    }
    if (trace_ && d.is_host()) trace_->ids(layer, "indexer_topk", selected, n, c.indexer_top_k);
    if (selection_override_ && d.is_host()) selection_override_->reselect(layer, n, c.indexer_top_k, selected);
    return selected;
  }

  bool absorbed_ = true;
  std::vector<MlaLayer> layers_;
};

// DeepSeek-V3.2 (GGUF arch "deepseek32"): deepseek2's V3 layout plus the lightning indexer (the MLA of each query
// restricted to its top-k key positions), with the MTP block at the end (drafts).
void configure_deepseek32(const ConfigKeys& k, ModelConfig& c) {
  configure(k, c);
  drop_mtp_blocks(k, c, true);
  k.req_int("attention.q_lora_rank");
  k.req_int("expert_gating_func");
  c.indexer_heads = k.req_int("attention.indexer.head_count");
  c.indexer_dim = k.req_int("attention.indexer.key_length");
  c.indexer_top_k = k.req_int("attention.indexer.top_k");
  k.check_positive("attention.indexer.head_count", c.indexer_heads, 4096);
  k.check_positive("attention.indexer.key_length", c.indexer_dim, ConfigKeys::kMaxDim);
  k.check_positive("attention.indexer.top_k", c.indexer_top_k, ConfigKeys::kMaxDim);
  if (c.rope.n_dims > c.indexer_dim)
    k.bad("attention.indexer.key_length", c.indexer_dim,
          fmt::format("is smaller than {} = {}", k.key("rope.dimension_count"), c.rope.n_dims));
}

// DeepSeek-V3/R1 as llama.cpp's converter writes them carry no MTP block; a file that keeps it (block_count counting
// it, nextn_predict_layers, the block's nextn.* tensors) has it bound for drafts.
void configure_deepseek2(const ConfigKeys& k, ModelConfig& c) {
  configure(k, c);
  const int64_t nextn = k.opt_int("nextn_predict_layers", 0);
  if (nextn > 0 && nextn < c.n_layer &&
      k.file().find_tensor("blk." + std::to_string(c.n_layer - nextn) + ".nextn.eh_proj.weight"))
    drop_mtp_blocks(k, c, true);
}

}  // namespace

extern const ArchSpec deepseek32_arch{
    .name = "deepseek32",
    .configure = configure_deepseek32,
    .make = [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) -> std::unique_ptr<Model> {
      return std::make_unique<Deepseek2>(std::move(file), std::move(config), n_threads);
    },
};

extern const ArchSpec deepseek2_arch{
    .name = "deepseek2",
    .configure = configure_deepseek2,
    .make = [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) -> std::unique_ptr<Model> {
      return std::make_unique<Deepseek2>(std::move(file), std::move(config), n_threads);
    },
};

}  // namespace hetmoe::model
