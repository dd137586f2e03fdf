// Llama-family models (GGUF arch "llama"), including Mixtral's experts: GQA with a NORM-mode rope on the permuted
// q/k rows the converter writes, dense or routed SwiGLU FFN with softmax gating and normalised top-k weights.
#include <cmath>

#include "runtime/model/archs.h"
#include "runtime/model/archs/gqa.h"

namespace hetmoe::model {

extern const ArchSpec llama_arch{
    .name = "llama",
    .configure =
        [](const ConfigKeys&, ModelConfig& c) {
          c.n_ff_exp = c.n_ff;  // Mixtral's experts are as wide as the dense FFN would be
          c.expert_weights_norm = c.n_expert > 0;
          c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
        },
    .make = [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config,
               int n_threads) { return make_gqa_model(std::move(file), std::move(config), n_threads, GqaOptions{}); },
};

}  // namespace hetmoe::model
