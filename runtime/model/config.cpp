#include "runtime/model/config.h"

#include <cmath>

#include "runtime/error.h"

namespace hetmoe::model {
namespace {

class Keys {
 public:
  Keys(const gguf::GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  std::string key(std::string_view k) const { return arch_ + "." + std::string(k); }
  int64_t req_int(std::string_view k) const { return f_.require_int(key(k)); }
  int64_t opt_int(std::string_view k, int64_t def) const { return f_.get_int(key(k)).value_or(def); }
  double opt_float(std::string_view k, double def) const { return f_.get_float(key(k)).value_or(def); }
  bool opt_bool(std::string_view k, bool def) const { return f_.get_bool(key(k)).value_or(def); }
  std::optional<std::string> opt_string(std::string_view k) const { return f_.get_string(key(k)); }
  const gguf::Value* find(std::string_view k) const { return f_.find(key(k)); }

 private:
  const gguf::GgufFile& f_;
  std::string arch_;
};

void check_positive(const gguf::GgufFile& f, std::string_view what, int64_t v, int64_t max) {
  if (v <= 0 || v > max) fail("{}: {} = {} is out of range (1..{})", f.path(), what, v, max);
}

// Vocabulary size: the arch key when present, else the token list's length, else token_embd's rows.
int64_t vocab_size(const gguf::GgufFile& f, const Keys& keys) {
  if (auto v = keys.opt_int("vocab_size", 0); v > 0) return v;
  if (const gguf::Value* tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->is_array())
    return static_cast<int64_t>(tokens->array_size());
  if (const gguf::TensorInfo* t = f.find_tensor("token_embd.weight"); t && t->n_dims >= 2) return t->ne[1];
  fail("{}: cannot tell the vocabulary size (no vocab_size, tokenizer or token_embd)", f.path());
}

// deepseek2's expert_feed_forward_length may be a scalar or one value per layer (all equal in known files).
int64_t expert_ff(const gguf::GgufFile& f, const Keys& keys) {
  const gguf::Value* v = keys.find("expert_feed_forward_length");
  if (!v) return 0;
  if (!v->is_array()) return keys.req_int("expert_feed_forward_length");
  int64_t ff = 0;
  for (size_t i = 0; i < v->array_size(); ++i) {
    int64_t x = v->array_int(i).value_or(0);
    if (x > 0 && ff > 0 && x != ff) fail("{}: per-layer expert_feed_forward_length values differ", f.path());
    if (x > 0) ff = x;
  }
  return ff;
}

}  // namespace

ModelConfig read_config(const gguf::GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.require_string("general.architecture");
  if (c.arch_name == "deepseek2") {
    c.arch = Arch::kDeepseek2;
  } else if (c.arch_name == "qwen3moe") {
    c.arch = Arch::kQwen3Moe;
  } else if (c.arch_name == "llama") {
    c.arch = Arch::kLlama;
  } else {
    fail("{}: unsupported architecture '{}' (supported: deepseek2, qwen3moe, llama)", f.path(), c.arch_name);
  }
  c.name = f.get_string("general.name").value_or("");
  Keys k(f, c.arch_name);

  constexpr int64_t kMaxDim = 1 << 20;
  c.n_embd = k.req_int("embedding_length");
  c.n_layer = k.req_int("block_count");
  c.n_head = k.req_int("attention.head_count");
  c.n_head_kv = k.opt_int("attention.head_count_kv", c.n_head);
  c.n_ctx_train = k.opt_int("context_length", 4096);
  c.n_vocab = vocab_size(f, k);
  check_positive(f, "embedding_length", c.n_embd, kMaxDim);
  check_positive(f, "block_count", c.n_layer, 4096);
  check_positive(f, "attention.head_count", c.n_head, 65536);
  check_positive(f, "attention.head_count_kv", c.n_head_kv, c.n_head);
  check_positive(f, "context_length", c.n_ctx_train, int64_t{1} << 32);
  check_positive(f, "vocab_size", c.n_vocab, int64_t{1} << 31);
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: head_count {} is not a multiple of head_count_kv {}", f.path(), c.n_head, c.n_head_kv);
  c.rms_eps = static_cast<float>(k.opt_float("attention.layer_norm_rms_epsilon", 1e-5));
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) fail("{}: layer_norm_rms_epsilon {} is out of range", f.path(), c.rms_eps);

  c.head_dim_k = k.opt_int("attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = k.opt_int("attention.value_length", c.n_embd / c.n_head);
  c.n_ff = k.opt_int("feed_forward_length", 0);
  c.n_expert = k.opt_int("expert_count", 0);
  c.n_expert_used = k.opt_int("expert_used_count", 0);
  if (c.n_expert < 0 || c.n_expert > 65536) fail("{}: expert_count {} is out of range", f.path(), c.n_expert);
  if (c.n_expert > 0) check_positive(f, "expert_used_count", c.n_expert_used, c.n_expert);

  // Rope defaults; archs adjust below.
  c.rope.n_dims = static_cast<int>(k.opt_int("rope.dimension_count", c.head_dim_k));
  c.rope.freq_base = static_cast<float>(k.opt_float("rope.freq_base", 10000.0));
  if (!(c.rope.freq_base > 1)) fail("{}: rope.freq_base {} is out of range", f.path(), c.rope.freq_base);

  switch (c.arch) {
    case Arch::kDeepseek2: {
      c.n_expert_shared = k.req_int("expert_shared_count");
      c.n_leading_dense = k.opt_int("leading_dense_block_count", 0);
      c.n_ff_exp = expert_ff(f, k);
      c.q_lora_rank = k.opt_int("attention.q_lora_rank", 0);
      c.kv_lora_rank = k.req_int("attention.kv_lora_rank");
      c.qk_rope = c.rope.n_dims;
      const int64_t key_mla = k.opt_int("attention.key_length_mla", 0);
      const int64_t value_mla = k.opt_int("attention.value_length_mla", 0);
      if (key_mla > 0 && value_mla > 0) {
        c.qk_nope = key_mla - c.qk_rope;
        c.v_head = value_mla;
      } else {  // legacy files: key_length is nope + rope per head, value_length is v_head
        c.qk_nope = c.head_dim_k - c.qk_rope;
        c.v_head = c.head_dim_v;
      }
      check_positive(f, "kv_lora_rank", c.kv_lora_rank, kMaxDim);
      check_positive(f, "qk_nope", c.qk_nope, kMaxDim);
      check_positive(f, "v_head", c.v_head, kMaxDim);
      const int gating = static_cast<int>(k.opt_int("expert_gating_func", 1));
      if (gating != 1 && gating != 2)
        fail("{}: expert_gating_func {} is not supported (1 softmax, 2 sigmoid)", f.path(), gating);
      c.gating = static_cast<Gating>(gating);
      c.expert_weights_norm = k.opt_bool("expert_weights_norm", false);
      c.expert_weights_scale = static_cast<float>(k.opt_float("expert_weights_scale", 0.0));
      c.n_group = k.opt_int("expert_group_count", 1);
      c.n_group_used = k.opt_int("expert_group_used_count", 1);
      if (c.n_group < 1 || c.n_group >= std::max<int64_t>(2, c.n_expert))
        if (c.n_group != 1) fail("{}: expert_group_count {} is out of range", f.path(), c.n_group);
      if (c.n_group > 1 && (c.n_expert % c.n_group != 0 || c.n_group_used <= 0 || c.n_group_used >= c.n_group))
        fail("{}: expert groups {}/{} do not fit {} experts", f.path(), c.n_group_used, c.n_group, c.n_expert);

      // YaRN as llama.cpp's deepseek2 loader applies it: beta 32/1 whatever the file says, ext_factor 1, the
      // rope magnitude kept at 1 and the whole YaRN magnitude moved into the softmax scale.
      float factor = 1.0f;
      if (k.opt_string("rope.scaling.type").value_or("none") == "yarn")
        factor = static_cast<float>(k.opt_float("rope.scaling.factor", 1.0));
      if (!(factor >= 1.0f && factor < 1e6f)) fail("{}: rope.scaling.factor {} is out of range", f.path(), factor);
      const float freq_scale = 1.0f / factor;
      const float log_mul = static_cast<float>(k.opt_float("rope.scaling.yarn_log_multiplier", 0.0));
      c.rope.freq_scale = freq_scale;
      c.rope.ext_factor = factor > 1.0f ? 1.0f : 0.0f;
      c.rope.n_ctx_orig = static_cast<int>(k.opt_int("rope.scaling.original_context_length", c.n_ctx_train));
      c.rope.beta_fast = 32.0f;
      c.rope.beta_slow = 1.0f;
      // ggml multiplies sin/cos by (1 + 0.1 ln factor) under YaRN; this attn_factor cancels it.
      c.rope.attn_factor = 1.0f / (1.0f + 0.1f * std::log(1.0f / freq_scale));
      const float mscale = 1.0f + log_mul * std::log(1.0f / freq_scale);
      c.kq_scale = mscale * mscale / std::sqrt(static_cast<float>(c.qk_nope + c.qk_rope));
      break;
    }
    case Arch::kQwen3Moe:
      c.n_ff_exp = k.opt_int("expert_feed_forward_length", 0);
      c.rope.neox = true;
      c.expert_weights_norm = true;
      c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
      break;
    case Arch::kLlama:
      c.n_ff_exp = c.n_ff;
      c.expert_weights_norm = c.n_expert > 0;
      c.kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
      break;
  }
  if (c.n_expert > 0) check_positive(f, "expert_feed_forward_length", c.n_ff_exp, kMaxDim);
  if (c.rope.n_dims <= 0 || c.rope.n_dims % 2 != 0 || c.rope.n_dims > c.head_dim_k)
    fail("{}: rope.dimension_count {} does not fit a head of {}", f.path(), c.rope.n_dims, c.head_dim_k);
  return c;
}

double active_bytes_per_token(const gguf::GgufFile& file, const ModelConfig& c) {
  double active = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.name == "token_embd.weight" && file.find_tensor("output.weight")) {
      active += static_cast<double>(t.row_bytes);
    } else if (t.name.find("_exps.") != std::string::npos && c.n_expert > 0) {
      active += static_cast<double>(t.nbytes) * static_cast<double>(c.n_expert_used) / static_cast<double>(c.n_expert);
    } else {
      active += static_cast<double>(t.nbytes);
    }
  }
  return active;
}

}  // namespace hetmoe::model
