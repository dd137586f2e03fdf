// hetmoe calibrate: the measurements the offload scheduler's cost model stands on, written as a JSON profile:
// DRAM read bandwidth for 1..N threads, and per ISA tier the time of one routed expert's FFN of the loaded model
// against the number of rows (tokens) routed to it.
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cpu_kernels/bandwidth.h"
#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/thread_pool.h"
#include "runtime/error.h"
#include "runtime/model/model.h"
#include "runtime/model/moe.h"
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

  // Expert 0 of the first MoE layer, as one SwiGLU FFN of the routed width.
  const model::MoeWeights& w = m->ffn_weights(c.n_leading_dense).moe;
  const cpu::WeightMatrix gate = w.gate_exps.rows(0, w.n_ff_exp), up = w.up_exps.rows(0, w.n_ff_exp),
                          down = w.down_exps.rows(0, c.n_embd);
  const double expert_bytes =
      static_cast<double>(gate.row_bytes * gate.n_rows + up.row_bytes * up.n_rows + down.row_bytes * down.n_rows);
  profile["expert"] = {
      {"layer", c.n_leading_dense}, {"bytes", expert_bytes}, {"n_embd", c.n_embd}, {"n_ff", w.n_ff_exp}};
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(opt.max_rows * c.n_embd)), out(x.size());
  for (float& v : x) v = dist(rng);

  fmt::print("one expert FFN ({:.1f} MB of weights), {} threads\n", expert_bytes / 1e6, threads);
  for (cpu::Isa isa : {cpu::Isa::kRef, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx}) {
    if (isa > cpu::detect_isa()) continue;
    const cpu::KernelTable table = cpu::make_kernel_table(isa);
    nlohmann::json curve = {{"isa", cpu::isa_name(isa)}};
    fmt::print("  {:<7}", cpu::isa_name(isa));
    for (int64_t rows = 1; rows <= opt.max_rows; rows *= 2) {
      const double s =
          best_seconds([&] { model::swiglu_ffn(table, m->pool(), gate, up, down, x.data(), rows, out.data()); });
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
