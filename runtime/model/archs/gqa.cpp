#include "runtime/model/archs/gqa.h"

#include <algorithm>

#include "cpu_kernels/ops.h"

namespace hetmoe::model {
namespace {

// One layer's attention weights, as handles of the pass's weights.
struct GqaLayer {
  PassWeights::Handle q = 0;                               // [H * D, E]
  PassWeights::Handle k = 0, v = 0;                        // [KV * D, E]
  PassWeights::Handle out = 0;                             // [E, H * Dv]
  PassWeights::Handle q_norm = 0;                          // [D] per head, or [H * D] over the projection; 0: none
  PassWeights::Handle k_norm = 0;                          // [D] or [KV * D]
  PassWeights::Handle q_bias = 0, k_bias = 0, v_bias = 0;  // qkv_bias only
  PassWeights::Handle out_bias = 0;                        // out_bias only
  PassWeights::Handle sinks = 0;                           // [H], sinks only
};

class GqaModel final : public Model {
 public:
  GqaModel(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads, GqaOptions options)
      : Model(std::move(file), std::move(config), n_threads), options_(options) {
    bind_common();
    const ModelConfig& c = config_;
    const int64_t E = c.n_embd, H = c.n_head, KV = c.n_head_kv, D = c.head_dim_k, Dv = c.head_dim_v;
    layers_.resize(c.n_layer + c.n_mtp);
    for (int64_t l = 0; l < c.n_layer + c.n_mtp; ++l) {
      weights_.host_only(l >= c.n_layer);  // the MTP block runs on the host pass only
      GqaLayer& L = layers_[l];
      L.q = weights_.add(matrix(blk(l, "attn_q"), E, H * D));
      L.k = weights_.add(matrix(blk(l, "attn_k"), E, KV * D));
      L.v = weights_.add(matrix(blk(l, "attn_v"), E, KV * Dv));
      L.out = weights_.add(matrix(blk(l, "attn_output"), H * Dv, E));
      if (options_.qk_norm != QkNorm::kNone) {
        const bool whole = options_.qk_norm == QkNorm::kWholeProjection;
        const int64_t nq = whole ? H * D : D, nk = whole ? KV * D : D;
        const std::string qn = blk(l, "attn_q_norm"), kn = blk(l, "attn_k_norm");
        const float* q_norm = options_.qk_norm_optional ? optional_vector(qn, nq) : vector(qn, nq);
        if (q_norm) {
          L.q_norm = weights_.add(q_norm, nq);
          L.k_norm = weights_.add(vector(kn, nk), nk);
        }
      }
      if (options_.qkv_bias) {
        L.q_bias = weights_.add(vector(blk(l, "attn_q", "bias"), H * D), H * D);
        L.k_bias = weights_.add(vector(blk(l, "attn_k", "bias"), KV * D), KV * D);
        L.v_bias = weights_.add(vector(blk(l, "attn_v", "bias"), KV * Dv), KV * Dv);
      }
      if (options_.out_bias) L.out_bias = weights_.add(vector(blk(l, "attn_output", "bias"), E), E);
      if (options_.sinks) L.sinks = weights_.add(vector(blk(l, "attn_sinks"), H), H);
    }
    weights_.host_only(false);
  }

 protected:
  LayerCache cache_layer(int64_t) const override {
    return {.k_width = config_.n_head_kv * config_.head_dim_k, .v_width = config_.n_head_kv * config_.head_dim_v};
  }

  void attention(Pass& pass, int64_t layer, const float* x, int64_t n, float* out) override {
    const ModelConfig& c = config_;
    const GqaLayer& L = layers_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t H = c.n_head, KV = c.n_head_kv, D = c.head_dim_k, Dv = c.head_dim_v;
    const size_t slot = Pass::kAttentionSlots;
    float* q = pass.scratch(slot, n * H * D);
    float* k = pass.scratch(slot + 1, n * KV * D);
    float* v = pass.scratch(slot + 2, n * KV * Dv);
    float* heads = pass.scratch(slot + 3, n * H * Dv);
    const device::Device::MatmulOutput projections[] = {
        {pass.matrix(L.q), q}, {pass.matrix(L.k), k}, {pass.matrix(L.v), v}};
    d.matmuls(s, projections, x, n);
    if (L.q_bias) {
      d.add_bias(s, pass.vector(L.q_bias), H * D, n, q, H * D);
      d.add_bias(s, pass.vector(L.k_bias), KV * D, n, k, KV * D);
      d.add_bias(s, pass.vector(L.v_bias), KV * Dv, n, v, KV * Dv);
    }
    if (L.q_norm && options_.qk_norm == QkNorm::kPerHead) {  // each head's q and k normalised before the rope
      d.rms_norm(s, q, D, pass.vector(L.q_norm), n * H, D, c.rms_eps, q, D);
      d.rms_norm(s, k, D, pass.vector(L.k_norm), n * KV, D, c.rms_eps, k, D);
    } else if (L.q_norm) {  // one norm over all heads of a token
      d.rms_norm(s, q, H * D, pass.vector(L.q_norm), n, H * D, c.rms_eps, q, H * D);
      d.rms_norm(s, k, KV * D, pass.vector(L.k_norm), n, KV * D, c.rms_eps, k, KV * D);
    }
    d.rope(s, pass.rope_table, q, n, H, H * D, D, c.rope.n_dims, c.rope.neox);
    d.rope(s, pass.rope_table, k, n, KV, KV * D, D, c.rope.n_dims, c.rope.neox);
    const bool sliding = options_.swa_period > 0 && layer % options_.swa_period == 0;
    const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                    .n_head_kv = static_cast<int>(KV),
                                    .head_dim_k = static_cast<int>(D),
                                    .head_dim_v = static_cast<int>(Dv),
                                    .scale = c.kq_scale,
                                    .sinks = L.sinks ? pass.vector(L.sinks) : nullptr,
                                    .window = sliding ? c.sliding_window : 0};
    for (const PassSequence& sq : pass.sequences) {  // each sequence's keys into its cache, its queries over them
      KvCache& cache = *sq.cache;
      d.copy_rows(s, k + sq.row0 * KV * D, KV * D, sq.n, KV * D, cache.k(layer, sq.pos0), KV * D);
      d.copy_rows(s, v + sq.row0 * KV * Dv, KV * Dv, sq.n, KV * Dv, cache.v(layer, sq.pos0), KV * Dv);
      d.attention(s, shape, {q + sq.row0 * H * D, H * D, D, cache.k(layer, 0), KV * D, cache.v(layer, 0), KV * Dv},
                  sq.n, sq.pos0, heads + sq.row0 * H * Dv);
    }
    d.matmul(s, pass.matrix(L.out), heads, n, out);
    if (L.out_bias) d.add_bias(s, pass.vector(L.out_bias), c.n_embd, n, out, c.n_embd);
  }

 private:
  GqaOptions options_;
  std::vector<GqaLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_gqa_model(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads,
                                      GqaOptions options) {
  return std::make_unique<GqaModel>(std::move(file), std::move(config), n_threads, options);
}

}  // namespace hetmoe::model
