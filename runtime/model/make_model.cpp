#include "runtime/model/make_model.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <span>
#include <thread>

#include "cpu_kernels/thread_pool.h"
#include "quant/half.h"
#include "quant/ref.h"
#include "runtime/error.h"
#include "runtime/gguf/writer.h"
#include "runtime/text/bpe_vocab.h"

namespace hetmoe {
namespace {

using gguf::Value;
using quant::GgmlType;

constexpr uint32_t kQuantizationVersion = 2;  // GGML_QNT_VERSION
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64: tiny state, so each row can start its own stream and rows can be drawn in any order or thread.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() { return splitmix64_mix(state_ += kGolden); }
  double uniform_open0() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }              // [0, 1)

 private:
  uint64_t state_;
};

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string shape_string(const std::vector<int64_t>& ne) {
  std::string out = "[";
  for (size_t i = 0; i < ne.size(); ++i) out += (i ? ", " : "") + std::to_string(ne[i]);
  return out + "]";
}

// Metadata keys and order of llama.cpp's DeepSeek converter, as in the reference tiny deepseek files.
bool is_mla(const ModelPreset& p) { return p.arch == "deepseek2" || p.arch == "deepseek32"; }

// The compression ratio of DeepSeek-V4 block `il`: block 0 a sliding window only, then CSA (4) and HCA (128) in turn.
int64_t compress_ratio(int il) { return il == 0 ? 0 : il % 2 == 1 ? 4 : 128; }

// The DeepSeek converters' YaRN keys, the rope base and the norm epsilon, in their order.
void add_yarn_keys(const ModelPreset& p, const std::string& a, const std::function<void(std::string, Value)>& add) {
  add(a + "rope.scaling.type", Value::string("yarn"));
  add(a + "rope.scaling.factor", Value::f32(p.yarn_factor));
  add(a + "rope.scaling.original_context_length", Value::u32(static_cast<uint32_t>(p.yarn_original_context)));
  add(a + "rope.scaling.yarn_beta_fast", Value::f32(p.yarn_beta_fast));
  add(a + "rope.scaling.yarn_beta_slow", Value::f32(p.yarn_beta_slow));
  add(a + "rope.freq_base", Value::f32(p.rope_freq_base));
  add(a + "attention.layer_norm_rms_epsilon", Value::f32(p.rms_norm_eps));
}

// qwen35moe's and deepseek4's keys after general.name, in the order of the reference tiny files (README section 10).
void arch_metadata(const ModelPreset& p, const FileType& ft, int n_layer,
                   const std::function<void(std::string, Value)>& add) {
  const std::string a = std::string(p.arch) + ".";
  auto u32 = [](int64_t v) { return Value::u32(static_cast<uint32_t>(v)); };
  add(a + "block_count", u32(n_layer));
  add(a + "context_length", u32(p.context_length));
  add(a + "embedding_length", u32(p.n_embd));
  add(a + "attention.head_count", u32(p.n_head));
  add(a + "attention.head_count_kv", u32(p.n_head_kv));
  if (p.arch == "qwen35moe") {
    add(a + "rope.dimension_sections",
        Value::i32_array({p.rope_sections[0], p.rope_sections[1], p.rope_sections[2], p.rope_sections[3]}));
    add(a + "rope.freq_base", Value::f32(p.rope_freq_base));
    add(a + "attention.layer_norm_rms_epsilon", Value::f32(p.rms_norm_eps));
    add(a + "expert_count", u32(p.n_expert));
    add(a + "expert_used_count", u32(p.n_expert_used));
    add(a + "attention.key_length", u32(p.head_dim));
    add(a + "attention.value_length", u32(p.head_dim));
    add("general.file_type", u32(static_cast<int64_t>(ft.ftype)));
    add(a + "expert_feed_forward_length", u32(p.n_ff_exp));
    add(a + "expert_shared_feed_forward_length", u32(p.n_ff_shared));
    add(a + "ssm.conv_kernel", u32(p.ssm_conv_kernel));
    add(a + "ssm.state_size", u32(p.ssm_state));
    add(a + "ssm.group_count", u32(p.ssm_k_heads));
    add(a + "ssm.time_step_rank", u32(p.ssm_v_heads));
    add(a + "ssm.inner_size", u32(p.ssm_v_heads * p.ssm_state));
    add(a + "full_attention_interval", u32(p.full_attention_interval));
    add(a + "rope.dimension_count", u32(p.rope_dims));
    return;
  }
  add_yarn_keys(p, a, add);
  add(a + "expert_count", u32(p.n_expert));
  add(a + "expert_used_count", u32(p.n_expert_used));
  add(a + "expert_gating_func", u32(p.gating_func));
  add(a + "attention.key_length", u32(p.head_dim));
  add(a + "attention.value_length", u32(p.head_dim));
  add("general.file_type", u32(static_cast<int64_t>(ft.ftype)));
  add(a + "rope.dimension_count", u32(p.rope_dims));
  add(a + "attention.q_lora_rank", u32(p.q_lora_rank));
  add(a + "attention.sliding_window", u32(p.sliding_window));
  add(a + "expert_feed_forward_length", u32(p.n_ff_exp));
  add(a + "expert_shared_count", u32(p.n_expert_shared));
  add(a + "expert_weights_scale", Value::f32(p.weights_scale));
  add(a + "expert_weights_norm", Value::boolean(p.weights_norm));
  add(a + "swiglu_clamp_exp", Value::f32_array(std::vector<float>(static_cast<size_t>(n_layer), p.swiglu_limit)));
  add(a + "swiglu_clamp_shexp", Value::f32_array(std::vector<float>(static_cast<size_t>(n_layer), p.swiglu_limit)));
  add(a + "attention.indexer.head_count", u32(p.indexer_heads));
  add(a + "attention.indexer.key_length", u32(p.indexer_dim));
  add(a + "attention.indexer.top_k", u32(p.indexer_top_k));
  add(a + "attention.output_group_count", u32(p.out_groups));
  add(a + "attention.output_lora_rank", u32(p.out_lora_rank));
  std::vector<int32_t> ratios;
  for (int il = 0; il < n_layer; ++il) ratios.push_back(static_cast<int32_t>(compress_ratio(il)));
  add(a + "attention.compress_ratios", Value::i32_array(ratios));
  add(a + "attention.compress_rope_freq_base", Value::f32(p.compress_rope_base));
  add(a + "hyper_connection.count", u32(p.hc_streams));
  add(a + "hyper_connection.sinkhorn_iterations", u32(20));
  add(a + "hyper_connection.epsilon", Value::f32(1e-6f));
  add(a + "hash_layer_count", u32(std::min<int64_t>(p.hash_layers, n_layer)));
  add(a + "embedding_length_out", u32(p.hc_streams * p.n_embd));
}

std::vector<std::pair<std::string, Value>> build_metadata(const ModelPreset& p, const FileType& ft, int n_layer,
                                                          int n_leading_dense, int n_mtp) {
  const std::string a = std::string(p.arch) + ".";
  auto u32 = [](int64_t v) { return Value::u32(static_cast<uint32_t>(v)); };
  std::vector<std::pair<std::string, Value>> kv;
  auto add = [&kv](std::string key, Value v) { kv.emplace_back(std::move(key), std::move(v)); };

  add("general.architecture", Value::string(std::string(p.arch)));
  add("general.type", Value::string("model"));
  add("general.name", Value::string(std::string(p.name)));
  if (p.arch == "qwen35moe" || p.arch == "deepseek4") {
    arch_metadata(p, ft, n_layer, add);
  } else {
    add(a + "block_count", u32(n_layer + n_mtp));  // the converter counts the MTP blocks
    if (n_mtp > 0) add(a + "nextn_predict_layers", u32(n_mtp));
    add(a + "context_length", u32(p.context_length));
    add(a + "embedding_length", u32(p.n_embd));
    add(a + "feed_forward_length", u32(p.n_ff));
    add(a + "attention.head_count", u32(p.n_head));
    if (is_mla(p)) {                               // in the order of the reference files (README section 2.3)
      add(a + "attention.head_count_kv", u32(1));  // MLA: one latent head
      add_yarn_keys(p, a, add);
      add(a + "expert_count", u32(p.n_expert));
      add(a + "expert_used_count", u32(p.n_expert_used));
      add(a + "expert_group_count", u32(p.n_group));
      add(a + "expert_group_used_count", u32(p.n_group_used));
      add(a + "expert_gating_func", u32(p.gating_func));
      add("general.file_type", u32(static_cast<int64_t>(ft.ftype)));
      add(a + "leading_dense_block_count", u32(n_leading_dense));
      add(a + "vocab_size", u32(p.n_vocab));
      add(a + "attention.q_lora_rank", u32(p.q_lora_rank));  // 0 written explicitly: llama.cpp requires the key
      add(a + "attention.kv_lora_rank", u32(p.kv_lora_rank));
      add(a + "attention.key_length", u32(p.kv_lora_rank + p.qk_rope));
      add(a + "attention.value_length", u32(p.kv_lora_rank));
      add(a + "attention.key_length_mla", u32(p.qk_nope + p.qk_rope));
      add(a + "attention.value_length_mla", u32(p.v_head));
      add(a + "expert_feed_forward_length", u32(p.n_ff_exp));
      add(a + "expert_shared_count", u32(p.n_expert_shared));
      add(a + "expert_weights_scale", Value::f32(p.weights_scale));
      if (p.weights_norm) add(a + "expert_weights_norm", Value::boolean(true));
      add(a + "rope.dimension_count", u32(p.qk_rope));
      // The converter's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: 0.1 * mscale_all_dim, computed in double as Python does.
      add(a + "rope.scaling.yarn_log_multiplier", Value::f32(static_cast<float>(0.1 * p.mscale_all_dim)));
      if (p.indexer_heads > 0) {
        add(a + "attention.indexer.head_count", u32(p.indexer_heads));
        add(a + "attention.indexer.key_length", u32(p.indexer_dim));
        add(a + "attention.indexer.top_k", u32(p.indexer_top_k));
      }
    } else {
      add(a + "attention.head_count_kv", u32(p.n_head_kv));
      add(a + "attention.key_length", u32(p.head_dim));
      add(a + "attention.value_length", u32(p.head_dim));
      add(a + "rope.dimension_count", u32(p.rope_dims > 0 ? p.rope_dims : p.head_dim));
      if (p.yarn_factor > 1.0f) {
        add(a + "rope.scaling.type", Value::string("yarn"));
        add(a + "rope.scaling.factor", Value::f32(p.yarn_factor));
        add(a + "rope.scaling.original_context_length", u32(p.yarn_original_context));
      }
      add(a + "rope.freq_base", Value::f32(p.rope_freq_base));
      add(a + "attention.layer_norm_rms_epsilon", Value::f32(p.rms_norm_eps));
      add(a + "expert_count", u32(p.n_expert));
      add(a + "expert_used_count", u32(p.n_expert_used));
      add("general.file_type", u32(static_cast<int64_t>(ft.ftype)));
      add(a + "expert_feed_forward_length", u32(p.n_ff_exp));
      if (p.arch == "glm4moe") {
        add(a + "leading_dense_block_count", u32(n_leading_dense));
        add(a + "expert_shared_count", u32(p.n_expert_shared));
        add(a + "expert_gating_func", u32(p.gating_func));
        add(a + "expert_weights_norm", Value::boolean(p.weights_norm));
        add(a + "expert_weights_scale", Value::f32(p.weights_scale));
      } else if (p.arch == "minimax-m2") {
        add(a + "expert_gating_func", u32(p.gating_func));
      } else if (p.arch == "gpt-oss") {
        add(a + "attention.sliding_window", u32(p.sliding_window));
      }
    }
  }
  add("general.quantization_version", Value::u32(kQuantizationVersion));

  BpeVocab vocab = build_bpe_vocab({.n_vocab = p.n_vocab});
  add("tokenizer.ggml.model", Value::string("gpt2"));
  add("tokenizer.ggml.pre", Value::string(std::string(p.tokenizer_pre)));
  add("tokenizer.ggml.tokens", Value::string_array(std::move(vocab.tokens)));
  add("tokenizer.ggml.token_type", Value::i32_array(vocab.token_types));
  add("tokenizer.ggml.merges", Value::string_array(std::move(vocab.merges)));
  add("tokenizer.ggml.bos_token_id", u32(kBosTokenId));
  add("tokenizer.ggml.eos_token_id", u32(kEosTokenId));
  add("tokenizer.ggml.padding_token_id", u32(kPadTokenId));
  add("tokenizer.ggml.add_bos_token", Value::boolean(p.arch != "qwen35moe"));
  add("tokenizer.ggml.add_eos_token", Value::boolean(false));
  return kv;
}

// qwen35moe's and deepseek4's tensors after token_embd, in the order of the reference tiny files (README section 10).
void arch_tensors(const ModelPreset& p, int n_layer,
                  const std::function<void(std::string, std::vector<int64_t>)>& add) {
  const int64_t e = p.n_embd, h = p.n_head, d = p.head_dim, n_exp = p.n_expert, fe = p.n_ff_exp;
  auto experts = [&](const std::string& b, int64_t shared) {
    add(b + "ffn_gate_exps.weight", {e, fe, n_exp});
    add(b + "ffn_up_exps.weight", {e, fe, n_exp});
    add(b + "ffn_down_exps.weight", {fe, e, n_exp});
    if (p.arch == "qwen35moe") add(b + "ffn_gate_inp_shexp.weight", {e});
    add(b + "ffn_gate_shexp.weight", {e, shared});
    add(b + "ffn_up_shexp.weight", {e, shared});
    add(b + "ffn_down_shexp.weight", {shared, e});
  };
  for (int il = 0; il < n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    if (p.arch == "qwen35moe") {
      add(b + "attn_norm.weight", {e});
      if ((il + 1) % p.full_attention_interval != 0) {  // Gated DeltaNet
        const int64_t ds = p.ssm_state, hk = p.ssm_k_heads, hv = p.ssm_v_heads;
        add(b + "attn_qkv.weight", {e, 2 * hk * ds + hv * ds});
        add(b + "attn_gate.weight", {e, hv * ds});
        add(b + "ssm_conv1d.weight", {p.ssm_conv_kernel, 2 * hk * ds + hv * ds});
        add(b + "ssm_dt.bias", {hv});
        add(b + "ssm_a", {hv});
        add(b + "ssm_beta.weight", {e, hv});
        add(b + "ssm_alpha.weight", {e, hv});
        add(b + "ssm_norm.weight", {ds});
        add(b + "ssm_out.weight", {hv * ds, e});
      } else {
        add(b + "attn_q.weight", {e, 2 * h * d});
        add(b + "attn_k.weight", {e, p.n_head_kv * d});
        add(b + "attn_v.weight", {e, p.n_head_kv * d});
        add(b + "attn_output.weight", {h * d, e});
        add(b + "attn_q_norm.weight", {d});
        add(b + "attn_k_norm.weight", {d});
      }
      add(b + "post_attention_norm.weight", {e});
      add(b + "ffn_gate_inp.weight", {e, n_exp});
      experts(b, p.n_ff_shared);
      continue;
    }
    const int64_t mix = (2 + p.hc_streams) * p.hc_streams, r = compress_ratio(il), id = p.indexer_dim;
    for (const char* sub : {"hc_attn", "hc_ffn"}) {
      add(b + sub + "_fn.weight", {p.hc_streams * e, mix});
      add(b + sub + "_base.weight", {mix});
      add(b + sub + "_scale.weight", {3});
    }
    add(b + "attn_norm.weight", {e});
    add(b + "attn_sinks.weight", {h});
    add(b + "attn_q_a.weight", {e, p.q_lora_rank});
    add(b + "attn_q_a_norm.weight", {p.q_lora_rank});
    add(b + "attn_q_b.weight", {p.q_lora_rank, h * d});
    add(b + "attn_kv.weight", {e, d});
    add(b + "attn_kv_a_norm.weight", {d});
    add(b + "attn_output_a.weight", {h * d / p.out_groups, p.out_lora_rank * p.out_groups});
    add(b + "attn_output_b.weight", {p.out_groups * p.out_lora_rank, e});
    if (r > 0) {
      const int64_t cw = (r == 4 ? 2 : 1) * d;
      add(b + "attn_compressor_ape.weight", {cw, r});
      add(b + "attn_compressor_kv.weight", {e, cw});
      add(b + "attn_compressor_gate.weight", {e, cw});
      add(b + "attn_compressor_norm.weight", {d});
    }
    if (r == 4) {
      add(b + "indexer.attn_q_b.weight", {p.q_lora_rank, p.indexer_heads * id});
      add(b + "indexer.proj.weight", {e, p.indexer_heads});
      add(b + "indexer_compressor_ape.weight", {2 * id, 4});
      add(b + "indexer_compressor_kv.weight", {e, 2 * id});
      add(b + "indexer_compressor_gate.weight", {e, 2 * id});
      add(b + "indexer_compressor_norm.weight", {id});
    }
    add(b + "ffn_norm.weight", {e});
    add(b + "ffn_gate_inp.weight", {e, n_exp});
    if (il < p.hash_layers) {
      add(b + "ffn_gate_tid2eid.weight", {p.n_expert_used, p.n_vocab});
    } else {
      add(b + "exp_probs_b.bias", {n_exp});
    }
    experts(b, fe * p.n_expert_shared);
  }
  if (p.arch == "deepseek4") {
    add("output_hc_fn.weight", {p.hc_streams * e, p.hc_streams});
    add("output_hc_base.weight", {p.hc_streams});
    add("output_hc_scale.weight", {1});
  }
  add("output_norm.weight", {e});
  add("output.weight", {e, p.n_vocab});
}

// Tensor names, shapes and order of llama.cpp's converters: DeepSeek's split MLA layout (README section 2.4, plus
// DeepSeek-V3.2's indexer), and the GQA families' (section 9).
std::vector<PlannedTensor> build_tensors(const ModelPreset& p, int n_layer, int n_leading_dense, int n_mtp) {
  const int64_t e = p.n_embd;
  const int64_t h = p.n_head;
  const int64_t n_exp = p.n_expert;
  const int64_t fe = p.n_ff_exp;
  const int64_t f_shared = p.n_ff_exp * p.n_expert_shared;
  std::vector<PlannedTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> ne) {
    PlannedTensor t{.name = std::move(name), .type = GgmlType::F32, .ne = std::move(ne)};
    if (t.name.ends_with("_norm.weight") || t.name.ends_with("_scale.weight") ||
        t.name.ends_with("nextn.enorm.weight") || t.name.ends_with("nextn.hnorm.weight")) {
      t.init = WeightInit::kNorm;
    } else if (t.name.ends_with("ssm_dt.bias") || t.name.ends_with("_base.weight") || t.name.ends_with("_ape.weight")) {
      t.init = WeightInit::kSpread;
    } else if (t.name.ends_with(".ssm_a")) {
      t.init = WeightInit::kDecay;
    } else if (t.name.ends_with("ffn_gate_tid2eid.weight")) {
      t.init = WeightInit::kExpertIds;
      t.type = GgmlType::I32;
      t.n_ids = p.n_expert;
    } else if (t.name.ends_with(".bias") || t.name.ends_with("attn_sinks.weight") ||
               t.name.ends_with("ffn_gate_inp_shexp.weight")) {
      t.init = WeightInit::kBias;
    } else {
      t.init = WeightInit::kMatrix;
      const double row = static_cast<double>(t.ne[0]);
      t.scale = p.matrix_scale == MatrixScale::kConstant005 ? 0.05f : static_cast<float>(1.0 / std::sqrt(row));
    }
    out.push_back(std::move(t));
  };

  add("token_embd.weight", {e, p.n_vocab});
  if (p.arch == "qwen35moe" || p.arch == "deepseek4") {
    arch_tensors(p, n_layer, add);
    return out;
  }
  for (int il = 0; il < n_layer + n_mtp; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    add(b + "attn_norm.weight", {e});
    if (is_mla(p)) {
      if (p.q_lora_rank > 0) {
        add(b + "attn_q_a.weight", {e, p.q_lora_rank});
        add(b + "attn_q_a_norm.weight", {p.q_lora_rank});
        add(b + "attn_q_b.weight", {p.q_lora_rank, h * (p.qk_nope + p.qk_rope)});
      } else {
        add(b + "attn_q.weight", {e, h * (p.qk_nope + p.qk_rope)});
      }
      add(b + "attn_kv_a_mqa.weight", {e, p.kv_lora_rank + p.qk_rope});
      add(b + "attn_kv_a_norm.weight", {p.kv_lora_rank});
      add(b + "attn_k_b.weight", {p.qk_nope, p.kv_lora_rank, h});
      add(b + "attn_v_b.weight", {p.kv_lora_rank, p.v_head, h});
      add(b + "attn_output.weight", {h * p.v_head, e});
      if (p.indexer_heads > 0) {
        add(b + "indexer.attn_k.weight", {e, p.indexer_dim});
        add(b + "indexer.k_norm.weight", {p.indexer_dim});
        add(b + "indexer.k_norm.bias", {p.indexer_dim});
        add(b + "indexer.proj.weight", {e, p.indexer_heads});
        add(b + "indexer.attn_q_b.weight", {p.q_lora_rank, p.indexer_heads * p.indexer_dim});
      }
    } else {
      const int64_t d = p.head_dim, kv_w = p.n_head_kv * p.head_dim;
      add(b + "attn_q.weight", {e, h * d});
      if (p.qkv_bias) add(b + "attn_q.bias", {h * d});
      add(b + "attn_k.weight", {e, kv_w});
      if (p.qkv_bias) add(b + "attn_k.bias", {kv_w});
      add(b + "attn_v.weight", {e, kv_w});
      if (p.qkv_bias) add(b + "attn_v.bias", {kv_w});
      add(b + "attn_output.weight", {h * d, e});
      if (p.gpt_oss) {
        add(b + "attn_output.bias", {e});
        add(b + "attn_sinks.weight", {h});
      }
      if (p.qk_norm > 0) {
        add(b + "attn_q_norm.weight", {p.qk_norm == 1 ? d : h * d});
        add(b + "attn_k_norm.weight", {p.qk_norm == 1 ? d : kv_w});
      }
    }
    const bool post = p.arch == "glm4moe" || p.arch == "gpt-oss";
    add(b + (post ? "post_attention_norm.weight" : "ffn_norm.weight"), {e});
    if (il < n_leading_dense) {
      add(b + "ffn_gate.weight", {e, p.n_ff});
      add(b + "ffn_up.weight", {e, p.n_ff});
      add(b + "ffn_down.weight", {p.n_ff, e});
    } else {
      add(b + "ffn_gate_inp.weight", {e, n_exp});
      if (p.gpt_oss) add(b + "ffn_gate_inp.bias", {n_exp});
      if (p.has_exp_probs_b) add(b + "exp_probs_b.bias", {n_exp});
      add(b + "ffn_gate_exps.weight", {e, fe, n_exp});
      add(b + "ffn_up_exps.weight", {e, fe, n_exp});
      add(b + "ffn_down_exps.weight", {fe, e, n_exp});
      if (p.gpt_oss) {
        add(b + "ffn_gate_exps.bias", {fe, n_exp});
        add(b + "ffn_up_exps.bias", {fe, n_exp});
        add(b + "ffn_down_exps.bias", {e, n_exp});
      }
      if (p.n_expert_shared > 0) {
        add(b + "ffn_gate_shexp.weight", {e, f_shared});
        add(b + "ffn_up_shexp.weight", {e, f_shared});
        add(b + "ffn_down_shexp.weight", {f_shared, e});
      }
    }
    if (il >= n_layer) {  // an MTP block: a trunk block after its input projection, with the head's norm
      add(b + "nextn.eh_proj.weight", {2 * e, e});
      add(b + "nextn.enorm.weight", {e});
      add(b + "nextn.hnorm.weight", {e});
      add(b + "nextn.shared_head_norm.weight", {e});
    }
  }
  add("output_norm.weight", {e});
  add("output.weight", {e, p.n_vocab});
  return out;
}

void convert_row(GgmlType type, const float* src, uint8_t* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = quant::fp32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = quant::fp32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case GgmlType::I32:  // ids drawn as floats (exact small integers)
      for (int64_t i = 0; i < n; ++i) {
        const auto v = static_cast<int32_t>(src[i]);
        std::memcpy(dst + 4 * i, &v, 4);
      }
      return;
    default:
      quant::quantize_row(type, src, dst, n);
  }
}

// Generates and converts every row of `t` into `out`, `threads` workers taking chunks of about 256 K values.
// Rows are independent (generate_row), so the bytes do not depend on the thread count.
void fill_tensor(const PlannedTensor& t, uint64_t seed, int threads, std::span<uint8_t> out) {
  const int64_t n0 = t.ne[0];
  const int64_t rows = t.n_rows();
  const size_t row_bytes = quant::row_bytes(t.type, n0);
  if (out.size() != row_bytes * static_cast<size_t>(rows))
    fail("tensor {}: {} bytes to fill, {} expected", t.name, out.size(), row_bytes * static_cast<size_t>(rows));
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 18) / n0);
  const int64_t n_chunks = (rows + chunk - 1) / chunk;
  const int n_workers = static_cast<int>(std::clamp<int64_t>(threads, 1, n_chunks));

  std::atomic<int64_t> next_chunk{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n_workers));
  auto work = [&](int w) {
    try {
      std::vector<float> buf(static_cast<size_t>(n0));
      for (int64_t c; (c = next_chunk.fetch_add(1)) < n_chunks;) {
        const int64_t r_end = std::min(rows, (c + 1) * chunk);
        for (int64_t r = c * chunk; r < r_end; ++r) {
          generate_row(seed, t, r, buf.data());
          convert_row(t.type, buf.data(), out.data() + static_cast<size_t>(r) * row_bytes, n0);
        }
      }
    } catch (...) {
      errors[static_cast<size_t>(w)] = std::current_exception();
      next_chunk.store(n_chunks);  // the others stop at their next chunk
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < n_workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

int64_t PlannedTensor::n_rows() const {
  int64_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
  return rows;
}

size_t PlannedTensor::nbytes() const { return quant::row_bytes(type, ne[0]) * static_cast<size_t>(n_rows()); }

uint64_t ModelPlan::n_params() const {
  uint64_t n = 0;
  for (const PlannedTensor& t : tensors) n += static_cast<uint64_t>(t.n_elements());
  return n;
}

uint64_t ModelPlan::data_bytes() const {
  uint64_t n = 0;
  for (const PlannedTensor& t : tensors) n += t.nbytes();
  return n;
}

uint32_t crc32(std::string_view bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = kCrcTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void generate_row(uint64_t seed, const PlannedTensor& t, int64_t row, float* out) {
  const uint64_t tensor_key = splitmix64_mix(seed ^ crc32(t.name));
  SplitMix64 rng(splitmix64_mix(tensor_key ^ splitmix64_mix(static_cast<uint64_t>(row) + kGolden)));
  const int64_t n = t.ne[0];
  if (t.init == WeightInit::kExpertIds) {  // the first n of a random permutation of the experts
    std::vector<int64_t> ids(static_cast<size_t>(t.n_ids));
    for (int64_t i = 0; i < t.n_ids; ++i) ids[i] = i;
    for (int64_t i = 0; i < n; ++i) {
      const auto j = i + static_cast<int64_t>(rng.uniform() * static_cast<double>(t.n_ids - i));
      std::swap(ids[i], ids[std::min(j, t.n_ids - 1)]);
      out[i] = static_cast<float>(ids[i]);
    }
    return;
  }
  double mean = 0.0;
  double sd = 0.0;
  switch (t.init) {
    case WeightInit::kMatrix:
      sd = t.scale;
      break;
    case WeightInit::kNorm:
      mean = 1.0;
      sd = 0.1;
      break;
    case WeightInit::kBias:
      sd = 0.05;
      break;
    case WeightInit::kSpread:
    case WeightInit::kDecay:
      sd = 0.5;
      break;
    case WeightInit::kExpertIds:
      break;
  }
  constexpr double kTwoPi = 6.283185307179586476925;
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller: two normals per pair of uniforms
    const double r = std::sqrt(-2.0 * std::log(rng.uniform_open0()));
    const double phi = kTwoPi * rng.uniform();
    out[i] = static_cast<float>(mean + sd * r * std::cos(phi));
    if (i + 1 < n) out[i + 1] = static_cast<float>(mean + sd * r * std::sin(phi));
  }
  if (t.init == WeightInit::kDecay)
    for (int64_t i = 0; i < n; ++i) out[i] = -std::exp(out[i]);
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets()) names.emplace_back(p.name);
  return names;
}

std::vector<std::string> file_type_names() {
  std::vector<std::string> names;
  for (const FileType& ft : file_types()) names.emplace_back(ft.name);
  return names;
}

ModelPlan plan_model(const MakeModelOptions& opt) {
  const ModelPreset* preset = find_model_preset(opt.preset);
  if (!preset) fail("unknown preset '{}' (known: {})", opt.preset, join(preset_names()));
  const FileType* ft = find_file_type(opt.type);
  if (!ft) fail("unknown file type '{}' (known: {})", opt.type, join(file_type_names()));
  const int n_layer = opt.layers < 0 ? preset->n_layer : opt.layers;
  if (n_layer < 1 || n_layer > preset->max_layers)
    fail("--layers {} is out of range for preset {} (1..{})", opt.layers, preset->name, preset->max_layers);

  ModelPlan plan;
  plan.preset = preset;
  plan.file_type = ft;
  plan.n_layer = n_layer;
  // Keep at least one MoE block: a truncated model still exercises the routing.
  plan.n_leading_dense = std::min(preset->n_leading_dense, n_layer - 1);
  plan.seed = opt.seed;
  if (opt.mtp) {
    if (preset->arch != "deepseek2" && preset->arch != "deepseek32" && preset->arch != "glm4moe")
      fail("--mtp: preset {} ({}) has no MTP block here (deepseek2, deepseek32 and glm4moe presets do)", preset->name,
           preset->arch);
    plan.n_mtp = 1;
  }
  plan.metadata = build_metadata(*preset, *ft, plan.n_layer, plan.n_leading_dense, plan.n_mtp);
  plan.tensors = build_tensors(*preset, plan.n_layer, plan.n_leading_dense, plan.n_mtp);
  TensorTypeWalk types(*ft, plan.n_layer + plan.n_mtp, preset->n_expert,
                       preset->n_head_kv > 0 ? preset->n_head / preset->n_head_kv : 1);
  for (PlannedTensor& t : plan.tensors)
    if (t.type != GgmlType::I32) t.type = types.next(t.name, t.ne);  // an id table stays I32
  return plan;
}

void make_model(const MakeModelOptions& opt, const std::function<void(const std::string& line)>& log) {
  if (opt.out_path.empty()) fail("make-model: no output path given");
  const auto start = std::chrono::steady_clock::now();
  ModelPlan plan = plan_model(opt);
  const int threads = cpu::resolve_threads(opt.threads);
  if (log)
    log(fmt::format("{} {}: {} blocks ({} dense){}, {:.3f} B parameters, {:.1f} MB of tensor data, seed {}",
                    plan.preset->name, plan.file_type->name, plan.n_layer, plan.n_leading_dense,
                    plan.n_mtp > 0 ? fmt::format(" and {} MTP block", plan.n_mtp) : "", plan.n_params() * 1e-9,
                    plan.data_bytes() / 1e6, plan.seed));

  gguf::GgufWriter writer;
  for (auto& [key, value] : plan.metadata) writer.set(key, std::move(value));
  const size_t n_tensors = plan.tensors.size();
  for (size_t i = 0; i < n_tensors; ++i) {
    const PlannedTensor& t = plan.tensors[i];
    writer.add_tensor(t.name, t.type, t.ne, [&t, i, n_tensors, &plan, threads, &log](std::span<uint8_t> out) {
      fill_tensor(t, plan.seed, threads, out);
      if (log)
        log(fmt::format("[{:>4}/{}] {:<32} {:<6} {:<20} {:>10.2f} MB", i + 1, n_tensors, t.name,
                        quant::type_info(t.type).name, shape_string(t.ne), t.nbytes() / 1e6));
    });
  }
  const std::vector<std::string> written = writer.write(opt.out_path, opt.max_shard_bytes);
  if (log) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = written.size() == 1
                                 ? written.front()
                                 : fmt::format("{} shards, {} ... {}", written.size(), written.front(), written.back());
    log(fmt::format("wrote {} ({} tensors) in {:.1f} s", what, n_tensors, secs));
  }
}

}  // namespace hetmoe
