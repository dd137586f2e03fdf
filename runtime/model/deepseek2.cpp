// DeepSeek-V2/V2-Lite/V2.5/V3/R1 and Kimi-K2 (GGUF arch "deepseek2"): multi-head latent attention (MLA) with an
// optional low-rank query, leading dense blocks, routed plus shared experts.
#include <algorithm>

#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"
#include "runtime/error.h"
#include "runtime/model/archs.h"

namespace hetmoe::model {
namespace {

struct MlaLayer {
  bool q_lora = false;
  cpu::WeightMatrix q;               // [H * (nope + rope), E] without q LoRA
  cpu::WeightMatrix q_a;             // [q_lora, E]
  const float* q_a_norm = nullptr;   // [q_lora]
  cpu::WeightMatrix q_b;             // [H * (nope + rope), q_lora]
  cpu::WeightMatrix kv_a;            // [kv_lora + rope, E]
  const float* kv_a_norm = nullptr;  // [kv_lora]
  cpu::WeightMatrix k_b;             // [H * kv_lora, nope]: per head, q_nope -> latent space
  cpu::WeightMatrix v_b;             // [H * v_head, kv_lora]: per head, latent -> value
  cpu::WeightMatrix kv_b;            // legacy [H * (nope + v_head), kv_lora]
  cpu::WeightMatrix out;             // [E, H * v_head]
  // Handles of the same weights on the device (Model::attach_device).
  size_t q_dev = 0, q_a_dev = 0, q_a_norm_dev = 0, q_b_dev = 0, kv_a_dev = 0, kv_a_norm_dev = 0, k_b_dev = 0,
         v_b_dev = 0, kv_b_dev = 0, out_dev = 0;
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
      fail("{}: deepseek2 expects head_count_kv = 1 for MLA, got {}", file_->path(), c.n_head_kv);
    // The current converter splits kv_b into attn_k_b/attn_v_b (absorbed MLA, latent cache); older files carry
    // the fused attn_kv_b and cache full per-head keys and values instead.
    absorbed_ = file_->find_tensor(blk(0, "attn_k_b")) != nullptr;
    layers_.resize(c.n_layer);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      MlaLayer& L = layers_[l];
      L.q_lora = file_->find_tensor(blk(l, "attn_q")) == nullptr;
      if (L.q_lora) {
        const gguf::TensorInfo* qa_info = file_->find_tensor(blk(l, "attn_q_a"));
        if (!qa_info) fail("{}: missing tensor '{}' (or attn_q_a/attn_q_b)", file_->path(), blk(l, "attn_q"));
        const int64_t rank = qa_info->ne[1];
        const gguf::TensorInfo& qa = tensor(blk(l, "attn_q_a"), {E, rank});
        if (c.q_lora_rank > 0 && rank != c.q_lora_rank)
          fail("{}: tensor '{}' has rank {}, but q_lora_rank is {}", file_->path(), qa.name, rank, c.q_lora_rank);
        L.q_a = as_matrix(qa);
        L.q_a_norm = vector(blk(l, "attn_q_a_norm"), rank);
        L.q_b = matrix(blk(l, "attn_q_b"), rank, H * qk);
      } else {
        L.q = matrix(blk(l, "attn_q"), E, H * qk);
      }
      L.kv_a = matrix(blk(l, "attn_kv_a_mqa"), E, kvl + rope);
      L.kv_a_norm = vector(blk(l, "attn_kv_a_norm"), kvl);
      if (absorbed_) {
        L.k_b = as_matrix(tensor(blk(l, "attn_k_b"), {nope, kvl, H}));
        L.v_b = as_matrix(tensor(blk(l, "attn_v_b"), {kvl, vh, H}));
      } else {
        L.kv_b = matrix(blk(l, "attn_kv_b"), kvl, H * (nope + vh));
      }
      L.out = matrix(blk(l, "attn_output"), H * vh, E);
    }
  }

 protected:
  int64_t cache_k_width() const override {
    const ModelConfig& c = config_;
    return absorbed_ ? c.kv_lora_rank + c.qk_rope : c.n_head * (c.qk_nope + c.qk_rope);
  }
  int64_t cache_v_width() const override { return absorbed_ ? 0 : config_.n_head * config_.v_head; }

  void attention(int64_t layer, const float* x, int64_t n, int64_t pos0, KvCache& cache, float* out) override {
    const ModelConfig& c = config_;
    const MlaLayer& L = layers_[layer];
    const int64_t H = c.n_head, nope = c.qk_nope, rope = c.qk_rope, kvl = c.kv_lora_rank;
    const int64_t qk = nope + rope;

    // Queries: [n][H][nope | rope].
    std::span<float> q = cpu::scratch<float, struct MlaQSite>(n * H * qk);
    if (L.q_lora) {
      const int64_t rank = L.q_a.n_rows;
      std::span<float> qa = cpu::scratch<float, struct MlaQaSite>(n * rank);
      matmul(L.q_a, x, n, qa.data(), rank);
      for (int64_t t = 0; t < n; ++t) cpu::rms_norm(&qa[t * rank], L.q_a_norm, &qa[t * rank], rank, c.rms_eps);
      matmul(L.q_b, qa.data(), n, q.data(), H * qk);
    } else {
      matmul(L.q, x, n, q.data(), H * qk);
    }

    // Compressed key/value: [n][kv_lora | rope]; only the latent part is normalised, k_pe is shared by all heads.
    std::span<float> kv = cpu::scratch<float, struct MlaKvSite>(n * (kvl + rope));
    matmul(L.kv_a, x, n, kv.data(), kvl + rope);
    std::span<float> rope_cos_sin = cpu::scratch<float, struct MlaRopeSite>(n * rope);
    for (int64_t t = 0; t < n; ++t) {
      cpu::rope_cache(c.rope, pos0 + t, &rope_cos_sin[t * rope]);
      float* row = &kv[t * (kvl + rope)];
      cpu::rms_norm(row, L.kv_a_norm, row, kvl, c.rms_eps);
      cpu::rope_apply(c.rope, &rope_cos_sin[t * rope], row + kvl);
      for (int64_t h = 0; h < H; ++h) cpu::rope_apply(c.rope, &rope_cos_sin[t * rope], &q[(t * H + h) * qk + nope]);
    }
    if (absorbed_) {
      absorbed_attention(layer, L, q, kv, n, pos0, cache, out);
    } else {
      legacy_attention(layer, L, q, kv, n, pos0, cache, out);
    }
  }

 private:
  // The latent cache holds [kv_lora | k_pe] per position. Each head's q_nope is mapped into latent space by
  // attn_k_b, so keys never need decompressing; the attention output is mapped back per head by attn_v_b.
  void absorbed_attention(int64_t layer, const MlaLayer& L, std::span<const float> q, std::span<const float> kv,
                          int64_t n, int64_t pos0, KvCache& cache, float* out) {
    const ModelConfig& c = config_;
    const int64_t H = c.n_head, nope = c.qk_nope, rope = c.qk_rope, kvl = c.kv_lora_rank, vh = c.v_head;
    const int64_t qk = nope + rope, width = kvl + rope;
    for (int64_t t = 0; t < n; ++t) std::copy_n(&kv[t * width], width, cache.k(layer, pos0 + t));

    std::span<float> q_lat = cpu::scratch<float, struct MlaQLatentSite>(n * H * width);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) std::copy_n(&q[(t * H + h) * qk + nope], rope, &q_lat[(t * H + h) * width + kvl]);
    // q_nope of every head into latent space in one pass: head h's kv_lora rows of attn_k_b.
    cpu::matmul_heads(kernels_, pool(), L.k_b,
                      {.n_heads = H,
                       .x_token_stride = H * qk,
                       .x_head_stride = qk,
                       .y_token_stride = H * width,
                       .y_head_stride = width},
                      q.data(), n, q_lat.data());

    std::span<float> lat = cpu::scratch<float, struct MlaLatentOutSite>(n * H * kvl);
    cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                              .n_head_kv = 1,
                              .head_dim_k = static_cast<int>(width),
                              .head_dim_v = static_cast<int>(kvl),
                              .scale = c.kq_scale};
    cpu::AttentionInput in{.q = q_lat.data(),
                           .q_token_stride = H * width,
                           .q_head_stride = width,
                           .k = cache.k(layer, 0),
                           .k_stride = width,
                           .v = cache.k(layer, 0),
                           .v_stride = width};
    cpu::causal_attention(shape, in, n, pos0, lat.data(), pool());

    std::span<float> heads = cpu::scratch<float, struct MlaHeadsSite>(n * H * vh);
    cpu::matmul_heads(
        kernels_, pool(), L.v_b,
        {.n_heads = H, .x_token_stride = H * kvl, .x_head_stride = kvl, .y_token_stride = H * vh, .y_head_stride = vh},
        lat.data(), n, heads.data());
    matmul(L.out, heads.data(), n, out, c.n_embd);
  }

  // Old files with a fused attn_kv_b: decompress keys and values per head and cache them like plain MHA.
  void legacy_attention(int64_t layer, const MlaLayer& L, std::span<const float> q, std::span<const float> kv,
                        int64_t n, int64_t pos0, KvCache& cache, float* out) {
    const ModelConfig& c = config_;
    const int64_t H = c.n_head, nope = c.qk_nope, rope = c.qk_rope, kvl = c.kv_lora_rank, vh = c.v_head;
    const int64_t qk = nope + rope;
    std::span<float> latent = cpu::scratch<float, struct MlaLegacyLatentSite>(n * kvl);
    std::span<float> kvb = cpu::scratch<float, struct MlaLegacyKvbSite>(n * H * (nope + vh));
    for (int64_t t = 0; t < n; ++t) std::copy_n(&kv[t * (kvl + rope)], kvl, &latent[t * kvl]);
    matmul(L.kv_b, latent.data(), n, kvb.data(), H * (nope + vh));
    for (int64_t t = 0; t < n; ++t) {
      float* k = cache.k(layer, pos0 + t);
      float* v = cache.v(layer, pos0 + t);
      for (int64_t h = 0; h < H; ++h) {
        const float* src = &kvb[(t * H + h) * (nope + vh)];
        std::copy_n(src, nope, k + h * qk);
        std::copy_n(&kv[t * (kvl + rope) + kvl], rope, k + h * qk + nope);
        std::copy_n(src + nope, vh, v + h * vh);
      }
    }
    std::span<float> heads = cpu::scratch<float, struct MlaHeadsSite>(n * H * vh);
    cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                              .n_head_kv = static_cast<int>(H),
                              .head_dim_k = static_cast<int>(qk),
                              .head_dim_v = static_cast<int>(vh),
                              .scale = c.kq_scale};
    cpu::AttentionInput in{.q = q.data(),
                           .q_token_stride = H * qk,
                           .q_head_stride = qk,
                           .k = cache.k(layer, 0),
                           .k_stride = H * qk,
                           .v = cache.v(layer, 0),
                           .v_stride = H * vh};
    cpu::causal_attention(shape, in, n, pos0, heads.data(), pool());
    matmul(L.out, heads.data(), n, out, c.n_embd);
  }

  void plan_device_attention(DeviceWeights& w) override {
    for (MlaLayer& L : layers_) {
      if (L.q_lora) {
        L.q_a_dev = w.add(L.q_a);
        L.q_a_norm_dev = w.add(L.q_a_norm, L.q_a.n_rows);
        L.q_b_dev = w.add(L.q_b);
      } else {
        L.q_dev = w.add(L.q);
      }
      L.kv_a_dev = w.add(L.kv_a);
      L.kv_a_norm_dev = w.add(L.kv_a_norm, config_.kv_lora_rank);
      if (absorbed_) {
        L.k_b_dev = w.add(L.k_b);
        L.v_b_dev = w.add(L.v_b);
      } else {
        L.kv_b_dev = w.add(L.kv_b);
      }
      L.out_dev = w.add(L.out);
    }
    weights_ = &w;
  }

  // The steps of attention(), absorbed_attention() and legacy_attention() above, as device ops.
  void device_attention(DevicePass& pass, int64_t layer, const float* x, int64_t n, int64_t pos0, KvCache& cache,
                        float* out) override {
    const ModelConfig& c = config_;
    const MlaLayer& L = layers_[layer];
    const DeviceWeights& w = *weights_;
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t H = c.n_head, nope = c.qk_nope, rope = c.qk_rope, kvl = c.kv_lora_rank, vh = c.v_head;
    const int64_t qk = nope + rope, width = kvl + rope;
    const size_t slot = DevicePass::kAttentionSlots;
    float* q = pass.scratch(slot, n * H * qk);
    if (L.q_lora) {
      const int64_t rank = L.q_a.n_rows;
      float* qa = pass.scratch(slot + 1, n * rank);
      d.matmul(s, w.matrix(L.q_a_dev), x, n, qa);
      d.rms_norm(s, qa, rank, w.vector(L.q_a_norm_dev), n, rank, c.rms_eps, qa, rank);
      d.matmul(s, w.matrix(L.q_b_dev), qa, n, q);
    } else {
      d.matmul(s, w.matrix(L.q_dev), x, n, q);
    }
    float* kv = pass.scratch(slot + 2, n * width);
    d.matmul(s, w.matrix(L.kv_a_dev), x, n, kv);
    d.rms_norm(s, kv, width, w.vector(L.kv_a_norm_dev), n, kvl, c.rms_eps, kv, width);
    d.rope(s, pass.rope_table, kv + kvl, n, 1, width, 0, c.rope.n_dims, c.rope.neox);
    d.rope(s, pass.rope_table, q + nope, n, H, H * qk, qk, c.rope.n_dims, c.rope.neox);
    float* heads = pass.scratch(slot + 3, n * H * vh);
    if (absorbed_) {
      d.copy_rows(s, kv, width, n, width, cache.k(layer, pos0), width);
      // Each head's q_nope into latent space beside its rotated part: [n][H][kv_lora | rope].
      float* q_lat = pass.scratch(slot + 4, n * H * width);
      d.copy_rows(s, q + nope, qk, n * H, rope, q_lat + kvl, width);
      const device::DeviceMatrix k_b = w.matrix(L.k_b_dev), v_b = w.matrix(L.v_b_dev);
      for (int64_t h = 0; h < H; ++h)
        d.matmul(s, rows_of(k_b, h * kvl, kvl), q + h * qk, H * qk, n, q_lat + h * width, H * width);
      float* lat = pass.scratch(slot + 5, n * H * kvl);
      const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                      .n_head_kv = 1,
                                      .head_dim_k = static_cast<int>(width),
                                      .head_dim_v = static_cast<int>(kvl),
                                      .scale = c.kq_scale};
      d.attention(s, shape, {q_lat, H * width, width, cache.k(layer, 0), width, cache.k(layer, 0), width}, n, pos0,
                  lat);
      for (int64_t h = 0; h < H; ++h)
        d.matmul(s, rows_of(v_b, h * vh, vh), lat + h * kvl, H * kvl, n, heads + h * vh, H * vh);
    } else {
      // Keys and values decompressed per head: k = [k_nope | k_pe (shared by the heads)], v.
      float* kvb = pass.scratch(slot + 4, n * H * (nope + vh));
      d.matmul(s, w.matrix(L.kv_b_dev), kv, width, n, kvb, H * (nope + vh));
      d.copy_rows(s, kvb, nope + vh, n * H, nope, cache.k(layer, pos0), qk);
      for (int64_t h = 0; h < H; ++h)
        d.copy_rows(s, kv + kvl, width, n, rope, cache.k(layer, pos0) + h * qk + nope, H * qk);
      d.copy_rows(s, kvb + nope, nope + vh, n * H, vh, cache.v(layer, pos0), vh);
      const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                      .n_head_kv = static_cast<int>(H),
                                      .head_dim_k = static_cast<int>(qk),
                                      .head_dim_v = static_cast<int>(vh),
                                      .scale = c.kq_scale};
      d.attention(s, shape, {q, H * qk, qk, cache.k(layer, 0), H * qk, cache.v(layer, 0), H * vh}, n, pos0, heads);
    }
    d.matmul(s, w.matrix(L.out_dev), heads, n, out);
  }

  bool absorbed_ = true;
  std::vector<MlaLayer> layers_;
  const DeviceWeights* weights_ = nullptr;  // where the device handles point
};

}  // namespace

std::unique_ptr<Model> make_deepseek2(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
  return std::make_unique<Deepseek2>(std::move(file), std::move(config), n_threads);
}

}  // namespace hetmoe::model
