#include "runtime/engine/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <stdexcept>

#include "cpu_kernels/kernel_table.h"
#include "runtime/error.h"
#include "runtime/io/input_file.h"
#include "scheduler/machine.h"
#include "scheduler/policies.h"
#include "scheduler/routing_trace.h"

namespace hetmoe::engine {
namespace {

const sched::PolicyInfo& policy_named(const std::string& name) {
  try {
    return sched::find_policy(name);
  } catch (const std::invalid_argument& e) {
    fail("--policy: {}", e.what());
  }
}

// The policy the options name, checked against the device they ask for; else the default for that device.
const sched::PolicyInfo& resolve_policy(const DeviceOptions& o, bool has_device) {
  if (o.policy.empty()) return sched::default_policy(has_device);
  const sched::PolicyInfo& p = policy_named(o.policy);
  if (p.traits.uses_device && !has_device) {
    if (o.kind == "cpu")
      fail(
          "--policy {} puts work on a device, and --device cpu runs everything on the CPU: use --device emulated "
          "or cuda, or --policy cpu",
          p.name);
    fail("--policy {} needs a device, and --device auto found no CUDA GPU: use --device emulated, or --policy cpu",
         p.name);
  }
  if (!p.traits.uses_device && (o.kind == "emulated" || o.kind == "cuda"))
    fail("--policy {} runs everything on the CPU, but --device {} asks for a device: drop one of them", p.name, o.kind);
  return p;
}

// --critical: "" (the file's default), a count of experts (one above the experts per token means all) or "all".
void set_critical(model::Model& m, const std::string& critical, const std::string& path) {
  if (critical.empty()) return;
  if (!m.split()) fail("--critical {}: {} is not a split model (hetmoe split writes one)", critical, path);
  if (critical == "all") return m.set_critical(-1);
  int64_t n = -1;
  const auto [end, ec] = std::from_chars(critical.data(), critical.data() + critical.size(), n);
  if (ec != std::errc() || end != critical.data() + critical.size() || n < 0)
    fail("--critical {}: use a count of experts (0 or more) or 'all'", critical);
  m.set_critical(std::min(n, m.config().n_expert_used));
}

void check(const DeviceOptions& o) {
  if (o.kind != "cpu" && o.kind != "emulated" && o.kind != "cuda" && o.kind != "auto")
    fail("--device {}: use cpu, emulated, cuda or auto", o.kind);
  if (o.memory_gb < 0 || o.link_gb_s < 0 || o.link_latency_us < 0)
    fail("--device-memory, --link-gbs and --link-latency-us must not be negative");
  if (o.move_rows < 0 || o.move_slots < 0 || o.admissions < 0 || o.prefetch < 0)
    fail("--move-rows, --move-slots, --admissions and --prefetch must not be negative");
}

}  // namespace

sched::Machine load_machine(const std::string& path) {
  const std::string text = io::read_file(path, io::kMaxProfileBytes, "a machine profile");
  try {
    return sched::parse_machine(text, path);
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

sched::RoutingTrace load_routing_trace(const std::string& path) {
  const std::string text = io::read_file(path, io::kMaxTraceBytes, "a routing trace");
  try {
    return sched::RoutingTrace::parse(text, path);
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

bool cuda_available() { return device::cuda_device_count() > 0; }

bool wants_device(const DeviceOptions& o) {
  return o.kind == "emulated" || o.kind == "cuda" || (o.kind == "auto" && cuda_available());
}

std::unique_ptr<device::Device> open_device(const DeviceOptions& o) {
  check(o);
  if (!wants_device(o)) return nullptr;
  if (o.kind != "emulated") return device::make_cuda_device(0);
  device::EmulatedOptions e;
  if (o.memory_gb > 0) e.capacity = static_cast<size_t>(o.memory_gb * 1e9);
  e.link_gb_s = o.link_gb_s;
  e.link_latency_us = o.link_latency_us;
  return device::make_emulated_device(e);
}

std::unique_ptr<Engine> Engine::open(const EngineOptions& options) {
  const DeviceOptions& o = options.device;
  check(o);
  std::unique_ptr<Engine> engine(new Engine());
  // Only the device kind is looked at before the policy: a policy that needs no device opens none.
  const sched::PolicyInfo& policy = resolve_policy(o, wants_device(o));
  engine->policy_ = policy.name;
  if (policy.traits.uses_device) engine->device_ = open_device(o);
  engine->model_ = model::Model::load(options.model, cpu::resolve_threads(options.threads));
  model::Model& m = *engine->model_;
  if (policy.traits.needs_split_model && !m.split())
    fail("--policy {} needs a split model (hetmoe split writes one); {} is not split", policy.name, options.model);
  set_critical(m, options.critical, options.model);
  if (o.gpu_layers > 0) {
    if (o.gpu_layers < m.config().n_layer)
      fail(
          "-ngl {}: {} has {} layers, and hetmoe runs the forward pass on the device for all of them or none: use "
          "-ngl {} (all) or -ngl 0 (none); --device-memory GB bounds what the experts take",
          o.gpu_layers, options.model, m.config().n_layer, m.config().n_layer);
    if (o.host_pass) fail("-ngl {} puts the layers on the device; it contradicts --host-pass", o.gpu_layers);
  }
  device::Device* d = engine->device_.get();
  if (!d) {
    if (o.gpu_layers > 0)
      engine->notes_.push_back(
          fmt::format("-ngl {}: no device ({}): everything runs on the CPU", o.gpu_layers,
                      o.kind == "auto" ? "--device auto found no CUDA GPU" : "the policy uses none"));
    return engine;
  }

  // The weights take the device's memory (--device-memory caps it) but a reserve for the step's working rows (a
  // quarter, at most 1 GB).
  size_t budget = d->capacity();
  if (o.memory_gb > 0) budget = std::min(budget, static_cast<size_t>(o.memory_gb * 1e9));
  // The cost model (and its CPU tier: the one this build runs) from a profile; warm counts from a routing trace.
  std::optional<sched::Machine> machine;
  std::optional<sched::CostModel> cost;
  std::string isa(cpu::isa_name(cpu::kernels().isa));
  if (!o.profile.empty()) {
    machine = load_machine(o.profile);
    // calibrate without --device measured no link and no device: no crossover to take.
    if (!machine->gpu)
      fail("{}: the profile has no device; run hetmoe calibrate with --device (or use a hetmoe-hw/1 profile)",
           o.profile);
    cost.emplace(machine->cost_model());
    const auto& tiers = cost->tiers();
    if (std::none_of(tiers.begin(), tiers.end(), [&](const sched::CpuTier& t) { return t.isa == isa; }))
      isa = machine->best_tier().isa;
  }
  std::vector<std::vector<double>> warm = o.warm_counts;
  if (!o.warm_trace.empty()) warm = load_routing_trace(o.warm_trace).counts();
  m.attach_device(*d,
                  {.budget_bytes = budget - std::min(budget / 4, size_t{1} << 30),
                   .move_rows = o.move_rows,
                   .move_slots = o.move_slots,
                   .policy = policy.name,
                   .cost = cost ? &*cost : nullptr,
                   .isa = isa,
                   .warm_counts = std::move(warm),
                   .admissions = o.admissions,
                   .prefetch = o.prefetch},
                  !o.host_pass);

  std::vector<std::string>& notes = engine->notes_;
  const model::DeviceExperts& on = *m.device_experts();
  if (m.pass_on_device())
    notes.push_back(fmt::format(
        "device: {}: forward pass there (norms, attention, routers: {:.1f} MB; KV cache there when it fits)", d->name(),
        static_cast<double>(m.pass_device_bytes()) / 1e6));
  else if (!o.host_pass)
    notes.push_back(fmt::format(
        "device: {}: forward pass on the host (the device lacks room or a kernel for its weights)", d->name()));
  notes.push_back(fmt::format(
      "device: {}: {} weight sets resident (output head, dense FFNs, shared and routed experts{}), {:.1f} MB",
      d->name(), on.resident_experts(), m.split() ? " as W^Q" : "", static_cast<double>(on.resident_bytes()) / 1e6));
  if (on.expert_slots() > 0 || on.move_slots() > 0)
    notes.push_back(fmt::format("device: {}: policy {}: {} expert slots, {} move slots", d->name(), on.policy(),
                                on.expert_slots(), on.move_slots()));
  if (on.resident_experts() == 0 && !m.split())
    notes.push_back(fmt::format(
        "device: {}: no expert weights there (no room, or types it has no kernel for); a split model (hetmoe split) "
        "puts the experts' small W^Q there",
        d->name()));
  return engine;
}

Engine::~Engine() = default;

std::unique_ptr<Session> Engine::session(int64_t n_ctx) {
  if (n_ctx <= 0) n_ctx = std::min<int64_t>(4096, model_->config().n_ctx_train);
  return std::make_unique<Session>(*model_, n_ctx);
}

}  // namespace hetmoe::engine
