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
  bool qkv_bias = false;          // attn_q / attn_k / attn_v biases (GLM-4.5, gpt-oss)
  bool out_bias = false;          // attn_output bias (gpt-oss)
  bool sinks = false;             // attn_sinks: one logit per head in each softmax's denominator (gpt-oss)
  // Sliding-window attention on every layer l with l % swa_period == 0 (gpt-oss: period 2, the first layer
  // sliding); the window is ModelConfig::sliding_window. 0: no sliding layers.
  int swa_period = 0;
};

std::unique_ptr<Model> make_gqa_model(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads,
                                      GqaOptions options);

}  // namespace hetmoe::model
