// hetmoe tune: which offload policy and settings win on a machine, predicted. It sweeps the policies and their
// settings (split: W^Q bits, critical experts per token, what critical experts are computed from; crossover and
// split: prefetch, then for the best of those the device memory's split between resident experts and the ring of
// move slots, and the residency's admissions per step) through the simulator (scheduler/simulator.h), ranks them by
// an objective and prints the best few with their predicted speed, memory and quality cost, and the commands that
// run each.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>

#include "runtime/engine/engine.h"
#include "runtime/error.h"
#include "runtime/io/input_file.h"
#include "runtime/io/output_file.h"
#include "runtime/model/split_writer.h"
#include "scheduler/machine.h"
#include "scheduler/routing_trace.h"
#include "scheduler/simulator.h"
#include "tools/commands.h"
#include "tools/sim_model.h"

namespace hetmoe::cli {
namespace {

using model::CriticalFrom;

// One setting of the sweep and what the simulator predicts for it.
struct Candidate {
  std::string policy;
  int gpu_bits = 0;                             // split only
  int64_t critical = 0;                         // split only: critical experts per token
  CriticalFrom from = CriticalFrom::kResidual;  // split only
  int64_t prefetch = 0;                         // crossover and split
  int64_t move_slots = 2;                       // crossover and split: the ring, taken from the experts' memory
  int64_t admissions = 1;                       // crossover and split: the residency's admissions per layer step
  sched::SimResult result{};
};

// The best settings of each adaptive policy whose device memory split and admissions the second round sweeps.
constexpr int64_t kRefined = 3;

bool is_split(const Candidate& c) { return c.policy == "split"; }

// Whether the setting's output is the source model's: every policy but split, and a source split whose every routed
// expert is critical.
bool exact(const Candidate& c, int64_t n_used) {
  return !is_split(c) || (c.from == CriticalFrom::kSource && c.critical >= n_used);
}

bool adapts(const Candidate& c) { return c.policy == "crossover" || is_split(c); }

std::string settings(const Candidate& c) {
  std::string s;
  if (is_split(c))
    s = fmt::format("W^Q {}-bit, critical {}, {}, ", c.gpu_bits, c.critical, model::critical_from_name(c.from));
  if (adapts(c)) {
    s += fmt::format("prefetch {}", c.prefetch);
    if (c.move_slots != 2) s += fmt::format(", {} move slots", c.move_slots);
    if (c.admissions != 1) s += fmt::format(", admit {}", c.admissions);
  }
  return s;
}

// The settings column's width for these candidates.
size_t settings_width(const std::vector<const Candidate*>& shown) {
  size_t w = 8;
  for (const Candidate* c : shown) w = std::max(w, settings(*c).size());
  return w;
}

std::string quality(const Candidate& c, int64_t n_used) {
  if (exact(c, n_used)) return "exact";
  if (c.critical == 0) return fmt::format("{}-bit W^Q for the GPU's experts", c.gpu_bits);
  if (c.from == CriticalFrom::kSource)
    return fmt::format("{} of {} experts exact, the rest {}-bit", c.critical, n_used, c.gpu_bits);
  return fmt::format("{} of {} experts + W^R, the rest {}-bit", c.critical, n_used, c.gpu_bits);
}

// The device a profile stands for, as bench opens it: its emulated stand-in with the profile's memory and link, a
// CUDA GPU, or none.
DeviceOptions device_of(const sched::Machine& machine, const Candidate& c, const TuneOptions& opt) {
  DeviceOptions d;
  if (c.policy == "cpu" || !machine.gpu) {
    d.kind = "cpu";
    return d;
  }
  if (machine.gpu_name.rfind("emulated", 0) == 0) {
    d.kind = "emulated";
    d.memory_gb = machine.gpu->memory_bytes / 1e9;
    if (machine.link) {
      d.link_gb_s = machine.link->bytes_per_s / 1e9;
      d.link_latency_us = machine.link->latency_s * 1e6;
    }
  } else {
    d.kind = "cuda";
  }
  d.policy = c.policy;
  d.prefetch = c.prefetch;
  d.move_slots = static_cast<int>(c.move_slots);
  d.admissions = c.admissions;
  d.profile = opt.hw;
  return d;
}

// The commands that run a setting: the split file to write first, then the server (run and chat take the same
// flags).
std::vector<std::string> commands(const Candidate& c, const TuneOptions& opt, const sched::Machine& machine) {
  const std::string model = opt.model.empty() ? fmt::format("{}.gguf", opt.model_config) : opt.model;
  std::vector<std::string> out;
  std::string served = model;
  if (is_split(c)) {
    const std::filesystem::path p(model);
    served = (p.parent_path() / (p.stem().string() + ".split.gguf")).string();
    out.push_back(fmt::format("hetmoe split -m {} -o {} --gpu-bits {}{}", model, served, c.gpu_bits,
                              c.from == CriticalFrom::kSource ? " --critical-from source" : " --residual-bits 4"));
  }
  const std::string threads = machine.cores > 0 ? fmt::format(" -t {}", machine.cores) : "";
  if (c.policy == "cpu") {
    out.push_back(fmt::format("hetmoe serve -m {} --device cpu{}", served, threads));
    return out;
  }
  // An emulated profile's device: the stand-in with the profile's memory and link (as --verify runs it).
  const DeviceOptions d = device_of(machine, c, opt);
  std::string line = fmt::format("hetmoe serve -m {} --device {} --policy {}", served, d.kind, c.policy);
  if (d.kind == "emulated")
    line += fmt::format(" --device-memory {:.4g} --link-gbs {:.4g} --link-latency-us {:.4g}", d.memory_gb, d.link_gb_s,
                        d.link_latency_us);
  if (is_split(c)) line += fmt::format(" --critical {}", c.critical);
  if (adapts(c)) {
    line += fmt::format(" --prefetch {}", c.prefetch);
    if (c.move_slots != 2) line += fmt::format(" --move-slots {}", c.move_slots);
    if (c.admissions != 1) line += fmt::format(" --admissions {}", c.admissions);
    line += fmt::format(" --profile {}", opt.hw);
  }
  out.push_back(line + threads);
  return out;
}

// Benches each candidate on this machine: writes the split files they need (once per W^Q bits and variant) into a
// temporary folder, runs `bench` on each, and prints predicted against measured. The folder goes when this returns
// or throws (a signal that ends the program leaves it; the split writer's own unfinished file is removed then).
void verify(const std::vector<const Candidate*>& shown, const TuneOptions& opt, const sched::Machine& machine) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("hetmoe-tune-{}", ::getpid());
  fs::create_directories(dir);
  struct Remove {
    fs::path dir;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{dir};
  std::map<std::pair<int, CriticalFrom>, std::string> splits;
  std::vector<std::pair<double, double>> measured;  // prefill, decode
  for (const Candidate* c : shown) {
    std::string model = opt.model;
    if (is_split(*c)) {
      std::string& file = splits[{c->gpu_bits, c->from}];
      if (file.empty()) {
        file = (dir / fmt::format("split-{}-{}.gguf", c->gpu_bits, model::critical_from_name(c->from))).string();
        fmt::print(stderr, "tune: writing {} (W^Q {}-bit, {})\n", file, c->gpu_bits,
                   model::critical_from_name(c->from));
        split_model({.model = opt.model,
                     .out = file,
                     .gpu_bits = c->gpu_bits,
                     .residual_bits = 4,
                     .threads = opt.threads,
                     .critical_from = c->from});
      }
      model = file;
    }
    const fs::path json = dir / "bench.json";
    BenchOptions b;
    b.model = model;
    b.policies = {c->policy};
    b.prompt = static_cast<int>(opt.prompt);
    b.gen = static_cast<int>(opt.gen);
    b.json = json.string();
    b.device = device_of(machine, *c, opt);
    if (is_split(*c)) b.critical = std::to_string(c->critical);
    b.threads = opt.threads;
    b.repeat = opt.verify_repeat;
    if (opt.trace.empty())
      b.synthetic = fmt::format("zipf:{}", opt.zipf);
    else
      b.trace = opt.trace;  // the routing the prediction replayed
    fmt::print("\nverify: {} {}\n", c->policy, settings(*c));
    std::fflush(stdout);
    if (bench(b) != 0) fail("tune --verify: the bench of {} {} failed", c->policy, settings(*c));
    const nlohmann::json r =
        nlohmann::json::parse(io::read_file(json.string(), 64 << 20, "bench's results")).at("results").at(0);
    measured.emplace_back(r.at("prefill_tok_s").get<double>(), r.at("decode_tok_s").get<double>());
  }
  fmt::print("\npredicted against measured on this machine (prompt {}, generate {}, routing {}, median of {}):\n",
             opt.prompt, opt.gen, opt.trace.empty() ? fmt::format("Zipf s = {}", opt.zipf) : opt.trace,
             opt.verify_repeat);
  const size_t w = settings_width(shown);
  fmt::print("{:>2}  {:<10} {:<{}} {:>19} {:>19}\n", "#", "policy", "settings", w, "prefill pred / meas",
             "decode pred / meas");
  for (size_t i = 0; i < shown.size(); ++i) {
    const Candidate& c = *shown[i];
    fmt::print("{:>2}  {:<10} {:<{}} {:>9.2f} / {:<7.2f} {:>9.2f} / {:<7.2f}\n", i + 1, c.policy, settings(c), w,
               c.result.prefill_tok_s, measured[i].first, c.result.decode_tok_s, measured[i].second);
  }
}

// Larger is better.
double score(const Candidate& c, const std::string& objective) {
  if (objective == "prefill") return c.result.prefill_tok_s;
  if (objective == "ttft") return -c.result.ttft_s;
  return c.result.decode_tok_s;
}

}  // namespace

int tune(const TuneOptions& opt) {
  if (opt.objective != "decode" && opt.objective != "prefill" && opt.objective != "ttft")
    fail("--objective {}: use decode, prefill or ttft", opt.objective);
  const sched::Machine machine = engine::load_machine(opt.hw);  // an Error naming the file when it is not one
  const sched::SimModel base =
      opt.model.empty() ? sim_model_from_preset(opt.model_config, opt.type, -1) : sim_model_from_file(opt.model);
  std::optional<sched::RoutingTrace> trace;
  if (!opt.trace.empty()) trace = engine::load_routing_trace(opt.trace);

  // The sweep. Without a GPU every policy plans as cpu: one setting.
  std::vector<Candidate> all;
  all.push_back({.policy = "cpu"});
  if (machine.gpu) {
    all.push_back({.policy = "static"});
    all.push_back({.policy = "kt"});
    for (int64_t prefetch : {0, 1}) all.push_back({.policy = "crossover", .prefetch = prefetch});
    std::vector<int64_t> critical;
    for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{4}, base.n_used})
      if (r <= base.n_used && std::find(critical.begin(), critical.end(), r) == critical.end()) critical.push_back(r);
    for (int bits : {2, 3, 4})
      for (int64_t r : critical)
        for (CriticalFrom from : {CriticalFrom::kResidual, CriticalFrom::kSource})
          for (int64_t prefetch : {0, 1})
            all.push_back({.policy = "split", .gpu_bits = bits, .critical = r, .from = from, .prefetch = prefetch});
  }
  // Each setting is one simulation, independent of the others: spread over the cores.
  auto simulate_all = [&](std::vector<Candidate>& list, size_t from) {
    std::atomic<size_t> next{from};
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    auto work = [&] {
      for (size_t i; (i = next++) < list.size() && !failed;) {
        Candidate& c = list[i];
        try {
          sched::SimModel m = base;
          if (is_split(c)) set_split(m, c.gpu_bits, 4, c.from);
          sched::SimOptions so = sim_workload(opt, trace ? &*trace : nullptr);
          so.policies = {c.policy};
          so.n_critical = c.critical;
          so.policy.prefetch = c.prefetch;
          so.move_slots = c.move_slots;
          so.admissions = c.admissions;
          c.result = sched::simulate(machine, m, so).at(0);
        } catch (...) {
          if (!failed.exchange(true)) error = std::current_exception();
        }
      }
    };
    {
      std::vector<std::jthread> threads;  // joined however this block ends
      const unsigned n_threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 16));
      for (unsigned t = 0; t < n_threads; ++t) threads.emplace_back(work);
    }
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::invalid_argument& e) {
        fail("{}", e.what());
      }
    }
  };

  // What the machine can hold, and the ranking.
  const double dram_limit = opt.max_dram_gb > 0      ? opt.max_dram_gb * 1e9
                            : machine.dram_bytes > 0 ? machine.dram_bytes
                                                     : std::numeric_limits<double>::infinity();
  std::vector<const Candidate*> ranked;
  int64_t too_big = 0, left_out = 0;
  auto same = [](const Candidate& a, const Candidate& b) {  // the same prediction: only the ring's use differs
    return a.policy == b.policy && a.gpu_bits == b.gpu_bits && a.critical == b.critical && a.from == b.from &&
           a.result.prefill_tok_s == b.result.prefill_tok_s && a.result.decode_tok_s == b.result.decode_tok_s &&
           a.result.ttft_s == b.result.ttft_s && a.result.dram_bytes == b.result.dram_bytes;
  };
  auto rank = [&] {
    ranked.clear();
    too_big = left_out = 0;
    for (const Candidate& c : all) {
      if (c.result.dram_bytes > dram_limit) {
        ++too_big;
      } else if ((opt.exact && !exact(c, base.n_used)) ||
                 (is_split(c) && c.critical < std::min(opt.min_critical, base.n_used))) {
        ++left_out;
      } else if (std::none_of(ranked.begin(), ranked.end(), [&](const Candidate* r) { return same(*r, c); })) {
        ranked.push_back(&c);  // the first of equal ones: the sweep's defaults come first
      }
    }
    std::stable_sort(ranked.begin(), ranked.end(), [&](const Candidate* a, const Candidate* b) {
      return score(*a, opt.objective) > score(*b, opt.objective);
    });
  };
  simulate_all(all, 0);
  rank();

  // The second round: each adaptive policy's best settings again with the device memory split another way (more or
  // fewer move slots, which come out of the resident experts' room) and the residency admitting more or fewer experts
  // per step; prefetch may use up to half the ring.
  const size_t first_round = all.size();
  {
    std::vector<Candidate> more;
    // A setting apart from what this round varies, and a whole setting.
    auto base_of = [](const Candidate& c) {
      return std::make_tuple(c.policy, c.gpu_bits, c.critical, static_cast<int>(c.from));
    };
    auto key_of = [&](const Candidate& c) {
      return std::tuple_cat(base_of(c), std::make_tuple(c.prefetch, c.move_slots, c.admissions));
    };
    std::set<decltype(key_of(all[0]))> swept;
    for (const Candidate& c : all) swept.insert(key_of(c));
    std::set<decltype(base_of(all[0]))> bases;
    std::map<std::string, int64_t> refined;  // per policy: the comparison of split and crossover stays fair
    for (const Candidate* c : ranked) {
      if (!adapts(*c) || !bases.insert(base_of(*c)).second || refined[c->policy]++ >= kRefined) continue;
      for (int64_t slots : {2, 4, 8})
        for (int64_t admissions : {0, 1, 2, 4})
          for (int64_t prefetch = 0; prefetch <= slots / 2; ++prefetch) {
            Candidate r = *c;
            r.move_slots = slots;
            r.admissions = admissions;
            r.prefetch = prefetch;
            r.result = {};
            if (swept.insert(key_of(r)).second) more.push_back(r);
          }
    }
    all.insert(all.end(), more.begin(), more.end());  // `ranked` points into `all`: ranked again below
  }
  simulate_all(all, first_round);
  rank();

  fmt::print("machine  {}\n", machine.name);
  for (const std::string& a : machine.assumptions) fmt::print("         assumes: {}\n", a);
  fmt::print("model    {} ({:.1f} GB; one routed expert {:.1f} MB, {} of {} per token)\n", base.name,
             base.file_bytes / 1e9, base.expert_bytes / 1e6, base.n_used, base.n_expert);
  fmt::print("workload prompt {}, generate {}, routing {}\n", opt.prompt, opt.gen,
             trace ? "replayed from " + opt.trace : fmt::format("Zipf s = {}", opt.zipf));
  fmt::print("{} settings simulated ({} of them varying the best ones' move slots and admissions), ranked by {}",
             all.size(), all.size() - first_round, opt.objective);
  if (too_big > 0)
    fmt::print("; {} need more than the {:.0f} GB of DRAM{}", too_big, dram_limit / 1e9,
               opt.max_dram_gb > 0 ? " allowed" : " the profile has");
  if (left_out > 0) fmt::print("; {} left out by --exact or --min-critical", left_out);
  fmt::print("\n");
  if (!machine.gpu) fmt::print("the profile has no GPU: every policy runs as cpu\n");
  if (ranked.empty()) fail("no setting fits: every one needs more than {:.0f} GB of DRAM", dram_limit / 1e9);

  const size_t shown = std::min<size_t>(ranked.size(), static_cast<size_t>(std::max(opt.top, 1)));
  const std::vector<const Candidate*> top(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(shown));
  const size_t w = settings_width(top);
  fmt::print("{:>2}  {:<10} {:<{}} {:>8} {:>8} {:>7} {:>8} {:>8}  {}\n", "#", "policy", "settings", w, "prefill",
             "decode", "TTFT s", "DRAM GB", "VRAM GB", "quality");
  for (size_t i = 0; i < shown; ++i) {
    const Candidate& c = *ranked[i];
    const sched::SimResult& r = c.result;
    fmt::print("{:>2}  {:<10} {:<{}} {:>8.2f} {:>8.2f} {:>7.2f} {:>8.1f} {:>8.1f}  {}\n", i + 1, c.policy, settings(c),
               w, r.prefill_tok_s, r.decode_tok_s, r.ttft_s, r.dram_bytes / 1e9, r.vram_bytes / 1e9,
               quality(c, base.n_used));
    for (const std::string& line : commands(c, opt, machine)) fmt::print("      {}\n", line);
  }
  // Whether the split pays here: its best setting against the best of the rest.
  const auto best_of = [&](bool split) -> const Candidate* {
    for (const Candidate* c : ranked)
      if (is_split(*c) == split) return c;
    return nullptr;
  };
  const Candidate* best_split = best_of(true);
  const Candidate* best_other = best_of(false);
  if (best_split && best_other) {
    const double a = score(*best_split, opt.objective), b = score(*best_other, opt.objective);
    auto value = [&](double v) {
      return opt.objective == "ttft" ? fmt::format("TTFT {:.2f} s", -v)
                                     : fmt::format("{:.2f} {} tok/s", v, opt.objective);
    };
    fmt::print("split {} here: its best ({}; {}) predicts {} against {} for {}\n", a > b ? "pays" : "does not pay",
               settings(*best_split), quality(*best_split, base.n_used), value(a), value(b), best_other->policy);
  }
  fmt::print(
      "(predicted by the simulator from the profile's rates; nothing was run. Quality: the split's KL on the "
      "reference models is in docs/split.md)\n");
  if (opt.verify) verify(top, opt, machine);

  if (!opt.json.empty()) {
    nlohmann::json j = {{"machine", machine.name},
                        {"model", base.name},
                        {"prompt_tokens", opt.prompt},
                        {"gen_tokens", opt.gen},
                        {"objective", opt.objective},
                        {"predicted", true},
                        {"candidates", nlohmann::json::array()}};
    for (const Candidate* c : ranked) {
      const sched::SimResult& r = c->result;
      nlohmann::json e = {{"policy", c->policy},
                          {"settings", settings(*c)},
                          {"prefill_tok_s", r.prefill_tok_s},
                          {"decode_tok_s", r.decode_tok_s},
                          {"ttft_s", r.ttft_s},
                          {"dram_bytes", r.dram_bytes},
                          {"vram_bytes", r.vram_bytes},
                          {"exact", exact(*c, base.n_used)},
                          {"quality", quality(*c, base.n_used)},
                          {"commands", commands(*c, opt, machine)}};
      if (is_split(*c)) {
        e["gpu_bits"] = c->gpu_bits;
        e["critical"] = c->critical;
        e["critical_from"] = model::critical_from_name(c->from);
      }
      if (adapts(*c)) {
        e["prefetch"] = c->prefetch;
        e["move_slots"] = c->move_slots;
        e["admissions"] = c->admissions;
      }
      j["candidates"].push_back(e);
    }
    io::write_file(opt.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace hetmoe::cli
