#include "tools/sim_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "quant/lowbit.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/model/config.h"
#include "runtime/model/make_model.h"
#include "runtime/model/split_writer.h"

namespace hetmoe::cli {
namespace {

bool has(const std::string& name, const char* part) { return name.find(part) != std::string::npos; }

// The shapes the simulator reads from a model's hyperparameters. Attention as it runs: MLA absorbed (q.k over the
// latent and rope parts, one latent cache row per position), else per head q.k and the value sum over head_dim, keys
// and values cached per KV head.
void set_shapes(sched::SimModel& m, int64_t kv_lora_rank, int64_t qk_rope, int64_t n_head_kv, int64_t head_dim) {
  if (kv_lora_rank > 0) {
    m.attn_dim = kv_lora_rank + qk_rope;
    m.kv_width = kv_lora_rank + qk_rope;
  } else {
    m.attn_dim = head_dim;
    m.kv_width = 2 * n_head_kv * head_dim;
  }
}

// Adds one tensor to the model's parts by its name (call after n_layer and n_leading_dense are set); experts are
// summed into *expert_bytes.
void add_tensor(sched::SimModel& m, const std::string& n, double bytes, double params, double* expert_bytes) {
  const double n_moe = static_cast<double>(m.n_layer - m.n_leading_dense);
  m.file_bytes += bytes;
  if (n == "token_embd.weight") return;  // looked up, not streamed
  if (n.rfind("output", 0) == 0) {
    m.output_bytes += bytes;
    m.output_params += params;
  } else if (has(n, "_exps")) {
    *expert_bytes += bytes;
  } else if (has(n, "_shexp")) {
    m.shared_bytes += bytes / n_moe;
    m.shared_params += params / n_moe;
  } else if (has(n, "ffn_gate.") || has(n, "ffn_up.") || has(n, "ffn_down.")) {
    m.dense_bytes += bytes / std::max(1.0, static_cast<double>(m.n_leading_dense));
    m.dense_params += params / std::max(1.0, static_cast<double>(m.n_leading_dense));
  } else {  // attention, norms, router
    m.attention_bytes += bytes / static_cast<double>(m.n_layer);
    m.attention_params += params / static_cast<double>(m.n_layer);
  }
}

}  // namespace

sched::SimModel sim_model_from_preset(const std::string& preset_name, const std::string& type, int layers) {
  const ModelPreset* preset = find_model_preset(preset_name);
  if (!preset) fail("--model-config {}: not a preset (see hetmoe make-model --help)", preset_name);
  // The real model's depth (make-model's default block count is smaller for the large presets).
  const ModelPlan plan = plan_model(
      {.preset = preset_name, .out_path = "", .type = type, .layers = layers > 0 ? layers : preset->max_layers});
  const ModelPreset& p = *plan.preset;
  sched::SimModel m;
  m.name = fmt::format("{} {}", p.name, type);
  m.n_layer = plan.n_layer;
  m.n_leading_dense = plan.n_leading_dense;
  m.n_expert = p.n_expert;
  m.n_used = p.n_expert_used;
  m.n_embd = p.n_embd;
  m.n_ff_exp = p.n_ff_exp;
  m.n_head = p.n_head;
  set_shapes(m, p.kv_lora_rank, p.qk_rope, p.n_head_kv, p.head_dim);
  double expert_bytes = 0;
  for (const PlannedTensor& t : plan.tensors)
    add_tensor(m, t.name, static_cast<double>(t.nbytes()), static_cast<double>(t.n_elements()), &expert_bytes);
  m.expert_bytes = expert_bytes / static_cast<double>((m.n_layer - m.n_leading_dense) * m.n_expert);
  return m;
}

sched::SimModel sim_model_from_file(const std::string& path) {
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  if (file.find(model::kSplitVersionKey))
    fail("{}: a split file; give the model it was split from (the simulator splits it as asked)", path);
  const model::ModelConfig c = model::read_config(file);
  if (c.n_expert <= 0) fail("{}: the model has no routed experts to place", path);
  sched::SimModel m;
  m.name = c.name.empty() ? std::filesystem::path(path).filename().string() : c.name;
  m.n_layer = c.n_layer;
  m.n_leading_dense = c.n_leading_dense;
  m.n_expert = c.n_expert;
  m.n_used = c.n_expert_used;
  m.n_embd = c.n_embd;
  m.n_ff_exp = c.n_ff_exp;
  m.n_head = c.n_head;
  set_shapes(m, c.kv_lora_rank, c.qk_rope, c.n_head_kv, c.head_dim_k);
  double expert_bytes = 0;
  int64_t expert_tensors = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    // MTP blocks are not run by a forward pass.
    const std::string& n = t.name;
    if (n.rfind("blk.", 0) == 0 && std::stoll(n.substr(4)) >= c.n_layer) continue;
    if (model::is_routed_expert_tensor(n)) ++expert_tensors;
    add_tensor(m, n, static_cast<double>(t.nbytes), static_cast<double>(t.n_elements()), &expert_bytes);
  }
  if (expert_tensors == 0) fail("{}: no routed expert tensors (blk.N.ffn_*_exps.weight) found", path);
  m.expert_bytes = expert_bytes / static_cast<double>((m.n_layer - m.n_leading_dense) * m.n_expert);
  return m;
}

void set_split(sched::SimModel& m, int gpu_bits, int residual_bits, model::CriticalFrom from) {
  const auto q = quant::lowbit_type({gpu_bits, 64});
  if (!q) fail("--gpu-bits {}: use 2, 3 or 4", gpu_bits);
  const double e = static_cast<double>(m.n_embd), f = static_cast<double>(m.n_ff_exp);
  m.split_device_bytes = 2 * f * static_cast<double>(quant::row_bytes(*q, m.n_embd)) +
                         e * static_cast<double>(quant::row_bytes(*q, m.n_ff_exp));
  m.split_residual_bytes =
      2 * f * static_cast<double>(quant::row_bytes(residual_type(residual_bits, m.n_embd), m.n_embd)) +
      e * static_cast<double>(quant::row_bytes(residual_type(residual_bits, m.n_ff_exp), m.n_ff_exp));
  m.critical_from_source = from == model::CriticalFrom::kSource;
}

}  // namespace hetmoe::cli
