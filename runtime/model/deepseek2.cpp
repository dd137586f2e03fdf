// DeepSeek-V2/V2-Lite/V2.5/V3/R1 and Kimi-K2 (GGUF arch "deepseek2"): multi-head latent attention (MLA) with an
// optional low-rank query, leading dense blocks, routed plus shared experts.
#include <algorithm>

#include "cpu_kernels/ops.h"
#include "runtime/error.h"
#include "runtime/model/archs.h"

namespace hetmoe::model {
namespace {

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
    }
  }

 protected:
  int64_t cache_k_width() const override {
    const ModelConfig& c = config_;
    return absorbed_ ? c.kv_lora_rank + c.qk_rope : c.n_head * (c.qk_nope + c.qk_rope);
  }
  int64_t cache_v_width() const override { return absorbed_ ? 0 : config_.n_head * config_.v_head; }

  void attention(Pass& pass, int64_t layer, const float* x, int64_t n, int64_t pos0, KvCache& cache,
                 float* out) override {
    const ModelConfig& c = config_;
    const MlaLayer& L = layers_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t H = c.n_head, nope = c.qk_nope, rope = c.qk_rope, kvl = c.kv_lora_rank, vh = c.v_head;
    const int64_t qk = nope + rope, width = kvl + rope;
    const size_t slot = Pass::kAttentionSlots;
    // Queries: [n][H][nope | rope].
    float* q = pass.scratch(slot, n * H * qk);
    if (L.q_lora) {
      float* qa = pass.scratch(slot + 1, n * L.q_rank);
      d.matmul(s, pass.matrix(L.q_a), x, n, qa);
      d.rms_norm(s, qa, L.q_rank, pass.vector(L.q_a_norm), n, L.q_rank, c.rms_eps, qa, L.q_rank);
      d.matmul(s, pass.matrix(L.q_b), qa, n, q);
    } else {
      d.matmul(s, pass.matrix(L.q), x, n, q);
    }
    // Compressed key/value: [n][kv_lora | rope]; only the latent part is normalised, k_pe is shared by all heads.
    float* kv = pass.scratch(slot + 2, n * width);
    d.matmul(s, pass.matrix(L.kv_a), x, n, kv);
    d.rms_norm(s, kv, width, pass.vector(L.kv_a_norm), n, kvl, c.rms_eps, kv, width);
    d.rope(s, pass.rope_table, kv + kvl, n, 1, width, 0, c.rope.n_dims, c.rope.neox);
    d.rope(s, pass.rope_table, q + nope, n, H, H * qk, qk, c.rope.n_dims, c.rope.neox);
    float* heads = pass.scratch(slot + 3, n * H * vh);
    if (absorbed_) {
      // The latent cache holds [kv_lora | k_pe] per position. Each head's q_nope is mapped into latent space by
      // attn_k_b, so keys never need decompressing; the attention output is mapped back per head by attn_v_b.
      d.copy_rows(s, kv, width, n, width, cache.k(layer, pos0), width);
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
                                      .scale = c.kq_scale};
      d.attention(s, shape, {q_lat, H * width, width, cache.k(layer, 0), width, cache.k(layer, 0), width}, n, pos0,
                  lat);
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
    d.matmul(s, pass.matrix(L.out), heads, n, out);
  }

 private:
  bool absorbed_ = true;
  std::vector<MlaLayer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_deepseek2(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
  return std::make_unique<Deepseek2>(std::move(file), std::move(config), n_threads);
}

}  // namespace hetmoe::model
