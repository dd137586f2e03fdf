#pragma once

#include <memory>

#include "runtime/model/model.h"

namespace hetmoe::model {

// One per architecture file; each binds its tensors (failing on a missing or misshapen one).
std::unique_ptr<Model> make_deepseek2(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads);
std::unique_ptr<Model> make_qwen3moe(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads);
std::unique_ptr<Model> make_llama(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads);

}  // namespace hetmoe::model
