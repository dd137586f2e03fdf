// MiniMax-M2 (GGUF arch "minimax-m2"): GQA whose q and k are RMS-normalised over the whole projection (all heads of a
// token together) before a NEOX rope on part of each head, then routed experts with sigmoid gating, a selection bias
// and always-normalised weights; no shared expert, no dense blocks.
#include <cmath>

#include "runtime/model/archs.h"
#include "runtime/model/archs/gqa.h"

namespace hetmoe::model {

extern const ArchSpec minimax_m2_arch{
    .name = "minimax-m2",
    .configure =
        [](const ConfigKeys& k, ModelConfig& c) {
          c.n_ff_exp = c.n_ff;  // the expert tensors are sized by feed_forward_length
          c.rope.neox = true;
          read_expert_routing(k, c, Gating::kSigmoid);
          c.expert_weights_norm = true;  // llama.cpp's graph normalises whatever the file says
          c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
        },
    .make =
        [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
          return make_gqa_model(std::move(file), std::move(config), n_threads,
                                GqaOptions{.qk_norm = QkNorm::kWholeProjection});
        },
};

}  // namespace hetmoe::model
