#include <fmt/format.h>

#include <algorithm>

#include "runtime/gguf/reader.h"
#include "runtime/model/config.h"
#include "tools/commands.h"

namespace hetmoe::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.2f} {}", b, units[u]);
}

}  // namespace

int inspect(const InspectOptions& opt) {
  const gguf::GgufFile file = gguf::GgufFile::open(opt.model);
  const model::ModelConfig c = model::read_config(file);

  fmt::print("file          {} (GGUF v{}, {} tensors, {} metadata keys, alignment {})\n", file.path(), file.version(),
             file.tensors().size(), file.metadata().size(), file.alignment());
  const std::vector<std::string> shards = file.shard_paths();
  if (shards.size() > 1)
    fmt::print("shards        {} files, {:.1f} MB in all: {} ... {}\n", shards.size(),
               static_cast<double>(file.file_size()) / 1e6, shards.front(), shards.back());
  fmt::print("architecture  {}{}\n", c.arch_name, c.name.empty() ? "" : "  (" + c.name + ")");
  fmt::print("vocab {}  embd {}  layers {}  heads {} (kv {})  context {}  rms_eps {:g}\n", c.n_vocab, c.n_embd,
             c.n_layer, c.n_head, c.n_head_kv, c.n_ctx_train, c.rms_eps);
  fmt::print("rope          {} dims, {} mode, base {:g}", c.rope.n_dims, c.rope.neox ? "NEOX" : "NORM",
             c.rope.freq_base);
  if (c.rope.ext_factor != 0)
    fmt::print(", YaRN factor {:g} (original context {})", 1.0f / c.rope.freq_scale, c.rope.n_ctx_orig);
  fmt::print(", kq_scale {:.6g}\n", c.kq_scale);
  if (c.kv_lora_rank > 0)
    fmt::print("MLA           q_lora {}  kv_lora {}  qk_nope {}  qk_rope {}  v_head {}\n", c.q_lora_rank,
               c.kv_lora_rank, c.qk_nope, c.qk_rope, c.v_head);
  if (!c.recurrent.empty()) {
    const auto n_rec = std::count(c.recurrent.begin(), c.recurrent.end(), true);
    fmt::print("linear attn   Gated DeltaNet in {} of {} blocks: {} k heads, {} v heads of {}, conv {}\n", n_rec,
               c.n_layer, c.ssm_k_heads, c.ssm_v_heads, c.ssm_head_dim, c.ssm_conv_kernel);
  }
  if (!c.compress_ratios.empty()) {
    std::string ratios;
    for (const int64_t r : c.compress_ratios) ratios += (ratios.empty() ? "" : " ") + std::to_string(r);
    fmt::print(
        "compressed    ratios per block [{}] (0: window only, 4: CSA + indexer, 128: HCA); window {}; q_lora {}; "
        "output LoRA {} groups x {}\n",
        ratios, c.sliding_window, c.q_lora_rank, c.out_groups, c.out_lora_rank);
    fmt::print(
        "              compressed RoPE base {:g}, YaRN factor {:g} (original context {}); indexer {} heads x {}, "
        "top {}\n",
        c.compress_rope.freq_base, 1.0f / c.compress_rope.freq_scale, c.compress_rope.n_ctx_orig, c.indexer_heads,
        c.indexer_dim, c.indexer_top_k);
  }
  if (c.hc_streams > 0)
    fmt::print("hyper-conn.   {} residual streams, Sinkhorn {} iterations, eps {:g}\n", c.hc_streams,
               c.hc_sinkhorn_iters, c.hc_eps);
  if (c.rope.sections[0] + c.rope.sections[1] + c.rope.sections[2] + c.rope.sections[3] > 0)
    fmt::print("rope sections [{}, {}, {}, {}] (IMROPE)\n", c.rope.sections[0], c.rope.sections[1], c.rope.sections[2],
               c.rope.sections[3]);
  if (c.n_expert > 0) {
    fmt::print("experts       {} routed, {} used, {} shared, width {}{}; {} leading dense (width {})\n", c.n_expert,
               c.n_expert_used, c.n_expert_shared, c.n_ff_exp,
               c.n_ff_shared > 0 ? fmt::format(" (shared {})", c.n_ff_shared) : "", c.n_leading_dense, c.n_ff);
    fmt::print("routing       {}{}{}",
               c.gating == model::Gating::kSigmoid        ? "sigmoid"
               : c.gating == model::Gating::kSqrtSoftplus ? "sqrt(softplus)"
                                                          : "softmax",
               c.expert_weights_norm ? ", normalised" : "",
               c.expert_weights_scale != 0 && c.expert_weights_scale != 1
                   ? fmt::format(", scaled x{:g}", c.expert_weights_scale)
                   : "");
    if (c.n_group > 1) fmt::print(", {} of {} groups", c.n_group_used, c.n_group);
    if (c.n_hash_layers > 0) fmt::print("; blocks 0-{} by token id", c.n_hash_layers - 1);
    fmt::print("\n");
  } else {
    fmt::print("ffn           dense, width {}\n", c.n_ff);
  }

  if (opt.all_metadata) {
    fmt::print("\nmetadata\n");
    for (const auto& [key, value] : file.metadata()) fmt::print("  {:<48} {}\n", key, value.to_display());
  }

  // Per-token active bytes: a token reads one embedding row, every dense weight, and n_used of n_expert experts.
  fmt::print("\n{:<36} {:<7} {:<22} {:>12}\n", "tensor", "type", "shape", "bytes");
  double total = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    fmt::print("{:<36} {:<7} {:<22} {:>12}\n", t.name, quant::type_info(t.type).name, t.shape_string(), t.nbytes);
    total += static_cast<double>(t.nbytes);
  }
  const double active = model::active_bytes_per_token(file, c);
  fmt::print("\ntotal weights     {} ({} bytes)\n", human_bytes(total), static_cast<uint64_t>(total));
  fmt::print("active per token  {} ({} bytes; experts counted at {} of {})\n", human_bytes(active),
             static_cast<uint64_t>(active), c.n_expert_used, c.n_expert);
  return 0;
}

}  // namespace hetmoe::cli
