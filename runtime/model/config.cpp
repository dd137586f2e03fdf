#include "runtime/model/config.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "runtime/error.h"
#include "runtime/model/archs.h"
#include "runtime/model/file_types.h"

namespace hetmoe::model {
namespace {

// Vocabulary size: the token list's length (as llama.cpp), which the arch key must then agree with; else the arch
// key; else token_embd's rows. The embedding and the output matrix are checked against it when the model binds
// them: a tokenizer of fewer tokens than the embedding has rows would fail only once such an id was sampled.
int64_t vocab_size(const gguf::GgufFile& f, const ConfigKeys& keys) {
  const int64_t key = keys.opt_int("vocab_size", 0);
  if (const gguf::Value* tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->is_array()) {
    const auto n = static_cast<int64_t>(tokens->array_size());
    if (key > 0 && key != n)
      keys.bad("vocab_size", key, fmt::format("differs from the {} entries of tokenizer.ggml.tokens", n));
    return n;
  }
  if (key > 0) return key;
  if (const gguf::TensorInfo* t = f.find_tensor("token_embd.weight"); t && t->n_dims >= 2) return t->ne[1];
  fail("{}: cannot tell the vocabulary size (no vocab_size, tokenizer or token_embd)", f.path());
}

}  // namespace

void ConfigKeys::check_positive(std::string_view k, int64_t v, int64_t max) const {
  if (v <= 0 || v > max) bad(k, v, fmt::format("is out of range (1..{})", max));
}

ModelConfig read_config(const gguf::GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.require_string("general.architecture");
  const ArchSpec* arch = find_arch(c.arch_name);
  if (!arch) fail("{}: unsupported architecture '{}' (supported: {})", f.path(), c.arch_name, arch_names());
  c.name = f.get_string("general.name").value_or("");
  const ConfigKeys k(f, c.arch_name);
  constexpr int64_t kMaxDim = ConfigKeys::kMaxDim;
  c.n_embd = k.req_int("embedding_length");
  c.n_layer = k.req_int("block_count");
  c.n_head = k.req_int("attention.head_count");
  c.n_head_kv = k.opt_int("attention.head_count_kv", c.n_head);
  c.n_ctx_train = k.opt_int("context_length", 4096);
  c.n_vocab = vocab_size(f, k);
  k.check_positive("embedding_length", c.n_embd, kMaxDim);
  k.check_positive("block_count", c.n_layer, 4096);
  k.check_positive("attention.head_count", c.n_head, 65536);
  k.check_positive("attention.head_count_kv", c.n_head_kv, c.n_head);
  k.check_positive("context_length", c.n_ctx_train, int64_t{1} << 32);
  k.check_positive("vocab_size", c.n_vocab, int64_t{1} << 31);
  if (c.n_head % c.n_head_kv != 0)
    k.bad("attention.head_count_kv", c.n_head_kv,
          fmt::format("does not divide {} = {}", k.key("attention.head_count"), c.n_head));
  const double eps = k.opt_float("attention.layer_norm_rms_epsilon", 1e-5);
  // Bounds a float holds: a double of 1e-50 would become 0, one just under 1 would become 1.
  if (!(eps >= 1e-30 && eps <= 0.5)) k.bad("attention.layer_norm_rms_epsilon", eps, "is out of range (1e-30..0.5)");
  c.rms_eps = static_cast<float>(eps);

  c.head_dim_k = k.opt_int("attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = k.opt_int("attention.value_length", c.n_embd / c.n_head);
  k.check_positive("attention.key_length", c.head_dim_k, kMaxDim);
  k.check_positive("attention.value_length", c.head_dim_v, kMaxDim);
  c.n_ff = k.opt_int("feed_forward_length", 0);
  if (c.n_ff < 0 || c.n_ff > kMaxDim)
    k.bad("feed_forward_length", c.n_ff, fmt::format("is out of range (0..{})", kMaxDim));
  c.n_expert = k.opt_int("expert_count", 0);
  c.n_expert_used = k.opt_int("expert_used_count", 0);
  if (c.n_expert < 0 || c.n_expert > 65536) k.bad("expert_count", c.n_expert, "is out of range (0..65536)");
  if (c.n_expert > 0) k.check_positive("expert_used_count", c.n_expert_used, c.n_expert);

  // Rope defaults; archs adjust below.
  c.rope.n_dims = static_cast<int>(k.opt_int("rope.dimension_count", c.head_dim_k));
  const double base = k.opt_float("rope.freq_base", 10000.0);
  if (!(base > 1 && base < 1e12)) k.bad("rope.freq_base", base, "is out of range (1..1e12)");
  c.rope.freq_base = static_cast<float>(base);

  arch->configure(k, c);
  if (c.n_expert > 0) k.check_positive("expert_feed_forward_length", c.n_ff_exp, kMaxDim);
  // The shared experts run as one FFN of n_expert_shared * n_ff_exp rows.
  const int64_t max_shared = kMaxDim / std::max<int64_t>(c.n_ff_exp, 1);
  if (c.n_expert_shared < 0 || c.n_expert_shared > max_shared)
    k.bad("expert_shared_count", c.n_expert_shared,
          fmt::format("is out of range (0..{}: the shared experts' width is at most {})", max_shared, kMaxDim));
  if (c.rope.n_dims <= 0 || c.rope.n_dims % 2 != 0 || c.rope.n_dims > c.head_dim_k)
    k.bad("rope.dimension_count", c.rope.n_dims,
          fmt::format("does not fit a head of {} = {} (an even count up to it)", k.key("attention.key_length"),
                      c.head_dim_k));
  return c;
}

void drop_mtp_blocks(const ConfigKeys& k, ModelConfig& c, bool drafts) {
  const int64_t nextn = k.opt_int("nextn_predict_layers", 0);
  if (nextn < 0 || nextn >= c.n_layer)
    k.bad("nextn_predict_layers", nextn, fmt::format("leaves no trunk of the {} blocks", c.n_layer));
  c.n_layer -= nextn;
  if (drafts && nextn > 0 && k.file().find_tensor("blk." + std::to_string(c.n_layer) + ".nextn.eh_proj.weight"))
    c.n_mtp = nextn;
}

void read_expert_routing(const ConfigKeys& k, ModelConfig& c, Gating default_gating) {
  // These architectures are mixtures of experts: the routing keys below mean nothing without experts.
  k.check_positive("expert_count", c.n_expert, 65536);
  const int64_t gating = k.opt_int("expert_gating_func", static_cast<int>(default_gating));
  if (gating != 1 && gating != 2) k.bad("expert_gating_func", gating, "is not supported (1 softmax, 2 sigmoid)");
  c.gating = static_cast<Gating>(gating);
  c.expert_weights_norm = k.opt_bool("expert_weights_norm", false);
  const double scale = k.opt_float("expert_weights_scale", 0.0);
  if (!(scale >= 0 && scale < 1e6)) k.bad("expert_weights_scale", scale, "is out of range (0 or more)");
  c.expert_weights_scale = static_cast<float>(scale);
  c.n_group = k.opt_int("expert_group_count", 1);
  c.n_group_used = k.opt_int("expert_group_used_count", 1);
  if (c.n_group != 1 && (c.n_group < 1 || c.n_group >= std::max<int64_t>(2, c.n_expert) || c.n_expert % c.n_group))
    k.bad("expert_group_count", c.n_group,
          fmt::format("does not divide {} = {} into groups", k.key("expert_count"), c.n_expert));
  if (c.n_group > 1 && (c.n_group_used <= 0 || c.n_group_used >= c.n_group))
    k.bad("expert_group_used_count", c.n_group_used,
          fmt::format("is out of range (1..{}, below {})", c.n_group - 1, k.key("expert_group_count")));
}

ActiveBytes active_bytes_by_part(const gguf::GgufFile& file, const ModelConfig& c) {
  ActiveBytes b;
  const bool separate_head = file.find_tensor("output.weight") != nullptr;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const int layer = layer_of(t.name);
    // The blocks past the trunk (an MTP head) run only for drafts, not in a decode step.
    if (layer >= c.n_layer) continue;
    const auto bytes = static_cast<double>(t.nbytes);
    if (t.name == "token_embd.weight") {
      // One row looked up, or the whole matrix when it is the output head too.
      if (separate_head)
        b.rest += static_cast<double>(t.row_bytes);
      else
        b.output += bytes;
      continue;
    }
    if (layer < 0) {
      (t.name.starts_with("output") ? b.output : b.rest) += bytes;
      continue;
    }
    const std::string_view name = std::string_view(t.name).substr(t.name.find('.', 4) + 1);  // past "blk.N."
    if (name.starts_with("attn_norm.") || name.starts_with("ffn_norm.") || name.starts_with("post_attention_norm.") ||
        name.starts_with("hc_")) {
      b.rest += bytes;
    } else if (name.starts_with("ffn_") || name.starts_with("exp_probs")) {
      const bool routed = name.find("_exps.") != std::string_view::npos && c.n_expert > 0;
      const double read =
          routed ? bytes * static_cast<double>(c.n_expert_used) / static_cast<double>(c.n_expert) : bytes;
      (c.is_moe_layer(layer) ? b.moe_ffn : b.dense_ffn) += read;
    } else {
      b.attention += bytes;
    }
  }
  return b;
}

double active_bytes_per_token(const gguf::GgufFile& file, const ModelConfig& c) {
  return active_bytes_by_part(file, c).total();
}

}  // namespace hetmoe::model
