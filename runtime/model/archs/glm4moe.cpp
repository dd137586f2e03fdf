// GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air (GGUF arch "glm4moe"): GQA with q/k/v biases, an optional per-head q/k RMSNorm
// and a NEOX rope on part of each head; leading dense blocks, then routed experts with sigmoid gating, a selection
// bias, normalised and scaled weights, plus a shared expert. The FFN input norm is post_attention_norm. The file's
// last nextn_predict_layers blocks are the MTP (next-token prediction) head: read past by the trunk, as llama.cpp does,
// and run by Model::forward_mtp for drafts.
#include <cmath>

#include "runtime/error.h"
#include "runtime/model/archs.h"
#include "runtime/model/archs/gqa.h"

namespace hetmoe::model {

extern const ArchSpec glm4moe_arch{
    .name = "glm4moe",
    .configure =
        [](const ConfigKeys& k, ModelConfig& c) {
          drop_mtp_blocks(k, c, true);
          c.n_ff_exp = k.opt_int("expert_feed_forward_length", 0);
          c.n_expert_shared = k.opt_int("expert_shared_count", 0);
          c.n_leading_dense = k.opt_int("leading_dense_block_count", 0);
          c.ffn_norm = "post_attention_norm";
          c.rope.neox = true;
          read_expert_routing(k, c, Gating::kSigmoid);
          c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
        },
    .make =
        [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
          return make_gqa_model(std::move(file), std::move(config), n_threads,
                                GqaOptions{.qk_norm = QkNorm::kPerHead, .qk_norm_optional = true, .qkv_bias = true});
        },
};

}  // namespace hetmoe::model
