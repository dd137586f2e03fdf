#include "runtime/model/gqa.h"

#include <algorithm>

#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"

namespace hetmoe::model {
namespace {

struct GqaLayer {
  cpu::WeightMatrix q;            // [H * D, E]
  cpu::WeightMatrix k, v;         // [KV * D, E]
  cpu::WeightMatrix out;          // [E, H * Dv]
  const float* q_norm = nullptr;  // [D], qk_norm only
  const float* k_norm = nullptr;  // [D]
  // Handles of the same weights on the device (Model::attach_device).
  size_t q_dev = 0, k_dev = 0, v_dev = 0, out_dev = 0, q_norm_dev = 0, k_norm_dev = 0;
};

class GqaModel final : public Model {
 public:
  GqaModel(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads, GqaOptions options)
      : Model(std::move(file), std::move(config), n_threads), options_(options) {
    bind_common();
    const ModelConfig& c = config_;
    const int64_t E = c.n_embd, H = c.n_head, KV = c.n_head_kv, D = c.head_dim_k, Dv = c.head_dim_v;
    layers_.resize(c.n_layer);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      GqaLayer& L = layers_[l];
      L.q = matrix(blk(l, "attn_q"), E, H * D);
      L.k = matrix(blk(l, "attn_k"), E, KV * D);
      L.v = matrix(blk(l, "attn_v"), E, KV * Dv);
      L.out = matrix(blk(l, "attn_output"), H * Dv, E);
      if (options_.qk_norm) {
        L.q_norm = vector(blk(l, "attn_q_norm"), D);
        L.k_norm = vector(blk(l, "attn_k_norm"), D);
      }
    }
  }

 protected:
  int64_t cache_k_width() const override { return config_.n_head_kv * config_.head_dim_k; }
  int64_t cache_v_width() const override { return config_.n_head_kv * config_.head_dim_v; }

  void attention(int64_t layer, const float* x, int64_t n, int64_t pos0, KvCache& cache, float* out) override {
    const ModelConfig& c = config_;
    const GqaLayer& L = layers_[layer];
    const int64_t H = c.n_head, KV = c.n_head_kv, D = c.head_dim_k, Dv = c.head_dim_v;
    std::span<float> q = cpu::scratch<float, struct GqaQSite>(n * H * D);
    std::span<float> k = cpu::scratch<float, struct GqaKSite>(n * KV * D);
    std::span<float> v = cpu::scratch<float, struct GqaVSite>(n * KV * Dv);
    matmul(L.q, x, n, q.data(), H * D);
    matmul(L.k, x, n, k.data(), KV * D);
    matmul(L.v, x, n, v.data(), KV * Dv);
    std::span<float> cos_sin = cpu::scratch<float, struct GqaRopeSite>(c.rope.n_dims);
    for (int64_t t = 0; t < n; ++t) {
      cpu::rope_cache(c.rope, pos0 + t, cos_sin.data());
      for (int64_t h = 0; h < H; ++h) {
        float* qh = &q[(t * H + h) * D];
        if (L.q_norm) cpu::rms_norm(qh, L.q_norm, qh, D, c.rms_eps);
        cpu::rope_apply(c.rope, cos_sin.data(), qh);
      }
      for (int64_t h = 0; h < KV; ++h) {
        float* kh = &k[(t * KV + h) * D];
        if (L.k_norm) cpu::rms_norm(kh, L.k_norm, kh, D, c.rms_eps);
        cpu::rope_apply(c.rope, cos_sin.data(), kh);
      }
      std::copy_n(&k[t * KV * D], KV * D, cache.k(layer, pos0 + t));
      std::copy_n(&v[t * KV * Dv], KV * Dv, cache.v(layer, pos0 + t));
    }
    std::span<float> heads = cpu::scratch<float, struct GqaHeadsSite>(n * H * Dv);
    cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                              .n_head_kv = static_cast<int>(KV),
                              .head_dim_k = static_cast<int>(D),
                              .head_dim_v = static_cast<int>(Dv),
                              .scale = c.kq_scale};
    cpu::AttentionInput in{.q = q.data(),
                           .q_token_stride = H * D,
                           .q_head_stride = D,
                           .k = cache.k(layer, 0),
                           .k_stride = KV * D,
                           .v = cache.v(layer, 0),
                           .v_stride = KV * Dv};
    cpu::causal_attention(shape, in, n, pos0, heads.data(), pool());
    matmul(L.out, heads.data(), n, out, c.n_embd);
  }

  void plan_device_attention(DeviceWeights& w) override {
    const int64_t D = config_.head_dim_k;
    for (GqaLayer& L : layers_) {
      L.q_dev = w.add(L.q);
      L.k_dev = w.add(L.k);
      L.v_dev = w.add(L.v);
      L.out_dev = w.add(L.out);
      if (L.q_norm) {
        L.q_norm_dev = w.add(L.q_norm, D);
        L.k_norm_dev = w.add(L.k_norm, D);
      }
    }
    weights_ = &w;
  }

  // The steps of attention() above, as device ops.
  void device_attention(DevicePass& pass, int64_t layer, const float* x, int64_t n, int64_t pos0, KvCache& cache,
                        float* out) override {
    const ModelConfig& c = config_;
    const GqaLayer& L = layers_[layer];
    const DeviceWeights& w = *weights_;
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t H = c.n_head, KV = c.n_head_kv, D = c.head_dim_k, Dv = c.head_dim_v;
    const size_t slot = DevicePass::kAttentionSlots;
    float* q = pass.scratch(slot, n * H * D);
    float* k = pass.scratch(slot + 1, n * KV * D);
    float* v = pass.scratch(slot + 2, n * KV * Dv);
    float* heads = pass.scratch(slot + 3, n * H * Dv);
    d.matmul(s, w.matrix(L.q_dev), x, n, q);
    d.matmul(s, w.matrix(L.k_dev), x, n, k);
    d.matmul(s, w.matrix(L.v_dev), x, n, v);
    if (L.q_norm) {
      d.rms_norm(s, q, D, w.vector(L.q_norm_dev), n * H, D, c.rms_eps, q, D);
      d.rms_norm(s, k, D, w.vector(L.k_norm_dev), n * KV, D, c.rms_eps, k, D);
    }
    d.rope(s, pass.rope_table, q, n, H, H * D, D, c.rope.n_dims, c.rope.neox);
    d.rope(s, pass.rope_table, k, n, KV, KV * D, D, c.rope.n_dims, c.rope.neox);
    d.copy_rows(s, k, KV * D, n, KV * D, cache.k(layer, pos0), KV * D);
    d.copy_rows(s, v, KV * Dv, n, KV * Dv, cache.v(layer, pos0), KV * Dv);
    const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                    .n_head_kv = static_cast<int>(KV),
                                    .head_dim_k = static_cast<int>(D),
                                    .head_dim_v = static_cast<int>(Dv),
                                    .scale = c.kq_scale};
    d.attention(s, shape, {q, H * D, D, cache.k(layer, 0), KV * D, cache.v(layer, 0), KV * Dv}, n, pos0, heads);
    d.matmul(s, w.matrix(L.out_dev), heads, n, out);
  }

 private:
  GqaOptions options_;
  std::vector<GqaLayer> layers_;
  const DeviceWeights* weights_ = nullptr;  // where the device handles point
};

}  // namespace

std::unique_ptr<Model> make_gqa_model(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads,
                                      GqaOptions options) {
  return std::make_unique<GqaModel>(std::move(file), std::move(config), n_threads, options);
}

}  // namespace hetmoe::model
