// hetmoe calibrate: the measurements the offload scheduler's cost model stands on, written as a JSON profile:
// DRAM read bandwidth for 1..N threads, and per ISA tier the time of one routed expert's FFN of the loaded model
// against the number of rows (tokens) routed to it, run by the expert executor as the model runs it. Each call
// takes the next expert of the layer, so the weights come from DRAM as in decode (one expert alone would stay in
// the last-level cache after the first call and read several times faster than it ever does in a forward pass).
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cpu_kernels/bandwidth.h"
#include "cpu_kernels/experts.h"
#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/thread_pool.h"
#include "runtime/device/device.h"
#include "runtime/engine/engine.h"
#include "runtime/error.h"
#include "runtime/io/output_file.h"
#include "runtime/model/model.h"
#include "scheduler/machine.h"
#include "tools/commands.h"

namespace hetmoe::cli {
namespace {

// Seconds per call of fn, the best of a few repetitions (repeats stop early once a second has been spent).
template <typename Fn>
double best_seconds(Fn fn) {
  double best = 1e30, spent = 0;
  for (int r = 0; r < 5 && spent < 1.0; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    spent += s;
  }
  return best;
}

// The link and the device as the cost model needs them: latency (a 4 KB copy) and bandwidth (64 MB) from pinned
// memory, and the expert's FFN on the device at 1 and max_rows rows (weight streaming rate, arithmetic rate).
nlohmann::json measure_device(device::Device& d, const cpu::ExpertFfn& e, int64_t n_embd, int64_t max_rows) {
  const int s = d.create_stream();
  const size_t big = size_t{64} << 20, small = 4096;
  // Staging for the link test and the expert's input rows, whichever is larger.
  const size_t floats = std::max(big / sizeof(float), static_cast<size_t>(max_rows * n_embd));
  device::HostMemory host(d);
  float* staged = host.reserve(floats);
  std::fill(staged, staged + floats, 1.0f);
  device::DeviceMemory target(d, big);
  auto copy_seconds = [&](size_t bytes) {
    return best_seconds([&] {
      d.copy_to_device(s, target.get(), staged, bytes);
      d.synchronize(d.record(s));
    });
  };
  const double latency = copy_seconds(small);
  const double bandwidth = static_cast<double>(big) / std::max(copy_seconds(big) - latency, 1e-9);
  fmt::print("{}: link {:.1f} GB/s, {:.1f} us per copy\n", d.name(), bandwidth / 1e9, latency * 1e6);
  nlohmann::json out = {{"link", {{"bytes_per_s", bandwidth}, {"latency_s", latency}}}};

  for (const cpu::WeightMatrix* w : {&e.gate, &e.up, &e.down})
    if (!d.supports(w->type)) {
      fmt::print("{}: runs no {} weights: the expert's time there is not measured\n", d.name(),
                 quant::type_info(w->type).name);
      return out;
    }
  auto upload = [&](const cpu::WeightMatrix& w, device::DeviceMemory& mem) {
    mem = device::DeviceMemory(d, w.row_bytes * w.n_rows);
    d.copy_to_device(s, mem.get(), w.data, w.row_bytes * w.n_rows);
    return device::DeviceMatrix{w.type, w.n_cols, w.n_rows, w.row_bytes, mem.get()};
  };
  device::DeviceMemory mg, mu, md;
  const device::DeviceMatrix g = upload(e.gate, mg), u = upload(e.up, mu), dn = upload(e.down, md);
  const int64_t ff = e.gate.n_rows;
  device::DeviceMemory x(d, max_rows * n_embd * 4), hg(d, max_rows * ff * 4), hu(d, max_rows * ff * 4),
      y(d, max_rows * n_embd * 4);
  d.copy_to_device(s, x.get(), staged, max_rows * n_embd * 4);
  auto ffn_seconds = [&](int64_t rows) {
    return best_seconds([&] {
      d.matmul(s, g, x.as<float>(), rows, hg.as<float>());
      d.matmul(s, u, x.as<float>(), rows, hu.as<float>());
      d.silu_mul(s, hg.as<float>(), hu.as<float>(), rows * ff, hg.as<float>());
      d.matmul(s, dn, hg.as<float>(), rows, y.as<float>());
      d.synchronize(d.record(s));
    });
  };
  const double bytes = static_cast<double>(e.gate.row_bytes * e.gate.n_rows + e.up.row_bytes * e.up.n_rows +
                                           e.down.row_bytes * e.down.n_rows);
  const double t1 = ffn_seconds(1), tn = ffn_seconds(max_rows);
  const double flops = 6.0 * static_cast<double>(n_embd * ff * max_rows);
  fmt::print("{}: one expert FFN {:.3g} ms at 1 row, {:.3g} ms at {} rows\n", d.name(), t1 * 1e3, tn * 1e3, max_rows);
  out["gpu"] = {{"name", d.name()},
                {"memory_bytes", static_cast<double>(d.capacity())},
                {"bytes_per_s", bytes / t1},
                {"flops_per_s", flops / tn},
                {"launch_s", 0.0}};
  return out;
}

}  // namespace

int calibrate(const CalibrateOptions& opt) {
  const int threads = resolve_threads(opt.threads);
  auto m = model::Model::load(opt.model, threads);
  const model::ModelConfig& c = m->config();
  if (c.n_expert == 0) fail("{} has no routed experts to calibrate", opt.model);

  nlohmann::json profile = {{"format", "hetmoe-profile/1"}, {"model", opt.model}, {"threads", threads}};

  fmt::print("DRAM read bandwidth\n");
  for (int t = 1; t <= threads; ++t) {
    cpu::ThreadPool pool(t);
    const double bw = cpu::measure_read_bandwidth(pool);
    fmt::print("  {:>2} threads  {:6.1f} GB/s\n", t, bw / 1e9);
    profile["bandwidth"].push_back({{"threads", t}, {"bytes_per_s", bw}});
  }

  // The experts of the first MoE layer, one SwiGLU FFN of the routed width each.
  const model::MoeWeights& w = m->ffn_weights(c.n_leading_dense).moe;
  auto expert = [&](int64_t e) {
    return cpu::ExpertFfn{.gate = w.gate_exps.rows(e * w.n_ff_exp, w.n_ff_exp),
                          .up = w.up_exps.rows(e * w.n_ff_exp, w.n_ff_exp),
                          .down = w.down_exps.rows(e * c.n_embd, c.n_embd)};
  };
  const cpu::ExpertFfn e0 = expert(0);
  const double expert_bytes = static_cast<double>(e0.gate.row_bytes * e0.gate.n_rows + e0.up.row_bytes * e0.up.n_rows +
                                                  e0.down.row_bytes * e0.down.n_rows);
  profile["expert"] = {
      {"layer", c.n_leading_dense}, {"bytes", expert_bytes}, {"n_embd", c.n_embd}, {"n_ff", w.n_ff_exp}};
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(opt.max_rows * c.n_embd)), out(x.size());
  for (float& v : x) v = dist(rng);

  fmt::print("one expert FFN ({:.1f} MB of weights, a different one of {} each call), {} threads\n", expert_bytes / 1e6,
             w.n_expert, threads);
  cpu::ExpertBatch batch;
  int64_t next = 0;
  auto run_expert = [&](const cpu::KernelTable& table, int64_t rows) {
    batch.clear(rows, 1);
    batch.add_expert(expert(next));
    next = (next + 1) % w.n_expert;
    for (int64_t t = 0; t < rows; ++t) batch.add_item(static_cast<int32_t>(t), 0, 1.0f);
    cpu::run_experts(table, m->pool(), batch, x.data(), c.n_embd, out.data());
  };
  // Every expert once first: the mapped pages fault in here, not inside a measurement.
  for (int64_t e = 0; e < w.n_expert; ++e) run_expert(cpu::kernels(), 1);
  for (cpu::Isa isa : {cpu::Isa::kRef, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx}) {
    if (isa > cpu::detect_isa()) continue;
    const cpu::KernelTable table = cpu::make_kernel_table(isa);
    nlohmann::json curve = {{"isa", cpu::isa_name(isa)}};
    fmt::print("  {:<7}", cpu::isa_name(isa));
    for (int64_t rows = 1; rows <= opt.max_rows; rows *= 2) {
      const double s = best_seconds([&] { run_expert(table, rows); });
      curve["rows"].push_back(rows);
      curve["seconds"].push_back(s);
      fmt::print(" {}:{:.3g}ms", rows, s * 1e3);
      std::fflush(stdout);
      if (s > opt.max_seconds) break;  // the scalar tier would take minutes at the largest row counts
    }
    fmt::print("\n");
    profile["expert_ffn"].push_back(curve);
  }

  if (const auto d = engine::open_device(opt.device)) profile.update(measure_device(*d, e0, c.n_embd, opt.max_rows));

  io::write_file(opt.out, profile.dump(2) + "\n");
  fmt::print("profile written to {}\n", opt.out);

  // The crossover of each tier: from how many rows moving this expert to the device pays.
  sched::Machine machine = sched::parse_machine(profile.dump(), opt.out);
  if (!opt.hw.empty()) {
    const sched::Machine hw = engine::load_machine(opt.hw);
    if (!hw.gpu) fail("{}: the hardware profile has no GPU to take the crossovers against", opt.hw);
    machine.link = hw.link;
    machine.gpu = hw.gpu;
    machine.gpu_name = hw.gpu_name + " (" + opt.hw + ")";
  }
  if (!machine.gpu) {
    fmt::print("crossover: needs a device (--device) or a hardware profile's GPU (--hw)\n");
    return 0;
  }
  const sched::CostModel cost = machine.cost_model();
  const sched::ExpertShape shape = sched::ExpertShape::whole(expert_bytes, c.n_embd, w.n_ff_exp);
  fmt::print("crossover: rows from which moving one expert ({:.1f} MB) to {} and running it there beats the CPU\n",
             expert_bytes / 1e6, machine.gpu_name);
  for (const sched::CpuTier& t : cost.tiers()) {
    const std::optional<int64_t> r = cost.crossover(t.isa, shape);
    fmt::print("  {:<7} {}\n", t.isa, r ? fmt::format("{} rows", *r) : std::string("never (up to 65536 rows)"));
  }
  return 0;
}

}  // namespace hetmoe::cli
