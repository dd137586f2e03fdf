#include "tools/model_presets.h"

#include <array>

namespace hetmoe {
namespace {

// tiny-deepseek-v3: the hyperparameters of the reference tiny-deepseek3 (README section 2.3), the quick-start model.
// deepseek-v2-lite and deepseek-v3: the dimensions of the published HF config.json files; the V3 preset keeps only
// 4 of its 61 blocks by default (3 dense + 1 MoE, about 15 B parameters), --layers gives more.
constexpr std::array kPresets = {
    ModelPreset{
        .name = "tiny-deepseek-v3",
        .description = "DeepSeek-V3-like toy (n_embd 256, 3 blocks, 16 experts, sigmoid routing), 9.1 M params",
        .n_layer = 3,
        .max_layers = 64,
        .n_leading_dense = 1,
        .n_vocab = 512,
        .n_embd = 256,
        .n_ff = 512,
        .n_ff_exp = 256,
        .n_head = 4,
        .q_lora_rank = 512,
        .kv_lora_rank = 256,
        .qk_nope = 64,
        .qk_rope = 32,
        .v_head = 64,
        .n_expert = 16,
        .n_expert_used = 4,
        .n_expert_shared = 1,
        .n_group = 4,
        .n_group_used = 2,
        .gating_func = 2,
        .has_exp_probs_b = true,
        .weights_norm = true,
        .weights_scale = 2.5f,
        .context_length = 163840,
        .rope_freq_base = 10000.0f,
        .yarn_factor = 40.0f,
        .yarn_original_context = 4096,
        .yarn_beta_fast = 32.0f,
        .yarn_beta_slow = 1.0f,
        .mscale_all_dim = 1.0,
        .rms_norm_eps = 1e-6f,
        .tokenizer_pre = "deepseek-v3",
        .matrix_scale = MatrixScale::kConstant005,
    },
    ModelPreset{
        .name = "deepseek-v2-lite",
        .description = "DeepSeek-V2-Lite dimensions (n_embd 2048, 27 blocks, 64+2 experts, no q LoRA), 15.7 B params",
        .n_layer = 27,
        .max_layers = 27,
        .n_leading_dense = 1,
        .n_vocab = 102400,
        .n_embd = 2048,
        .n_ff = 10944,
        .n_ff_exp = 1408,
        .n_head = 16,
        .q_lora_rank = 0,
        .kv_lora_rank = 512,
        .qk_nope = 128,
        .qk_rope = 64,
        .v_head = 128,
        .n_expert = 64,
        .n_expert_used = 6,
        .n_expert_shared = 2,
        .n_group = 1,
        .n_group_used = 1,
        .gating_func = 1,
        .has_exp_probs_b = false,
        .weights_norm = false,
        .weights_scale = 1.0f,
        .context_length = 163840,
        .rope_freq_base = 10000.0f,
        .yarn_factor = 40.0f,
        .yarn_original_context = 4096,
        .yarn_beta_fast = 32.0f,
        .yarn_beta_slow = 1.0f,
        .mscale_all_dim = 0.707,
        .rms_norm_eps = 1e-6f,
        .tokenizer_pre = "deepseek-llm",
        .matrix_scale = MatrixScale::kInverseSqrtRow,
    },
    ModelPreset{
        .name = "deepseek-v3",
        .description = "DeepSeek-V3 shapes (n_embd 7168, 256 experts); 4 of 61 blocks by default, 15.1 B params",
        .n_layer = 4,
        .max_layers = 61,
        .n_leading_dense = 3,
        .n_vocab = 129280,
        .n_embd = 7168,
        .n_ff = 18432,
        .n_ff_exp = 2048,
        .n_head = 128,
        .q_lora_rank = 1536,
        .kv_lora_rank = 512,
        .qk_nope = 128,
        .qk_rope = 64,
        .v_head = 128,
        .n_expert = 256,
        .n_expert_used = 8,
        .n_expert_shared = 1,
        .n_group = 8,
        .n_group_used = 4,
        .gating_func = 2,
        .has_exp_probs_b = true,
        .weights_norm = true,
        .weights_scale = 2.5f,
        .context_length = 163840,
        .rope_freq_base = 10000.0f,
        .yarn_factor = 40.0f,
        .yarn_original_context = 4096,
        .yarn_beta_fast = 32.0f,
        .yarn_beta_slow = 1.0f,
        .mscale_all_dim = 1.0,
        .rms_norm_eps = 1e-6f,
        .tokenizer_pre = "deepseek-v3",
        .matrix_scale = MatrixScale::kInverseSqrtRow,
    },
};

}  // namespace

std::span<const ModelPreset> model_presets() { return kPresets; }

const ModelPreset* find_model_preset(std::string_view name) {
  for (const ModelPreset& p : kPresets)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace hetmoe
