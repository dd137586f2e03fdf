#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_kernels/ops.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"

namespace hetmoe::model {

// How router logits become expert probabilities (values as GGUF's expert_gating_func).
// kSoftmaxSelected (gpt-oss): the experts of the largest raw logits, weighted by the softmax over their logits.
// kSqrtSoftplus (DeepSeek-V4): probabilities sqrt(softplus(logit)).
enum class Gating { kSoftmax = 1, kSigmoid = 2, kSoftmaxSelected = 3, kSqrtSoftplus = 4 };

// Everything a forward pass needs to know about a model, read from GGUF metadata with the defaults llama.cpp's
// loader applies. Shapes are checked against the tensors later, when the weights are bound.
struct ModelConfig {
  std::string arch_name;  // general.architecture
  std::string name;

  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;  // the trunk's blocks
  // Multi-token-prediction blocks after the trunk (blk.n_layer on): bound for drafting, never run by forward().
  int64_t n_mtp = 0;
  // Whether an MTP row at position 0 reads a zero embedding (DeepSeek's MTP and GLM-4.5's, as vLLM runs them; not
  // Qwen3.5's).
  bool mtp_zero_first = true;
  int64_t n_ctx_train = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;  // per-head query/key length (GQA archs)
  int64_t head_dim_v = 0;
  float rms_eps = 1e-6f;

  cpu::RopeParams rope;
  float kq_scale = 1.0f;       // softmax scale of attention
  int64_t sliding_window = 0;  // keys a sliding-window layer sees (the query's own included); 0: none

  // Feed-forward.
  std::string ffn_norm = "ffn_norm";  // the FFN input norm's tensor name (GLM-4.5: post_attention_norm)
  int64_t n_ff = 0;                   // dense FFN width
  int64_t n_ff_exp = 0;               // one routed expert's width
  int64_t n_expert = 0;               // 0: dense model
  int64_t n_expert_used = 0;
  int64_t n_expert_shared = 0;  // shared experts, fused into one FFN of width n_ff_exp * n_expert_shared
  int64_t n_ff_shared = 0;      // that width when the file states it (Qwen3.5: expert_shared_feed_forward_length)
  int64_t n_leading_dense = 0;  // blocks < this one use the dense FFN
  Gating gating = Gating::kSoftmax;
  bool clamped_swiglu = false;  // gpt-oss's expert activation (cpu::ExpertFfn)
  bool expert_weights_norm = false;
  float expert_weights_scale = 0.0f;  // applied when not 0 or 1
  int64_t n_group = 1;
  int64_t n_group_used = 1;

  // deepseek2 multi-head latent attention.
  int64_t q_lora_rank = 0;  // 0: plain attn_q (decided by the tensors present, see deepseek2.cpp)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
  // DeepSeek-V3.2's lightning indexer (0 heads: none).
  int64_t indexer_heads = 0;
  int64_t indexer_dim = 0;
  int64_t indexer_top_k = 0;

  // Qwen3.5's Gated DeltaNet blocks (the ssm.* keys): recurrent[l] says layer l is one (else full attention).
  int64_t ssm_conv_kernel = 0;  // taps of the short convolution
  int64_t ssm_head_dim = 0;     // ssm.state_size: key and value length per head
  int64_t ssm_k_heads = 0;      // ssm.group_count
  int64_t ssm_v_heads = 0;      // ssm.time_step_rank
  std::vector<bool> recurrent;

  // DeepSeek-V4's hyper-connections: the residual stream is hc_streams copies of the hidden state (0: a plain
  // residual), mixed with Sinkhorn-normalised coefficients (cpu_kernels/hyper_connection.h).
  int64_t hc_streams = 0;
  int64_t hc_sinkhorn_iters = 0;
  float hc_eps = 0.0f;
  // Blocks < this one route by token id (ffn_gate_tid2eid), the others by score.
  int64_t n_hash_layers = 0;
  // DeepSeek-V4's attention: per layer the compression ratio of its keys (0: the sliding window alone; 4: CSA, the
  // blocks the indexer picks; 128: HCA, every block), the grouped output LoRA, the RoPE of the compressed layers
  // (compress_rope_freq_base with YaRN; `rope` is the others') and each layer's SwiGLU limits (0: none).
  std::vector<int64_t> compress_ratios;
  int64_t out_groups = 0, out_lora_rank = 0;
  cpu::RopeParams compress_rope;
  std::vector<float> swiglu_limits, shared_swiglu_limits;

  bool is_moe_layer(int64_t layer) const { return n_expert > 0 && layer >= n_leading_dense; }
  bool is_recurrent(int64_t layer) const {
    return layer < static_cast<int64_t>(recurrent.size()) && recurrent[static_cast<size_t>(layer)];
  }
};

// The metadata keys of one architecture ("<arch>.<key>"), as an architecture's configure() reads them.
class ConfigKeys {
 public:
  ConfigKeys(const gguf::GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  const gguf::GgufFile& file() const { return f_; }
  std::string key(std::string_view k) const { return arch_ + "." + std::string(k); }
  int64_t req_int(std::string_view k) const { return f_.require_int(key(k)); }
  int64_t opt_int(std::string_view k, int64_t def) const { return f_.get_int(key(k)).value_or(def); }
  double opt_float(std::string_view k, double def) const { return f_.get_float(key(k)).value_or(def); }
  bool opt_bool(std::string_view k, bool def) const { return f_.get_bool(key(k)).value_or(def); }
  std::optional<std::string> opt_string(std::string_view k) const { return f_.get_string(key(k)); }
  const gguf::Value* find(std::string_view k) const { return f_.find(key(k)); }
  // Fails with a one-line error naming the key ("<arch>.<k> = v is out of range (1..max)") unless 0 < v <= max.
  void check_positive(std::string_view k, int64_t v, int64_t max) const;
  // Fails with "<file>: <arch>.<k> = <value> <why>": every hyperparameter error names the key that is wrong.
  template <typename T>
  [[noreturn]] void bad(std::string_view k, const T& value, std::string_view why) const {
    fail("{}: {} = {} {}", f_.path(), key(k), value, why);
  }

  static constexpr int64_t kMaxDim = 1 << 20;

 private:
  const gguf::GgufFile& f_;
  std::string arch_;
};

// The file's last nextn_predict_layers blocks are a multi-token-prediction head (DeepSeek-V3/V3.2, GLM-4.5, Qwen3.5):
// taken off n_layer, so the trunk's forward pass reads past them as llama.cpp does. With `drafts` (an architecture
// whose MTP block Model::forward_mtp runs) and the block's nextn.eh_proj in the file, they become n_mtp blocks.
void drop_mtp_blocks(const ConfigKeys& k, ModelConfig& c, bool drafts);

// The routing keys of the DeepSeek-V3 family (expert_gating_func, expert_weights_norm / _scale, expert groups), with
// the gating llama.cpp assumes for the architecture when the key is absent.
void read_expert_routing(const ConfigKeys& k, ModelConfig& c, Gating default_gating);

// Weight bytes one decoded token reads: every dense tensor of the trunk (an MTP block's are read only by drafts), one
// row of the embedding (when the output matrix is separate), and n_used of n_expert of each routed-expert tensor (the
// expected share under uniform routing).
double active_bytes_per_token(const gguf::GgufFile& file, const ModelConfig& config);

// The same bytes by the part of the forward pass that reads them, as HETMOE_PROFILE times the parts: a block's
// attention (or linear attention: every tensor of the block that is not its FFN's, its sub-blocks' input norms or its
// hyper-connection mixes), its FFN (a dense layer's, or a MoE layer's router, routed and shared experts), the output
// head and its norm, and the rest (the embedding, the norms and mixes between the parts).
struct ActiveBytes {
  double attention = 0, dense_ffn = 0, moe_ffn = 0, output = 0, rest = 0;
  double total() const { return attention + dense_ffn + moe_ffn + output + rest; }
};
ActiveBytes active_bytes_by_part(const gguf::GgufFile& file, const ModelConfig& config);

// The common keys, then the architecture's own (its ArchSpec's configure). Fails with a one-line error for an unknown
// architecture, a missing required key or inconsistent values.
ModelConfig read_config(const gguf::GgufFile& file);

}  // namespace hetmoe::model
