// gpt-oss (GGUF arch "gpt-oss", llama.cpp's openai-moe): GQA with q/k/v and output biases, attention sinks (one
// logit per head in each softmax's denominator), a sliding window on every other layer (the first one sliding), NEOX
// rope with YaRN in llama.cpp's generic form (the YaRN magnitude on the rope's sin and cos); routed experts only,
// chosen by the largest router logits (+ the router bias) and weighted by the softmax over the chosen ones, each
// expert with biases and the clamped SwiGLU (cpu::ExpertFfn). The FFN input norm is post_attention_norm.
#include <cmath>

#include "runtime/error.h"
#include "runtime/model/archs.h"
#include "runtime/model/archs/gqa.h"

namespace hetmoe::model {

extern const ArchSpec gpt_oss_arch{
    .name = "gpt-oss",
    .configure =
        [](const ConfigKeys& k, ModelConfig& c) {
          c.n_ff_exp = k.opt_int("expert_feed_forward_length", c.n_ff);
          c.ffn_norm = "post_attention_norm";
          c.gating = Gating::kSoftmaxSelected;
          c.clamped_swiglu = true;
          c.sliding_window = k.opt_int("attention.sliding_window", 0);
          if (c.sliding_window < 0) k.bad("attention.sliding_window", c.sliding_window, "is negative");
          c.rope.neox = true;
          if (k.opt_string("rope.scaling.type").value_or("none") == "yarn") {
            const auto factor = static_cast<float>(k.opt_float("rope.scaling.factor", 1.0));
            if (!(factor >= 1.0f && factor < 1e6f)) k.bad("rope.scaling.factor", factor, "is out of range (1..1e6)");
            c.rope.freq_scale = 1.0f / factor;
            c.rope.ext_factor = 1.0f;
            c.rope.attn_factor = 1.0f;  // the rope table then carries YaRN's 1 + 0.1 ln(factor), as llama.cpp's
            c.rope.n_ctx_orig = static_cast<int>(k.opt_int("rope.scaling.original_context_length", c.n_ctx_train));
            c.rope.beta_fast = 32.0f;  // llama.cpp's defaults; it does not read the file's keys for this arch
            c.rope.beta_slow = 1.0f;
          }
          c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
        },
    .make =
        [](std::unique_ptr<gguf::GgufFile> file, ModelConfig config, int n_threads) {
          return make_gqa_model(std::move(file), std::move(config), n_threads,
                                GqaOptions{.qkv_bias = true, .out_bias = true, .sinks = true, .swa_period = 2});
        },
};

}  // namespace hetmoe::model
