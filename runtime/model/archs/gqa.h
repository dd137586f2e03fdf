#pragma once

#include <memory>

#include "runtime/model/model.h"

namespace hetmoe::model {

// How q and k are normalised before the rope.
enum class QkNorm {
  kNone,
  kPerHead,          // Qwen3, GLM-4.5: RMSNorm of each head's q and k with [head_dim] weights
  kWholeProjection,  // MiniMax-M2: one RMSNorm over all heads of a token's q ([n_head * head_dim]) and of its k
};

// Grouped-query attention with rotary embeddings (qwen3moe, llama/Mixtral, glm4moe, minimax-m2).
struct GqaOptions {
  QkNorm qk_norm = QkNorm::kNone;
  bool qk_norm_optional = false;  // a layer may lack the norm tensors (GLM-4.5-Air has none)
  bool qkv_bias = false;          // attn_q / attn_k / attn_v biases (GLM-4.5)
};

std::unique_ptr<Model> make_gqa_model(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads,
                                      GqaOptions options);

}  // namespace hetmoe::model
