#include "runtime/model/presets.h"

#include <array>

namespace hetmoe {
namespace {

// DeepSeek-V3.2 is DeepSeek-V3 plus the lightning indexer.
constexpr ModelPreset with_indexer(ModelPreset p, std::string_view name, std::string_view description, int64_t heads,
                                   int64_t dim, int64_t top_k) {
  p.name = name;
  p.description = description;
  p.arch = "deepseek32";
  p.indexer_heads = heads;
  p.indexer_dim = dim;
  p.indexer_top_k = top_k;
  return p;
}

constexpr ModelPreset kTinyDeepseekV3{
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
};

constexpr ModelPreset kDeepseekV3{
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
};

// The GQA families: the tiny ones have the dimensions of the reference models of README section 9 (and 2.3 for
// Qwen3), the real ones those of the published config.json files (all their blocks available through --layers; a
// few by default).
constexpr ModelPreset gqa(std::string_view arch, std::string_view name, std::string_view description) {
  ModelPreset p{};
  p.arch = arch;
  p.name = name;
  p.description = description;
  p.n_group = 1;
  p.n_group_used = 1;
  p.gating_func = 2;
  p.weights_scale = 1.0f;
  p.rms_norm_eps = 1e-5f;
  p.matrix_scale = MatrixScale::kInverseSqrtRow;
  return p;
}

constexpr ModelPreset glm4moe(std::string_view name, std::string_view description, int layers, int max_layers,
                              int dense, int64_t vocab, int64_t embd, int64_t heads, int64_t kv, int64_t ff,
                              int64_t ff_exp, int64_t experts, bool qk_norm, float scale) {
  ModelPreset p = gqa("glm4moe", name, description);
  p.n_layer = layers;
  p.max_layers = max_layers;
  p.n_leading_dense = dense;
  p.n_vocab = vocab;
  p.n_embd = embd;
  p.n_head = heads;
  p.n_head_kv = kv;
  p.head_dim = embd == 256 ? 64 : 128;
  p.rope_dims = p.head_dim / 2;
  p.n_ff = ff;
  p.n_ff_exp = ff_exp;
  p.n_expert = experts;
  p.n_expert_used = embd == 256 ? 4 : 8;
  p.n_expert_shared = 1;
  p.has_exp_probs_b = true;
  p.weights_norm = true;
  p.weights_scale = scale;
  p.qk_norm = qk_norm ? 1 : 0;
  p.qkv_bias = true;
  p.context_length = embd == 256 ? 202752 : 131072;
  p.rope_freq_base = 1e6f;
  p.tokenizer_pre = "glm4";
  return p;
}

constexpr ModelPreset gpt_oss(std::string_view name, std::string_view description, int layers, int max_layers,
                              int64_t vocab, int64_t embd, int64_t heads, int64_t kv, int64_t ff, int64_t experts,
                              int64_t window) {
  ModelPreset p = gqa("gpt-oss", name, description);
  p.n_layer = layers;
  p.max_layers = max_layers;
  p.n_vocab = vocab;
  p.n_embd = embd;
  p.n_head = heads;
  p.n_head_kv = kv;
  p.head_dim = 64;
  p.n_ff = ff;
  p.n_ff_exp = ff;
  p.n_expert = experts;
  p.n_expert_used = 4;
  p.gating_func = 1;
  p.qkv_bias = true;
  p.gpt_oss = true;
  p.sliding_window = window;
  p.context_length = 131072;
  p.rope_freq_base = 150000.0f;
  p.yarn_factor = 32.0f;
  p.yarn_original_context = 4096;
  p.tokenizer_pre = "gpt-4o";
  return p;
}

constexpr ModelPreset minimax_m2(std::string_view name, std::string_view description, int layers, int max_layers,
                                 int64_t vocab, int64_t embd, int64_t heads, int64_t kv, int64_t head_dim, int64_t ff,
                                 int64_t experts, int64_t used) {
  ModelPreset p = gqa("minimax-m2", name, description);
  p.n_layer = layers;
  p.max_layers = max_layers;
  p.n_vocab = vocab;
  p.n_embd = embd;
  p.n_head = heads;
  p.n_head_kv = kv;
  p.head_dim = head_dim;
  p.rope_dims = head_dim / 2;
  p.n_ff = ff;  // the expert tensors are sized by feed_forward_length
  p.n_ff_exp = ff;
  p.n_expert = experts;
  p.n_expert_used = used;
  p.has_exp_probs_b = true;
  p.qk_norm = 2;
  p.context_length = 196608;
  p.rope_freq_base = 5e6f;
  p.rms_norm_eps = 1e-6f;
  p.tokenizer_pre = "minimax-m2";
  return p;
}

constexpr ModelPreset qwen3_235b() {
  ModelPreset p = gqa("qwen3moe", "qwen3-235b", "Qwen3-235B-A22B shapes (n_embd 4096, 128 experts); 4 of 94 blocks");
  p.n_layer = 4;
  p.max_layers = 94;
  p.n_vocab = 151936;
  p.n_embd = 4096;
  p.n_head = 64;
  p.n_head_kv = 4;
  p.head_dim = 128;
  p.n_ff = 12288;
  p.n_ff_exp = 1536;
  p.n_expert = 128;
  p.n_expert_used = 8;
  p.gating_func = 1;
  p.weights_norm = true;
  p.qk_norm = 1;
  p.context_length = 40960;
  p.rope_freq_base = 1e6f;
  p.rms_norm_eps = 1e-6f;
  p.tokenizer_pre = "qwen2";
  return p;
}

// Qwen3.5-MoE: the tiny one has the reference tiny-qwen35moe's dimensions (README section 10.4, without its MTP
// block); the real ones those of the published model cards (Qwen3.5-35B-A3B, Qwen3.5-397B-A17B).
constexpr ModelPreset qwen35moe(std::string_view name, std::string_view description, int layers, int max_layers,
                                int64_t vocab, int64_t embd, int64_t heads, int64_t kv, int64_t head_dim,
                                int64_t rope_dims, int64_t ff_exp, int64_t experts, int64_t used, int64_t k_heads,
                                int64_t v_heads, int64_t state) {
  ModelPreset p = gqa("qwen35moe", name, description);
  p.n_layer = layers;
  p.max_layers = max_layers;
  p.n_vocab = vocab;
  p.n_embd = embd;
  p.n_head = heads;
  p.n_head_kv = kv;
  p.head_dim = head_dim;
  p.rope_dims = rope_dims;
  // Qwen3.5's mrope_section [11, 11, 10] over 32 pairs, scaled to the toy's 8 pairs as its file has them ([3, 3, 2]).
  const int pairs = static_cast<int>(rope_dims / 2);
  p.rope_sections[0] = p.rope_sections[1] = (pairs * 11 + 31) / 32;
  p.rope_sections[2] = pairs - 2 * p.rope_sections[0];
  p.n_ff_exp = ff_exp;
  p.n_ff_shared = embd == 256 ? 64 : ff_exp;
  p.n_expert = experts;
  p.n_expert_used = used;
  p.n_expert_shared = 1;
  p.gating_func = 1;
  p.weights_norm = true;
  p.qk_norm = 1;
  p.ssm_conv_kernel = 4;
  p.ssm_state = state;
  p.ssm_k_heads = k_heads;
  p.ssm_v_heads = v_heads;
  p.full_attention_interval = 4;
  p.context_length = 262144;
  p.rope_freq_base = 1e7f;
  p.rms_norm_eps = 1e-6f;
  p.tokenizer_pre = "qwen35";
  p.matrix_scale = embd == 256 ? MatrixScale::kConstant005 : MatrixScale::kInverseSqrtRow;
  return p;
}

// DeepSeek-V4: the tiny one has the reference tiny-deepseek4's dimensions (README section 10.5.1); the real one the
// DeepSeek-V4-Flash values that README recalls (not checked against the release): the compression pattern (block 0
// a window only, then ratios 4 and 128 in turn) is the tiny model's, generalised.
constexpr ModelPreset deepseek4(std::string_view name, std::string_view description, int layers, int max_layers,
                                int64_t vocab, int64_t embd, int64_t heads, int64_t head_dim, int64_t rope_dims,
                                int64_t q_lora, int64_t groups, int64_t out_lora, int64_t window, int64_t ix_heads,
                                int64_t ix_top_k, int64_t experts, int64_t used, int64_t ff_exp, int64_t hash) {
  ModelPreset p{};
  p.arch = "deepseek4";
  p.name = name;
  p.description = description;
  p.n_layer = layers;
  p.max_layers = max_layers;
  p.n_vocab = vocab;
  p.n_embd = embd;
  p.n_head = heads;
  p.n_head_kv = 1;
  p.head_dim = head_dim;
  p.rope_dims = rope_dims;
  p.q_lora_rank = q_lora;
  p.out_groups = groups;
  p.out_lora_rank = out_lora;
  p.sliding_window = window;
  p.indexer_heads = ix_heads;
  p.indexer_dim = 128;
  p.indexer_top_k = ix_top_k;
  p.n_expert = experts;
  p.n_expert_used = used;
  p.n_expert_shared = 1;
  p.n_ff_exp = ff_exp;
  p.n_group = 1;
  p.n_group_used = 1;
  p.gating_func = 4;
  p.has_exp_probs_b = true;
  p.weights_norm = true;
  p.weights_scale = 1.5f;
  p.hash_layers = hash;
  p.hc_streams = 4;
  p.swiglu_limit = 10.0f;
  p.context_length = 1048576;
  p.rope_freq_base = 10000.0f;
  p.compress_rope_base = 160000.0f;
  p.yarn_factor = 16.0f;
  p.yarn_original_context = embd == 256 ? 512 : 65536;
  p.rms_norm_eps = 1e-6f;
  p.tokenizer_pre = "deepseek-v3";
  p.matrix_scale = embd == 256 ? MatrixScale::kConstant005 : MatrixScale::kInverseSqrtRow;
  return p;
}

// tiny-deepseek-v3: the hyperparameters of the reference tiny-deepseek3 (README section 2.3), the quick-start model.
// deepseek-v2-lite and deepseek-v3: the dimensions of the published HF config.json files; the V3 preset keeps only
// 4 of its 61 blocks by default (3 dense + 1 MoE, about 15 B parameters), --layers gives more.
constexpr std::array kPresets = {
    kTinyDeepseekV3,
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
    kDeepseekV3,
    ModelPreset{
        .name = "kimi-k2",
        .description = "Kimi-K2 shapes (n_embd 7168, 384 experts, no groups); 2 of 61 blocks by default",
        .n_layer = 2,
        .max_layers = 61,
        .n_leading_dense = 1,
        .n_vocab = 163840,
        .n_embd = 7168,
        .n_ff = 18432,
        .n_ff_exp = 2048,
        .n_head = 64,
        .q_lora_rank = 1536,
        .kv_lora_rank = 512,
        .qk_nope = 128,
        .qk_rope = 64,
        .v_head = 128,
        .n_expert = 384,
        .n_expert_used = 8,
        .n_expert_shared = 1,
        .n_group = 1,
        .n_group_used = 1,
        .gating_func = 2,
        .has_exp_probs_b = true,
        .weights_norm = true,
        .weights_scale = 2.827f,
        .context_length = 131072,
        .rope_freq_base = 50000.0f,
        .yarn_factor = 32.0f,
        .yarn_original_context = 4096,
        .yarn_beta_fast = 1.0f,
        .yarn_beta_slow = 1.0f,
        .mscale_all_dim = 1.0,
        .rms_norm_eps = 1e-6f,
        .tokenizer_pre = "kimi-k2",
        .matrix_scale = MatrixScale::kInverseSqrtRow,
    },
    with_indexer(kTinyDeepseekV3, "tiny-deepseek-v3.2",
                 "DeepSeek-V3.2-like toy: tiny-deepseek-v3 plus an indexer of 8 heads x 64, top 8", 8, 64, 8),
    with_indexer(kDeepseekV3, "deepseek-v3.2",
                 "DeepSeek-V3.2 shapes: deepseek-v3 plus its indexer (64 heads x 128, top 2048)", 64, 128, 2048),
    glm4moe("tiny-glm4moe", "GLM-4.6-like toy (n_embd 256, 3 blocks, 12 experts + 1 shared, q/k/v biases, q/k norm)", 3,
            64, 1, 512, 256, 6, 2, 256, 64, 12, true, 2.5f),
    glm4moe("glm-4.5", "GLM-4.5 shapes (n_embd 5120, 160 experts + 1 shared); 4 of 92 blocks by default", 4, 92, 3,
            151552, 5120, 96, 8, 12288, 1536, 160, true, 2.5f),
    glm4moe("glm-4.5-air", "GLM-4.5-Air shapes (n_embd 4096, 128 experts + 1 shared); 4 of 46 blocks by default", 4, 46,
            1, 151552, 4096, 96, 8, 10944, 1408, 128, false, 1.0f),
    gpt_oss("tiny-gpt-oss", "gpt-oss-like toy (n_embd 256, 2 blocks, 16 experts, sinks, sliding window 8)", 2, 64, 512,
            256, 6, 2, 64, 16, 8),
    gpt_oss("gpt-oss-120b", "gpt-oss-120b shapes (n_embd 2880, 128 experts, window 128); 4 of 36 blocks by default", 4,
            36, 201088, 2880, 64, 8, 2880, 128, 128),
    minimax_m2("tiny-minimax-m2",
               "MiniMax-M2-like toy (n_embd 256, 2 blocks, 32 experts, q/k norm over the projection)", 2, 64, 512, 256,
               6, 2, 64, 32, 32, 8),
    minimax_m2("minimax-m2", "MiniMax-M2 shapes (n_embd 3072, 256 experts); 4 of 62 blocks by default", 4, 62, 200064,
               3072, 48, 8, 128, 1536, 256, 8),
    qwen3_235b(),
    qwen35moe("tiny-qwen3.5-moe",
              "Qwen3.5-MoE-like toy (n_embd 256, 3 Gated DeltaNet + 1 attention block, 8 experts + gated shared)", 4,
              64, 512, 256, 4, 2, 64, 16, 32, 8, 2, 2, 4, 32),
    qwen35moe("mini-qwen3.5-moe",
              "tiny-qwen3.5-moe with experts 64 wide, the least a split group takes (for split and device tests)", 4,
              64, 512, 256, 4, 2, 64, 16, 64, 8, 2, 2, 4, 32),
    qwen35moe("qwen3.5-35b-a3b",
              "Qwen3.5-35B-A3B shapes (n_embd 2048, 256 experts, DeltaNet:attention 3:1); 8 of 40 blocks by default", 8,
              40, 248320, 2048, 16, 2, 256, 64, 512, 256, 8, 16, 32, 128),
    qwen35moe("qwen3.5-397b-a17b", "Qwen3.5-397B-A17B shapes (n_embd 4096, 512 experts); 4 of 60 blocks by default", 4,
              60, 248320, 4096, 32, 2, 256, 64, 1024, 512, 10, 16, 64, 128),
    deepseek4("tiny-deepseek-v4",
              "DeepSeek-V4-like toy (n_embd 256, 4 blocks: window, CSA, HCA, CSA; hyper-connections, 8 experts)", 4, 64,
              512, 256, 8, 64, 16, 128, 4, 64, 8, 8, 2, 8, 2, 32, 1),
    deepseek4("mini-deepseek-v4",
              "tiny-deepseek-v4 with experts 64 wide, the least a split group takes (for split and device tests)", 4,
              64, 512, 256, 8, 64, 16, 128, 4, 64, 8, 8, 2, 8, 2, 64, 1),
    deepseek4("deepseek-v4-flash",
              "DeepSeek-V4-Flash shapes as recalled (n_embd 4096, 256 experts, head 512); 4 of 43 blocks by default", 4,
              43, 129280, 4096, 64, 512, 64, 1024, 8, 1024, 128, 64, 512, 256, 6, 2048, 3),
};

}  // namespace

std::span<const ModelPreset> model_presets() { return kPresets; }

const ModelPreset* find_model_preset(std::string_view name) {
  for (const ModelPreset& p : kPresets)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace hetmoe
