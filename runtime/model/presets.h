#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace hetmoe {

// How random matrices are scaled. The tiny presets copy the reference models (0.05 * N(0,1)); at real
// dimensions that constant would blow activations up by sqrt(row length) per matrix, so those use 1/sqrt(row).
enum class MatrixScale { kConstant005, kInverseSqrtRow };

// The hyperparameters of one model that `hetmoe make-model` can generate (and `hetmoe simulate` sizes). Field names
// follow the GGUF keys they become (section 3 of the reference README). The MLA fields serve deepseek2 and
// deepseek32, the GQA ones glm4moe, gpt-oss, minimax-m2, qwen3moe and qwen35moe's attention blocks.
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
  std::string_view arch = "deepseek2";  // general.architecture
  // GQA architectures.
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t rope_dims = 0;       // rotated dims per head (partial rope); 0: the whole head
  int qk_norm = 0;             // 0 none, 1 per head (GLM-4.5, Qwen3), 2 over the whole projection (MiniMax-M2)
  bool qkv_bias = false;       // attn_q/k/v biases (GLM-4.5, gpt-oss)
  bool gpt_oss = false;        // output bias, sinks, router and expert biases, softmax over the chosen experts
  int64_t sliding_window = 0;  // gpt-oss: every other layer
  // deepseek32's and deepseek4's lightning indexer.
  int64_t indexer_heads = 0;
  int64_t indexer_dim = 0;
  int64_t indexer_top_k = 0;
  // qwen35moe: Gated DeltaNet blocks, full attention every full_attention_interval-th block, IMROPE sections, the
  // gated shared expert's width.
  int64_t ssm_conv_kernel = 0;
  int64_t ssm_state = 0;  // key and value length per head
  int64_t ssm_k_heads = 0;
  int64_t ssm_v_heads = 0;
  int full_attention_interval = 0;
  int rope_sections[4] = {0, 0, 0, 0};
  int64_t n_ff_shared = 0;
  // deepseek4: hyper-connections, the grouped output LoRA, the compressed layers (block 0 a window only, then ratio 4
  // and 128 in turn), hash-routed leading blocks, the clamped SwiGLU.
  int hc_streams = 0;
  int64_t out_groups = 0;
  int64_t out_lora_rank = 0;
  int64_t hash_layers = 0;
  float compress_rope_base = 0.0f;
  float swiglu_limit = 0.0f;
};

std::span<const ModelPreset> model_presets();
// nullptr for an unknown name.
const ModelPreset* find_model_preset(std::string_view name);

}  // namespace hetmoe
