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
#include "runtime/error.h"
#include "runtime/model/model.h"
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

  std::ofstream f(opt.out);
  f << profile.dump(2) << "\n";
  if (!f) fail("cannot write {}", opt.out);
  fmt::print("profile written to {}\n", opt.out);
  return 0;
}

}  // namespace hetmoe::cli
