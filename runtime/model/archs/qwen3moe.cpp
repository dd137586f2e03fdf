// Qwen3-MoE (GGUF arch "qwen3moe"): GQA with per-head q/k RMSNorm before a NEOX-mode rope, routed experts with
// softmax gating and normalised top-k weights, no shared expert.
#include <cmath>

#include "runtime/model/archs.h"
#include "runtime/model/archs/gqa.h"

namespace hetmoe::model {

extern const ArchSpec qwen3moe_arch{
    .name = "qwen3moe",
    .configure =
        [](const ConfigKeys& k, ModelConfig& c) {
          c.n_ff_exp = k.opt_int("expert_feed_forward_length", 0);
          c.rope.neox = true;
          c.expert_weights_norm = true;
          c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
        },
    .make =
        [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
          return make_gqa_model(std::move(file), std::move(config), n_threads, GqaOptions{.qk_norm = QkNorm::kPerHead});
        },
};

}  // namespace hetmoe::model
