#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace hetmoe {

// How random matrices are scaled. The tiny presets copy the reference models (0.05 * N(0,1)); at real
// dimensions that constant would blow activations up by sqrt(row length) per matrix, so those use 1/sqrt(row).
enum class MatrixScale { kConstant005, kInverseSqrtRow };

// The hyperparameters of one deepseek2-architecture model that `hetmoe make-model` can generate. Field names follow
// the GGUF keys they become (section 3 of the reference README).
struct ModelPreset {
  std::string_view name;         // --preset value and general.name
  std::string_view description;  // one line for --help
  int n_layer = 0;               // default block count
  int max_layers = 0;            // --layers upper bound (the real model's depth for real presets)
  int n_leading_dense = 0;       // leading blocks with a dense FFN (before --layers clamps it)
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;      // dense FFN width (feed_forward_length)
  int64_t n_ff_exp = 0;  // per-expert FFN width (expert_feed_forward_length)
  int64_t n_head = 0;
  int64_t q_lora_rank = 0;  // 0: no q LoRA, attn_q is used (the key is still written, as the tiny lite file)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_expert_shared = 0;
  int64_t n_group = 1;
  int64_t n_group_used = 1;
  int gating_func = 1;           // 1 softmax, 2 sigmoid
  bool has_exp_probs_b = false;  // blk.N.exp_probs_b.bias (sigmoid routing with selection bias)
  bool weights_norm = false;     // expert_weights_norm, written only when true
  float weights_scale = 1.0f;    // expert_weights_scale (routed_scaling_factor)
  int64_t context_length = 0;
  float rope_freq_base = 10000.0f;
  float yarn_factor = 1.0f;
  int64_t yarn_original_context = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  double mscale_all_dim = 1.0;  // stored as rope.scaling.yarn_log_multiplier = f32(0.1 * mscale_all_dim), in double
  float rms_norm_eps = 1e-6f;
  std::string_view tokenizer_pre;  // deepseek-v3 or deepseek-llm
  MatrixScale matrix_scale = MatrixScale::kConstant005;
};

std::span<const ModelPreset> model_presets();
// nullptr for an unknown name.
const ModelPreset* find_model_preset(std::string_view name);

}  // namespace hetmoe
