// hetmoe simulate: offload policies on hardware you do not have. The model's sizes come from a make-model preset at a
// file type (the same plan make-model writes, no weights generated), the machine from a hardware profile; the
// scheduler's policies, residency cache and cost model do the rest (scheduler/simulator.h).
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "quant/lowbit.h"
#include "runtime/engine/engine.h"
#include "runtime/error.h"
#include "runtime/io/output_file.h"
#include "runtime/model/make_model.h"
#include "runtime/model/split_writer.h"
#include "scheduler/machine.h"
#include "scheduler/routing_trace.h"
#include "scheduler/simulator.h"
#include "tools/commands.h"
#include "tools/svg_report.h"

namespace hetmoe::cli {
namespace {

bool has(const std::string& name, const char* part) { return name.find(part) != std::string::npos; }

// The preset at its file type, as sizes and parameter counts per part; split sizes for `--gpu-bits` with group 64
// and the residual of `--residual-bits`.
sched::SimModel sim_model(const SimulateOptions& opt) {
  const ModelPreset* preset = find_model_preset(opt.model_config);
  if (!preset) fail("--model-config {}: not a preset (see hetmoe make-model --help)", opt.model_config);
  // The real model's depth (make-model's default block count is smaller for the large presets).
  const ModelPlan plan = plan_model({.preset = opt.model_config,
                                     .out_path = "",
                                     .type = opt.type,
                                     .layers = opt.layers > 0 ? opt.layers : preset->max_layers});
  const ModelPreset& p = *plan.preset;
  sched::SimModel m;
  m.name = fmt::format("{} {}", p.name, opt.type);
  m.n_layer = plan.n_layer;
  m.n_leading_dense = plan.n_leading_dense;
  m.n_expert = p.n_expert;
  m.n_used = p.n_expert_used;
  m.n_embd = p.n_embd;
  m.n_ff_exp = p.n_ff_exp;
  m.n_head = p.n_head;
  m.attn_dim = p.kv_lora_rank + p.qk_rope;
  m.kv_width = p.kv_lora_rank + p.qk_rope;
  const int64_t n_moe = m.n_layer - m.n_leading_dense;
  double expert_bytes = 0;
  for (const PlannedTensor& t : plan.tensors) {
    const double bytes = static_cast<double>(t.nbytes()), params = static_cast<double>(t.n_elements());
    m.file_bytes += bytes;
    const std::string& n = t.name;
    if (n == "token_embd.weight") continue;  // looked up, not streamed
    if (n.rfind("output", 0) == 0) {
      m.output_bytes += bytes;
      m.output_params += params;
    } else if (has(n, "_exps")) {
      expert_bytes += bytes;
    } else if (has(n, "_shexp")) {
      m.shared_bytes += bytes / static_cast<double>(n_moe);
      m.shared_params += params / static_cast<double>(n_moe);
    } else if (has(n, "ffn_gate.") || has(n, "ffn_up.") || has(n, "ffn_down.")) {
      m.dense_bytes += bytes / std::max(1.0, static_cast<double>(m.n_leading_dense));
      m.dense_params += params / std::max(1.0, static_cast<double>(m.n_leading_dense));
    } else {  // attention, norms, router
      m.attention_bytes += bytes / static_cast<double>(m.n_layer);
      m.attention_params += params / static_cast<double>(m.n_layer);
    }
  }
  m.expert_bytes = expert_bytes / static_cast<double>(n_moe * m.n_expert);
  const auto q = quant::lowbit_type({opt.gpu_bits, 64});
  if (!q) fail("--gpu-bits {}: use 2, 3 or 4", opt.gpu_bits);
  const double e = static_cast<double>(p.n_embd), f = static_cast<double>(p.n_ff_exp);
  m.split_device_bytes = 2 * f * static_cast<double>(quant::row_bytes(*q, p.n_embd)) +
                         e * static_cast<double>(quant::row_bytes(*q, p.n_ff_exp));
  m.split_residual_bytes =
      2 * f * static_cast<double>(quant::row_bytes(residual_type(opt.residual_bits, p.n_embd), p.n_embd)) +
      e * static_cast<double>(quant::row_bytes(residual_type(opt.residual_bits, p.n_ff_exp), p.n_ff_exp));
  m.critical_from_source = opt.critical_from == "source";
  if (opt.experts_per_token > 0) {
    if (opt.experts_per_token > m.n_expert)
      fail("--experts-per-token {}: the model has {} experts", opt.experts_per_token, m.n_expert);
    m.n_used = opt.experts_per_token;
  }
  return m;
}

}  // namespace

int simulate(const SimulateOptions& opt) {
  sched::Machine machine;
  try {
    machine = engine::load_machine(opt.hw);
  } catch (const std::runtime_error& e) {
    fail("{}", e.what());
  }
  const sched::SimModel model = sim_model(opt);
  std::optional<sched::RoutingTrace> trace;
  if (!opt.trace.empty()) trace = engine::load_routing_trace(opt.trace);
  sched::SimOptions so;
  so.policies = opt.policies;
  so.prompt = opt.prompt;
  so.gen = opt.gen;
  so.isa = opt.isa;
  so.zipf = opt.zipf;
  so.seed = opt.seed;
  so.trace = trace ? &*trace : nullptr;
  so.kt_resident_experts = opt.kt_experts;
  so.policy.kt_prefill_tokens = opt.kt_prefill_tokens;
  so.policy.prefetch = opt.prefetch;
  so.n_critical = opt.critical;
  const std::vector<sched::SimResult> results = sched::simulate(machine, model, so);

  fmt::print("machine  {}\n", machine.name);
  for (const std::string& a : machine.assumptions) fmt::print("         assumes: {}\n", a);
  if (model.critical_from_source)
    fmt::print("model    {} ({:.1f} GB; one expert {:.1f} MB, split {:.1f} MB W^Q, critical rows from the source)\n",
               model.name, model.file_bytes / 1e9, model.expert_bytes / 1e6, model.split_device_bytes / 1e6);
  else
    fmt::print("model    {} ({:.1f} GB; one expert {:.1f} MB, split {:.1f} MB W^Q + {:.1f} MB W^R)\n", model.name,
               model.file_bytes / 1e9, model.expert_bytes / 1e6, model.split_device_bytes / 1e6,
               model.split_residual_bytes / 1e6);
  if (opt.experts_per_token > 0) fmt::print("         {} experts per token\n", model.n_used);
  fmt::print("workload prompt {}, generate {}, routing {}\n", opt.prompt, opt.gen,
             trace ? "replayed from " + opt.trace : fmt::format("Zipf s = {}", opt.zipf));
  fmt::print("{:<10} {:>9} {:>9} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>10}\n", "policy", "prefill", "decode",
             "TTFT s", "H2D MB/tok", "DRAM MB/tok", "DRAM GB", "VRAM GB", "resident", "crossover");
  for (const sched::SimResult& r : results)
    fmt::print("{:<10} {:>9.2f} {:>9.2f} {:>8.2f} {:>10.1f} {:>10.1f} {:>9.1f} {:>9.1f} {:>9} {:>10}\n", r.policy,
               r.prefill_tok_s, r.decode_tok_s, r.ttft_s, r.h2d_bytes_per_token / 1e6, r.dram_bytes_per_token / 1e6,
               r.dram_bytes / 1e9, r.vram_bytes / 1e9, r.resident_experts,
               r.crossover_rows < 0 ? std::string("never") : fmt::format("{} rows", r.crossover_rows));
  fmt::print("(predicted tokens/s; every figure comes from the profile's rates and the cost model)\n");

  if (!opt.svg.empty()) {
    std::vector<PolicyBar> bars;
    for (const sched::SimResult& r : results) bars.push_back({r.policy, r.prefill_tok_s, r.decode_tok_s});
    const SvgLabels labels{
        .title = fmt::format("{} on {}", model.name, machine.name),
        .source = "predicted by hetmoe simulate from the profile's rates and the cost model (nothing was run)",
        .no_curves = "the profile has no GPU: no crossover to draw"};
    write_svg(opt.svg, policies_svg(labels, bars,
                                    crossover_curves(machine, sched::ExpertShape::whole(
                                                                  model.expert_bytes, model.n_embd, model.n_ff_exp))));
  }
  if (!opt.json.empty()) {
    nlohmann::json j = {{"machine", machine.name}, {"model", model.name}, {"prompt_tokens", opt.prompt},
                        {"gen_tokens", opt.gen},   {"predicted", true},   {"results", nlohmann::json::array()}};
    for (const sched::SimResult& r : results)
      j["results"].push_back({{"policy", r.policy},
                              {"device", machine.gpu ? machine.gpu_name : std::string("none")},
                              {"prefill_tok_s", r.prefill_tok_s},
                              {"decode_tok_s", r.decode_tok_s},
                              {"ttft_s", r.ttft_s},
                              {"h2d_bytes_per_token", r.h2d_bytes_per_token},
                              {"dram_read_bytes_per_token", r.dram_bytes_per_token},
                              {"dram_bytes", r.dram_bytes},
                              {"vram_bytes", r.vram_bytes},
                              {"resident_experts", r.resident_experts},
                              {"crossover_rows", r.crossover_rows}});
    io::write_file(opt.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace hetmoe::cli
