// Qwen3-MoE (GGUF arch "qwen3moe"): GQA with per-head q/k RMSNorm before a NEOX-mode rope, routed experts with
// softmax gating and normalised top-k weights, no shared expert.
#include "runtime/model/archs.h"
#include "runtime/model/gqa.h"

namespace hetmoe::model {

std::unique_ptr<Model> make_qwen3moe(std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
  return make_gqa_model(std::move(file), std::move(config), n_threads, GqaOptions{.qk_norm = true});
}

}  // namespace hetmoe::model
