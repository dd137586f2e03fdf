// Qwen3.5-MoE (GGUF arch "qwen35moe"): Gated DeltaNet blocks (linear attention with a recurrent state) interleaved
// with gated full-attention blocks, every block with routed experts (softmax, top-k, renormalised) and a shared
// expert scaled per token by sigmoid(ffn_gate_inp_shexp . x). The layer pattern comes from
// attention.recurrent_layers, else full_attention_interval: block l is recurrent unless (l + 1) % interval == 0.
// The file's last nextn_predict_layers blocks are the MTP head: read past by the trunk, as llama.cpp does, and run by
// Model::forward_mtp for drafts (a gated full-attention block).
//
// Gated DeltaNet block: qkv = attn_qkv . x through the short convolution and SiLU, then the gated delta rule
// (cpu_kernels/linear_attention.h), each head's output RMS-normalised (ssm_norm) times silu(attn_gate . x), and
// ssm_out. Full attention: attn_q gives each head's query and its gate [q | gate]; q and k RMS-normalised per head,
// IMROPE (for text: NEOX rope on the pairs of the position sections), GQA, output times sigmoid(gate), attn_output.
#include <cmath>

#include "runtime/error.h"
#include "runtime/model/archs.h"
#include "runtime/model/model.h"

namespace hetmoe::model {
namespace {

void configure(const ConfigKeys& k, ModelConfig& c) {
  const int64_t n_all = c.n_layer;
  drop_mtp_blocks(k, c, true);
  c.mtp_zero_first = false;
  c.n_ff_exp = k.opt_int("expert_feed_forward_length", 0);
  c.n_ff_shared = k.opt_int("expert_shared_feed_forward_length", 0);
  if (c.n_ff_shared < 0 || c.n_ff_shared > ConfigKeys::kMaxDim)
    k.bad("expert_shared_feed_forward_length", c.n_ff_shared,
          fmt::format("is out of range (0..{})", ConfigKeys::kMaxDim));
  c.n_expert_shared = c.n_ff_shared > 0 ? 1 : 0;
  c.ffn_norm = "post_attention_norm";
  c.expert_weights_norm = true;
  c.gating = Gating::kSoftmax;
  c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
  if (c.head_dim_k != c.head_dim_v)
    k.bad("attention.value_length", c.head_dim_v,
          fmt::format("differs from {} = {}", k.key("attention.key_length"), c.head_dim_k));

  // IMROPE: NEOX pairs, four position sections.
  c.rope.neox = true;
  if (const gguf::Value* v = k.find("rope.dimension_sections")) {
    if (!v->is_array() || v->array_size() > 4)
      k.bad("rope.dimension_sections", v->to_display(), "is not an array of at most 4 integers");
    int total = 0;
    for (size_t i = 0; i < v->array_size(); ++i) {
      const std::optional<int64_t> s = v->array_int(i);
      if (!s || *s < 0 || *s > 4096) k.bad("rope.dimension_sections", v->to_display(), "holds a bad section");
      c.rope.sections[i] = static_cast<int>(*s);
      total += c.rope.sections[i];
    }
    if (total > c.rope.n_dims / 2 && total > 0)
      k.bad("rope.dimension_sections", v->to_display(),
            fmt::format("add up to more than the {} rotated pairs", c.rope.n_dims / 2));
  }

  // The Gated DeltaNet blocks.
  c.ssm_conv_kernel = k.req_int("ssm.conv_kernel");
  c.ssm_head_dim = k.req_int("ssm.state_size");
  c.ssm_k_heads = k.req_int("ssm.group_count");
  c.ssm_v_heads = k.req_int("ssm.time_step_rank");
  k.check_positive("ssm.conv_kernel", c.ssm_conv_kernel, 16);
  k.check_positive("ssm.state_size", c.ssm_head_dim, 1024);
  k.check_positive("ssm.group_count", c.ssm_k_heads, 1024);
  k.check_positive("ssm.time_step_rank", c.ssm_v_heads, 1024);
  if (c.ssm_v_heads % c.ssm_k_heads != 0)
    k.bad("ssm.time_step_rank", c.ssm_v_heads,
          fmt::format("is not a multiple of {} = {}", k.key("ssm.group_count"), c.ssm_k_heads));
  const int64_t inner = k.req_int("ssm.inner_size");
  if (inner != c.ssm_v_heads * c.ssm_head_dim)
    k.bad("ssm.inner_size", inner,
          fmt::format("is not {} x {} (value heads of the key length)", k.key("ssm.time_step_rank"),
                      k.key("ssm.state_size")));

  // The layer pattern.
  c.recurrent.assign(static_cast<size_t>(c.n_layer), false);
  if (const gguf::Value* v = k.find("attention.recurrent_layers")) {
    if (!v->is_array() || static_cast<int64_t>(v->array_size()) != n_all)
      k.bad("attention.recurrent_layers", v->to_display(), fmt::format("is not one flag per block ({})", n_all));
    for (int64_t l = 0; l < c.n_layer; ++l) c.recurrent[l] = v->array_int(static_cast<size_t>(l)).value_or(0) != 0;
  } else {
    const int64_t interval = k.opt_int("full_attention_interval", 4);
    k.check_positive("full_attention_interval", interval, 1 << 16);
    for (int64_t l = 0; l < c.n_layer; ++l) c.recurrent[l] = (l + 1) % interval != 0;
  }
}

// One block's attention weights, as handles of the pass's weights: a Gated DeltaNet's or a full attention's.
struct Block {
  // Gated DeltaNet.
  PassWeights::Handle qkv = 0, gate = 0, alpha = 0, beta = 0, out = 0;
  PassWeights::Handle conv = 0;            // [conv channels][kernel]
  PassWeights::Handle a = 0, dt_bias = 0;  // [v heads]
  PassWeights::Handle norm = 0;            // [head_dim]
  // Full attention.
  PassWeights::Handle q = 0, k = 0, v = 0, o = 0, q_norm = 0, k_norm = 0;
};

class Qwen35Moe final : public Model {
 public:
  Qwen35Moe(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads)
      : Model(std::move(file), std::move(config), n_threads) {
    bind_common();
    const ModelConfig& c = config_;
    const int64_t E = c.n_embd, H = c.n_head, KV = c.n_head_kv, D = c.head_dim_k;
    const int64_t Hk = c.ssm_k_heads, Hv = c.ssm_v_heads, Ds = c.ssm_head_dim, C = conv_channels();
    blocks_.resize(c.n_layer + c.n_mtp);  // the MTP block is a gated full-attention block
    for (int64_t l = 0; l < c.n_layer + c.n_mtp; ++l) {
      weights_.host_only(l >= c.n_layer);  // the MTP block runs on the host pass only
      Block& b = blocks_[l];
      if (c.is_recurrent(l)) {
        b.qkv = weights_.add(matrix(blk(l, "attn_qkv"), E, 2 * Hk * Ds + Hv * Ds));
        b.gate = weights_.add(matrix(blk(l, "attn_gate"), E, Hv * Ds));
        b.alpha = weights_.add(matrix(blk(l, "ssm_alpha"), E, Hv));
        b.beta = weights_.add(matrix(blk(l, "ssm_beta"), E, Hv));
        b.out = weights_.add(matrix(blk(l, "ssm_out"), Hv * Ds, E));
        const int64_t K = c.ssm_conv_kernel;
        b.conv = weights_.add(as_floats(tensor(blk(l, "ssm_conv1d"), {K, C})), K * C);
        b.a = weights_.add(as_floats(tensor("blk." + std::to_string(l) + ".ssm_a", {Hv})), Hv);
        b.dt_bias = weights_.add(vector(blk(l, "ssm_dt", "bias"), Hv), Hv);
        b.norm = weights_.add(vector(blk(l, "ssm_norm"), Ds), Ds);
      } else {
        b.q = weights_.add(matrix(blk(l, "attn_q"), E, 2 * H * D));
        b.k = weights_.add(matrix(blk(l, "attn_k"), E, KV * D));
        b.v = weights_.add(matrix(blk(l, "attn_v"), E, KV * D));
        b.o = weights_.add(matrix(blk(l, "attn_output"), H * D, E));
        b.q_norm = weights_.add(vector(blk(l, "attn_q_norm"), D), D);
        b.k_norm = weights_.add(vector(blk(l, "attn_k_norm"), D), D);
      }
    }
    weights_.host_only(false);
  }

 protected:
  LayerCache cache_layer(int64_t layer) const override {
    const ModelConfig& c = config_;
    if (!c.is_recurrent(layer)) return {.k_width = c.n_head_kv * c.head_dim_k, .v_width = c.n_head_kv * c.head_dim_v};
    return {.recurrent = (c.ssm_conv_kernel - 1) * conv_channels() + cpu::delta_net_state_floats(delta_shape())};
  }

  void attention(Pass& pass, int64_t layer, const float* x, int64_t n, float* out) override {
    if (config_.is_recurrent(layer)) return delta_net(pass, layer, x, n, out);
    full_attention(pass, layer, x, n, out);
  }

 private:
  int64_t conv_channels() const {
    const ModelConfig& c = config_;
    return (2 * c.ssm_k_heads + c.ssm_v_heads) * c.ssm_head_dim;
  }
  cpu::DeltaNetShape delta_shape() const {
    const ModelConfig& c = config_;
    return {.n_k_heads = c.ssm_k_heads, .n_v_heads = c.ssm_v_heads, .head_dim = c.ssm_head_dim, .eps = c.rms_eps};
  }

  void delta_net(Pass& pass, int64_t layer, const float* x, int64_t n, float* out) {
    const ModelConfig& c = config_;
    const Block& b = blocks_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t Hv = c.ssm_v_heads, Ds = c.ssm_head_dim, C = conv_channels(), K = c.ssm_conv_kernel;
    const size_t slot = Pass::kAttentionSlots;
    float* mixed = pass.scratch(slot, n * C);
    float* z = pass.scratch(slot + 1, n * Hv * Ds);
    float* gates = pass.scratch(slot + 2, n * 2 * Hv);  // per token: alpha [Hv], then beta [Hv]
    float* conv = pass.scratch(slot + 3, n * C);
    float* heads = pass.scratch(slot + 4, n * Hv * Ds);
    d.matmul(s, pass.matrix(b.qkv), x, n, mixed);
    d.matmul(s, pass.matrix(b.gate), x, n, z);
    d.matmul(s, pass.matrix(b.alpha), x, c.n_embd, n, gates, 2 * Hv);
    d.matmul(s, pass.matrix(b.beta), x, c.n_embd, n, gates + Hv, 2 * Hv);
    // Each sequence through its state: the convolution's last K - 1 inputs, then the delta rule's matrices.
    for (const PassSequence& sq : pass.sequences) {
      float* conv_state = sq.cache->recurrent(layer);
      float* delta_state = conv_state + (K - 1) * C;
      float* seq_conv = conv + sq.row0 * C;
      const float* seq_gates = gates + sq.row0 * 2 * Hv;
      d.short_conv_silu(s, {.channels = C, .width = static_cast<int>(K), .weight = pass.vector(b.conv)},
                        mixed + sq.row0 * C, C, sq.n, conv_state, seq_conv, C);
      d.gated_delta_net(s, delta_shape(),
                        {.qkv = seq_conv,
                         .ld_qkv = C,
                         .alpha = seq_gates,
                         .beta = seq_gates + Hv,
                         .ld_gates = 2 * Hv,
                         .a = pass.vector(b.a),
                         .dt_bias = pass.vector(b.dt_bias)},
                        sq.n, delta_state, heads + sq.row0 * Hv * Ds, Hv * Ds);
    }
    d.gated_rms_norm(s, heads, Ds, pass.vector(b.norm), z, Ds, n * Hv, Ds, c.rms_eps, heads, Ds);
    d.matmul(s, pass.matrix(b.out), heads, n, out);
  }

  void full_attention(Pass& pass, int64_t layer, const float* x, int64_t n, float* out) {
    const ModelConfig& c = config_;
    const Block& b = blocks_[layer];
    device::Device& d = pass.device;
    const int s = pass.stream;
    const int64_t H = c.n_head, KV = c.n_head_kv, D = c.head_dim_k;
    const size_t slot = Pass::kAttentionSlots;
    float* qg = pass.scratch(slot, n * H * 2 * D);  // per head [q | gate]
    float* q = pass.scratch(slot + 1, n * H * D);
    float* k = pass.scratch(slot + 2, n * KV * D);
    float* v = pass.scratch(slot + 3, n * KV * D);
    float* heads = pass.scratch(slot + 4, n * H * D);
    d.matmul(s, pass.matrix(b.q), x, n, qg);
    d.matmul(s, pass.matrix(b.k), x, n, k);
    d.matmul(s, pass.matrix(b.v), x, n, v);
    d.copy_rows(s, qg, 2 * D, n * H, D, q, D);
    d.rms_norm(s, q, D, pass.vector(b.q_norm), n * H, D, c.rms_eps, q, D);
    d.rms_norm(s, k, D, pass.vector(b.k_norm), n * KV, D, c.rms_eps, k, D);
    d.rope(s, pass.rope_table, q, n, H, H * D, D, c.rope.n_dims, c.rope.neox);
    d.rope(s, pass.rope_table, k, n, KV, KV * D, D, c.rope.n_dims, c.rope.neox);
    const cpu::AttentionShape shape{.n_head = static_cast<int>(H),
                                    .n_head_kv = static_cast<int>(KV),
                                    .head_dim_k = static_cast<int>(D),
                                    .head_dim_v = static_cast<int>(D),
                                    .scale = c.kq_scale};
    for (const PassSequence& sq : pass.sequences) {  // each sequence's keys into its cache, its queries over them
      KvCache& cache = *sq.cache;
      d.copy_rows(s, k + sq.row0 * KV * D, KV * D, sq.n, KV * D, cache.k(layer, sq.pos0), KV * D);
      d.copy_rows(s, v + sq.row0 * KV * D, KV * D, sq.n, KV * D, cache.v(layer, sq.pos0), KV * D);
      d.attention(s, shape, {q + sq.row0 * H * D, H * D, D, cache.k(layer, 0), KV * D, cache.v(layer, 0), KV * D}, sq.n,
                  sq.pos0, heads + sq.row0 * H * D);
    }
    d.sigmoid_mul(s, qg + D, 2 * D, n * H, D, heads, D);
    d.matmul(s, pass.matrix(b.o), heads, n, out);
  }

  std::vector<Block> blocks_;
};

}  // namespace

extern const ArchSpec qwen35moe_arch{
    .name = "qwen35moe",
    .configure = configure,
    .make = [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) -> std::unique_ptr<Model> {
      return std::make_unique<Qwen35Moe>(std::move(file), std::move(config), n_threads);
    },
};

}  // namespace hetmoe::model
