#pragma once

#include <cstdint>
#include <string>

#include "cpu_kernels/ops.h"
#include "runtime/gguf/reader.h"

namespace hetmoe::model {

enum class Arch { kDeepseek2, kQwen3Moe, kLlama };

// How router logits become expert probabilities (values as GGUF's expert_gating_func).
enum class Gating { kSoftmax = 1, kSigmoid = 2 };

// Everything a forward pass needs to know about a model, read from GGUF metadata with the defaults llama.cpp's
// loader applies. Shapes are checked against the tensors later, when the weights are bound.
struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;
  std::string name;

  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ctx_train = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;  // per-head query/key length (GQA archs)
  int64_t head_dim_v = 0;
  float rms_eps = 1e-6f;

  cpu::RopeParams rope;
  float kq_scale = 1.0f;  // softmax scale of attention

  // Feed-forward.
  int64_t n_ff = 0;      // dense FFN width
  int64_t n_ff_exp = 0;  // one routed expert's width
  int64_t n_expert = 0;  // 0: dense model
  int64_t n_expert_used = 0;
  int64_t n_expert_shared = 0;  // shared experts, fused into one FFN of width n_ff_exp * n_expert_shared
  int64_t n_leading_dense = 0;  // blocks < this one use the dense FFN
  Gating gating = Gating::kSoftmax;
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

  bool is_moe_layer(int64_t layer) const { return n_expert > 0 && layer >= n_leading_dense; }
};

// Weight bytes one decoded token reads: every dense tensor, one row of the embedding (when the output matrix is
// separate), and n_used of n_expert of each routed-expert tensor (the expected share under uniform routing).
double active_bytes_per_token(const gguf::GgufFile& file, const ModelConfig& config);

// Fails with a one-line error for an unknown architecture, a missing required key or inconsistent values.
ModelConfig read_config(const gguf::GgufFile& file);

}  // namespace hetmoe::model
