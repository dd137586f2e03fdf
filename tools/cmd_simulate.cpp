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
#include "tools/sim_model.h"
#include "tools/svg_report.h"

namespace hetmoe::cli {
namespace {

// The preset at its file type, or the file; split sizes for `--gpu-bits` with group 64 and the residual of
// `--residual-bits`.
sched::SimModel sim_model(const SimulateOptions& opt) {
  sched::SimModel m = opt.model.empty() ? sim_model_from_preset(opt.model_config, opt.type, opt.layers)
                                        : sim_model_from_file(opt.model);
  set_split(m, opt.gpu_bits, opt.residual_bits, model::parse_critical_from(opt.critical_from, "--critical-from"));
  if (opt.experts_per_token > 0) {
    if (opt.experts_per_token > m.n_expert)
      fail("--experts-per-token {}: the model has {} experts", opt.experts_per_token, m.n_expert);
    m.n_used = opt.experts_per_token;
  }
  return m;
}

}  // namespace

int simulate(const SimulateOptions& opt) {
  const sched::Machine machine = engine::load_machine(opt.hw);  // an Error naming the file when it is not one
  const sched::SimModel model = sim_model(opt);
  std::optional<sched::RoutingTrace> trace;
  if (!opt.trace.empty()) trace = engine::load_routing_trace(opt.trace);
  sched::SimOptions so = sim_workload(opt, trace ? &*trace : nullptr);
  so.policies = opt.policies;
  so.isa = opt.isa;
  so.kt_resident_experts = opt.kt_experts;
  so.policy.kt_prefill_tokens = opt.kt_prefill_tokens;
  so.policy.prefetch = opt.prefetch;
  so.move_slots = opt.move_slots;
  so.admissions = opt.admissions;
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
