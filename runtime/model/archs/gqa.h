#pragma once

#include <memory>

#include "runtime/model/model.h"

namespace hetmoe::model {

// Grouped-query attention with rotary embeddings, shared by qwen3moe and llama (Mixtral). qk_norm adds Qwen3's
// per-head RMSNorm of q and k before the rope.
struct GqaOptions {
  bool qk_norm = false;
};

std::unique_ptr<Model> make_gqa_model(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads,
                                      GqaOptions options);

}  // namespace hetmoe::model
