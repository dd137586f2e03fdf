// hetmoe bench: prefill and decode speed of a model under an offload policy, against the roofline that the DRAM
// bandwidth measured in the same run allows (decode reads every active weight once per token).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>

#include "cpu_kernels/bandwidth.h"
#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/ops.h"
#include "runtime/device/device.h"
#include "runtime/device/energy.h"
#include "runtime/engine/draft.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/session.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/io/input_file.h"
#include "runtime/io/output_file.h"
#include "runtime/model/config.h"
#include "runtime/model/model.h"
#include "runtime/model/split.h"
#include "scheduler/machine.h"
#include "scheduler/policies.h"
#include "scheduler/routing_trace.h"
#include "server/batcher.h"
#include "tools/commands.h"
#include "tools/svg_report.h"

namespace hetmoe::cli {
namespace {

using device::EnergyMeter;
using device::modelled_joules_per_token;

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// One measured run: prefill of the prompt, then greedy decoding, then the DRAM bandwidth with the same threads.
struct Run {
  double prefill_tok_s = 0, decode_tok_s = 0, bandwidth = 0, roofline_fraction = 0;
  double h2d_bytes_per_token = 0;         // with a device: bytes copied host to device per decoded token
  double d2h_bytes_per_token = 0;         // and device to host
  double ttft_s = 0;                      // the prompt's evaluation: time to the first token's logits
  double cpu_expert_bytes_per_token = 0;  // with a device: routed-expert weights the CPU read per decoded token
  // Weights the CPU streamed per decoded token: all the active ones without a device, else the routed experts (and
  // residuals) it ran.
  double dram_bytes_per_token = 0;
  double joules_per_token = 0;  // decode: measured (RAPL, NVML) or modelled (see PolicyResult)
  // With --draft: the decode's drafts and steps.
  double acceptance = 0, tokens_per_step = 0;
};

struct PolicyResult {
  std::string policy, device;
  int threads = 0;
  double bytes_per_token = 0;
  double device_bytes = 0;                // device memory in use (0: no device)
  model::DeviceExperts::Traffic traffic;  // the scheduler's work over all the runs (the warm-up included)
  std::vector<Run> runs;
  Run median;  // of each field separately
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// `label` names the run on the progress line, which shows the phase (prefill, decode with its token count).
Run run_cpu(model::Model& m, const BenchOptions& opt, double bytes_per_token, EnergyMeter& energy,
            cpu::ReadBandwidthProbe* probe, const std::string& label) {
  Run r;
  const model::ModelConfig& c = m.config();

  // Random prompt ids (fixed seed): speed does not depend on the text, only on the routing it causes.
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.n_vocab - 1));
  std::vector<int32_t> context(static_cast<size_t>(opt.depth)), prompt(static_cast<size_t>(opt.prompt));
  for (int32_t& t : context) t = id(rng);
  for (int32_t& t : prompt) t = id(rng);

  engine::Session session(m, opt.depth + opt.prompt + opt.gen + 1);
  const std::unique_ptr<engine::Drafter> drafter =
      engine::make_drafter(engine::parse_draft_source(opt.draft.source), m, session.n_ctx());
  if (drafter) session.observe(drafter->hidden_observer());
  if (!context.empty()) {
    fmt::print(stderr, "\r  {}: context of {} tokens       ", label, opt.depth);
    session.eval(context);
  }
  fmt::print(stderr, "\r  {}: prefill of {} tokens        ", label, opt.prompt);
  const auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits = session.eval(prompt);
  const auto t1 = std::chrono::steady_clock::now();
  const model::DeviceExperts* device = m.device_experts();
  const device::TransferStats before = device ? device->device().transfers() : device::TransferStats{};
  const uint64_t cpu_bytes_before = device ? device->cpu_expert_bytes() : 0;
  const double joules_before = energy.joules();
  if (drafter) {
    // Greedy decoding with drafts: gen tokens evaluated (one more than plain decoding's loop samples).
    fmt::print(stderr, "\r  {}: decode with drafts          ", label);
    engine::Sampler greedy({.temperature = 0.0f});
    const engine::GenerateResult g =
        engine::generate(session, logits, greedy, nullptr,
                         {.max_tokens = opt.gen + 1, .drafter = drafter.get(), .draft_max = opt.draft.max}, {});
    r.acceptance = static_cast<double>(g.accepted) / static_cast<double>(std::max<int64_t>(1, g.drafted));
    r.tokens_per_step = static_cast<double>(g.steps + g.accepted) / static_cast<double>(std::max<int64_t>(1, g.steps));
  } else {
    for (int i = 0; i < opt.gen; ++i) {
      if (i % 8 == 0) fmt::print(stderr, "\r  {}: decode {}/{}               ", label, i, opt.gen);
      const auto next = static_cast<int32_t>(cpu::first_argmax(logits.data(), static_cast<int64_t>(logits.size())));
      const int32_t one[1] = {next};
      logits = session.eval(one);
    }
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double joules = energy.joules() - joules_before;
  r.prefill_tok_s = opt.prompt / std::chrono::duration<double>(t1 - t0).count();
  r.decode_tok_s = opt.gen / std::chrono::duration<double>(t2 - t1).count();
  r.ttft_s = std::chrono::duration<double>(t1 - t0).count();
  if (device) {
    r.cpu_expert_bytes_per_token = static_cast<double>(device->cpu_expert_bytes() - cpu_bytes_before) / opt.gen;
    const device::TransferStats after = device->device().transfers();
    r.h2d_bytes_per_token = static_cast<double>(after.to_device_bytes - before.to_device_bytes) / opt.gen;
    r.d2h_bytes_per_token = static_cast<double>(after.to_host_bytes - before.to_host_bytes) / opt.gen;
  }
  r.dram_bytes_per_token = device ? r.cpu_expert_bytes_per_token : bytes_per_token;
  // Without counters: the modelled figure, from the bytes the CPU read per token.
  r.joules_per_token = energy.measured()
                           ? joules / opt.gen
                           : modelled_joules_per_token(m.pool().size(), 1.0 / r.decode_tok_s, r.dram_bytes_per_token);
  // Measured after the run, with the same threads: the roofline of this run's memory system (none: not asked).
  if (probe) {
    r.bandwidth = probe->measure();
    r.roofline_fraction = r.decode_tok_s * bytes_per_token / r.bandwidth;
  }
  return r;
}

// A warm-up run (the mapped weights fault in, scratch buffers size themselves; not counted), then opt.repeat
// measured runs. Shared machines vary from run to run, so the result is the median with the spread kept.
PolicyResult bench_policy(model::Model& m, const BenchOptions& opt, int threads, const std::string& policy,
                          EnergyMeter& energy) {
  PolicyResult r;
  r.policy = policy;
  r.threads = threads;
  r.device = fmt::format("{} ({} kernels)", cpu_model_name(), cpu::isa_name(cpu::kernels().isa));
  if (const model::DeviceExperts* d = m.device_experts()) r.device += fmt::format(" + {}", d->device().name());
  r.bytes_per_token = model::active_bytes_per_token(m.file(), m.config());
  cpu::ReadBandwidthProbe probe(m.pool());
  run_cpu(m, opt, r.bytes_per_token, energy, &probe, fmt::format("{}: warm-up run", r.policy));
  for (int i = 0; i < opt.repeat; ++i)
    r.runs.push_back(
        run_cpu(m, opt, r.bytes_per_token, energy, &probe, fmt::format("{}: run {}/{}", r.policy, i + 1, opt.repeat)));
  fmt::print(stderr, "\r  {}: done{:40}\n", r.policy, "");
  if (const model::DeviceExperts* d = m.device_experts()) r.traffic = d->traffic();
  auto field = [&](double Run::*f) {
    std::vector<double> v;
    for (const Run& run : r.runs) v.push_back(run.*f);
    return median_of(v);
  };
  r.median = {field(&Run::prefill_tok_s),
              field(&Run::decode_tok_s),
              field(&Run::bandwidth),
              field(&Run::roofline_fraction),
              field(&Run::h2d_bytes_per_token),
              field(&Run::d2h_bytes_per_token),
              field(&Run::ttft_s),
              field(&Run::cpu_expert_bytes_per_token),
              field(&Run::dram_bytes_per_token),
              field(&Run::joules_per_token),
              field(&Run::acceptance),
              field(&Run::tokens_per_step)};
  return r;
}

// What a step of k drafts costs: seconds[k] for the verification of k + 1 tokens in one batch (k = 0: one token's
// step), draft[k] for the drafter's proposal of k (empty for a source that costs nothing to ask, n-gram lookup).
struct StepCosts {
  std::vector<double> seconds, draft;
  // A step of k drafts in one-token steps.
  double step(size_t k) const { return (seconds[k] + (draft.empty() ? 0.0 : draft[k])) / seconds[0]; }
};

// The step costs for k = 0..max_k: after a prompt of opt.prompt random ids (after --depth more), each batch is
// evaluated and forgotten (its rows truncated) `repeat` times, the median kept; with an MTP drafter each proposal of k
// drafts likewise (its block writes the last position's row again and chains k - 1 more, as in a step of steady
// decoding). Random ids route like text of random content: each token to its own experts, as drafted text does.
StepCosts step_costs(model::Model& m, const BenchOptions& opt, int max_k, int repeat) {
  const model::ModelConfig& c = m.config();
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.n_vocab - 1));
  // The context (--depth) and the prompt as one batch: only the verification steps after them are timed.
  const int64_t kept = int64_t{opt.depth} + opt.prompt;
  std::vector<int32_t> prompt(static_cast<size_t>(kept));
  for (int32_t& t : prompt) t = id(rng);
  engine::Session session(m, kept + max_k + 1);
  const std::unique_ptr<engine::Drafter> drafter =
      engine::make_drafter(engine::parse_draft_source(opt.draft.source), m, session.n_ctx());
  const bool timed_drafts = drafter && drafter->hidden_observer();
  if (timed_drafts) session.observe(drafter->hidden_observer());
  session.eval(prompt);
  StepCosts costs;
  std::vector<int32_t> drafts;
  for (int k = 0; k <= max_k; ++k) {
    fmt::print(stderr, "\r  verification of {} tokens        ", k + 1);
    std::vector<int32_t> batch(static_cast<size_t>(k + 1));
    std::vector<double> times, draft_times;
    for (int i = 0; i < repeat + 1; ++i) {
      for (int32_t& t : batch) t = id(rng);
      auto t0 = std::chrono::steady_clock::now();
      if (timed_drafts && k > 0) {
        drafter->propose(session.tokens(), batch.front(), k, drafts);
        const auto t1 = std::chrono::steady_clock::now();
        if (i > 0) draft_times.push_back(std::chrono::duration<double>(t1 - t0).count());
        t0 = t1;
      }
      if (k == 0)
        session.eval(batch);
      else
        session.eval_all(batch);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      session.truncate(kept);
      if (i > 0) times.push_back(s);  // the first sizes the scratch buffers
    }
    costs.seconds.push_back(median_of(times));
    if (timed_drafts) costs.draft.push_back(k == 0 ? 0.0 : median_of(draft_times));
  }
  fmt::print(stderr, "\r{:50}\r", "");
  return costs;
}

// The drafts' acceptance on a known reply: the reply is replayed as greedy decoding with drafts would produce it,
// each step proposing drafts after the reply's next token and accepting those that are the reply's following tokens
// (what a model that writes this reply would accept), each step costed by the measured curve. A drafter that reads
// the model's hidden states (MTP) has the model evaluate the prompt and each step's accepted tokens.
struct Replay {
  int64_t tokens = 0, steps = 0, drafted = 0, accepted = 0;
  double cost = 0;  // the steps' time in one-token steps
};

Replay replay_drafts(model::Model& m, const text::Tokenizer& tokenizer, const std::string& path,
                     const BenchOptions& opt, const StepCosts& costs) {
  const std::string text = io::read_file(path, uint64_t{64} << 20, "--draft-text");
  const size_t split = text.find("\n===\n");
  if (split == std::string::npos) fail("--draft-text {}: no line '===' between the prompt and the reply", path);
  std::vector<int32_t> history = tokenizer.encode(text.substr(0, split + 1), /*add_special=*/true, false);
  const std::vector<int32_t> reply = tokenizer.encode(text.substr(split + 5), /*add_special=*/false, false);
  if (reply.size() < 2) fail("--draft-text {}: the reply after '===' is empty", path);
  const int64_t n_ctx = static_cast<int64_t>(history.size() + reply.size());
  const std::unique_ptr<engine::Drafter> drafter =
      engine::make_drafter(engine::parse_draft_source(opt.draft.source), m, n_ctx);
  std::optional<engine::Session> session;
  if (drafter->hidden_observer()) {
    if (n_ctx > m.config().n_ctx_train)
      fail("--draft-text {}: {} tokens do not fit the model's context of {}", path, n_ctx, m.config().n_ctx_train);
    session.emplace(m, n_ctx);
    session->observe(drafter->hidden_observer());
    session->eval(history);
  }
  Replay r;
  std::vector<int32_t> drafts;
  for (size_t pos = 0; pos < reply.size();) {
    fmt::print(stderr, "\r  replay: {}/{} tokens        ", pos, reply.size());
    const int room = static_cast<int>(std::min<size_t>(static_cast<size_t>(opt.draft.max), reply.size() - pos - 1));
    drafter->propose(history, reply[pos], room, drafts);
    size_t agreed = 0;
    while (agreed < drafts.size() && drafts[agreed] == reply[pos + 1 + agreed]) ++agreed;
    ++r.steps;
    r.drafted += static_cast<int64_t>(drafts.size());
    r.accepted += static_cast<int64_t>(agreed);
    r.cost += costs.step(drafts.size());
    const auto first = reply.begin() + static_cast<std::ptrdiff_t>(pos);
    const auto last = reply.begin() + static_cast<std::ptrdiff_t>(pos + 1 + agreed);
    history.insert(history.end(), first, last);
    if (session && last != reply.end()) session->eval(std::vector<int32_t>(first, last));
    pos += 1 + agreed;
  }
  fmt::print(stderr, "\r{:50}\r", "");
  r.tokens = static_cast<int64_t>(reply.size());
  return r;
}

// Expected tokens per verification step of k drafts when each is accepted with probability a (independently):
// 1 + a + a^2 + ... + a^k.
double expected_tokens_per_step(double a, int k) {
  double total = 0, p = 1;
  for (int i = 0; i <= k; ++i, p *= a) total += p;
  return total;
}

// The verification cost curve and the speedups it implies: at the acceptance measured here (with its draft
// source) and at the rates DeepSeek published for V3's MTP module (85-90 % for the second token, in the
// DeepSeek-V3 technical report), which say what MTP drafts would give on this machine.
void report_verification(const StepCosts& costs, double measured_acceptance, const std::string& source) {
  const bool drafting = !costs.draft.empty();
  fmt::print("\nverification step of k drafts (k + 1 tokens in one batch) against one token's step{}:\n",
             drafting ? fmt::format(", with the {} drafter's proposal of k", source) : "");
  fmt::print("{:>3} {:>10} {:>10} {:>10}   {:>22}   {:>20} {:>20}\n", "k", "verify ms", "draft ms", "cost",
             "speedup at measured", "at 85 %", "at 90 %");
  for (size_t k = 0; k < costs.seconds.size(); ++k) {
    const double cost = costs.step(k);
    const int kk = static_cast<int>(k);
    fmt::print("{:>3} {:>10.2f} {:>10} {:>9.2f}x   {:>21.2f}x   {:>19.2f}x {:>19.2f}x\n", k, costs.seconds[k] * 1e3,
               drafting ? fmt::format("{:.2f}", costs.draft[k] * 1e3) : "-", cost,
               expected_tokens_per_step(measured_acceptance, kk) / cost, expected_tokens_per_step(0.85, kk) / cost,
               expected_tokens_per_step(0.90, kk) / cost);
  }
  fmt::print(
      "speedup = expected tokens per step / cost, each draft accepted independently; measured: {} drafts' "
      "acceptance {:.0f} % in this run; 85 % and 90 %: DeepSeek-V3's published MTP acceptance (technical report), "
      "not measured here\n",
      source, 100 * measured_acceptance);
}

// One level of --concurrency: `level` streams submitted together to the server's batcher (random prompts of
// --prompt tokens, greedy, --gen tokens each), decoding in the same forward passes.
struct LevelRun {
  double aggregate_tok_s = 0;   // all streams' tokens after their first, over the time all of them were decoding
  double per_stream_tok_s = 0;  // the median stream's tokens after its first over its own decode time
  double ttft_s = 0;            // the median stream's time from submission to its first token
  double cpu_expert_bytes_per_token = 0, moves_per_token = 0, admissions_per_token = 0;
  double rows_per_step = 0;  // decode steps: rows per forward pass
  double acceptance = 0;     // with --draft: drafts accepted
};

LevelRun run_level(model::Model& m, const BenchOptions& opt, int level, uint32_t seed) {
  const model::ModelConfig& c = m.config();
  server::Batcher batcher(m, nullptr,
                          {.parallel = level,
                           .slot_ctx = opt.prompt + opt.gen + 1,
                           .max_batch_tokens = std::max<int64_t>(512, level),
                           .max_queue = static_cast<size_t>(level),
                           .draft = engine::parse_draft_source(opt.draft.source),
                           .draft_max = opt.draft.max});
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.n_vocab - 1));
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<server::Stream>> streams;
  for (int i = 0; i < level; ++i) {
    server::Job job;
    job.prompt.resize(static_cast<size_t>(opt.prompt));
    for (int32_t& t : job.prompt) t = id(rng);
    job.sampling.temperature = 0;
    job.max_tokens = opt.gen;
    streams.push_back(batcher.submit(std::move(job)));
  }
  std::vector<Clock::time_point> first(level), last(level);
  std::vector<int64_t> got(level, 0);
  std::vector<bool> done(level, false);
  server::BatcherStats at_decode{};
  std::vector<int64_t> base;  // each stream's tokens when all of them had their first
  bool decoding = false;
  for (int left = level; left > 0;) {
    for (int i = 0; i < level; ++i) {
      if (done[i]) continue;
      // Blocking, one stream after the other: the streams advance in the same steps, so the others' tokens are
      // there when this one's arrive. (Polling would take CPU time from the pool's threads, and a parallel loop
      // waits for its slowest thread.)
      const server::Stream::Update u = streams[i]->take(std::chrono::milliseconds(1000));
      const auto now = Clock::now();
      if (u.tokens > 0) {
        if (got[i] == 0) first[i] = now;
        got[i] += u.tokens;
        last[i] = now;
      }
      if (u.finished) {
        if (u.finish == server::Finish::kError) fail("concurrency {}: {}", level, u.error);
        done[i] = true;
        --left;
      }
    }
    if (!decoding && std::all_of(got.begin(), got.end(), [](int64_t g) { return g > 0; })) {
      decoding = true;
      at_decode = batcher.stats();
      base = got;
    }
  }
  const server::BatcherStats end = batcher.stats();
  LevelRun r;
  std::vector<double> per_stream, ttft;
  for (int i = 0; i < level; ++i) {
    per_stream.push_back(static_cast<double>(got[i] - 1) /
                         std::max(1e-9, std::chrono::duration<double>(last[i] - first[i]).count()));
    ttft.push_back(std::chrono::duration<double>(first[i] - t0).count());
  }
  // From the moment every stream has its first token, every step is a decode step of all of them.
  const double rows = static_cast<double>(std::max<int64_t>(1, end.step_rows - at_decode.step_rows));
  const auto start = *std::max_element(first.begin(), first.end());
  const auto stop = *std::max_element(last.begin(), last.end());
  int64_t decoded = 0;
  for (int i = 0; i < level; ++i) decoded += got[i] - base[i];
  r.aggregate_tok_s =
      static_cast<double>(decoded) / std::max(1e-9, std::chrono::duration<double>(stop - start).count());
  r.per_stream_tok_s = median_of(per_stream);
  r.ttft_s = median_of(ttft);
  r.cpu_expert_bytes_per_token = static_cast<double>(end.cpu_expert_bytes - at_decode.cpu_expert_bytes) / rows;
  r.moves_per_token = static_cast<double>(end.expert_moves - at_decode.expert_moves) / rows;
  r.admissions_per_token = static_cast<double>(end.expert_admissions - at_decode.expert_admissions) / rows;
  r.rows_per_step = rows / static_cast<double>(std::max<int64_t>(1, end.steps - at_decode.steps));
  r.acceptance =
      static_cast<double>(end.accepted_tokens) / static_cast<double>(std::max<int64_t>(1, end.drafted_tokens));
  return r;
}

struct ConcurrencyResult {
  std::string policy;
  std::vector<std::pair<int, std::vector<LevelRun>>> levels;  // streams, measured runs
};

// The concurrency table: per policy and level, medians [min-max] of the runs; the aggregate speedup over the first
// level; with --json, every run.
int report_concurrency(const BenchOptions& opt, engine::Engine& e, const std::vector<ConcurrencyResult>& results,
                       const std::optional<double>& zipf, bool trace) {
  if (zipf) fmt::print("routing: synthetic, Zipf s = {} (the model's outputs are not its own)\n", *zipf);
  if (trace) fmt::print("routing: replayed from {} (the model's outputs are not its own)\n", opt.trace);
  const std::string device = e.device() ? e.device()->name() : "none";
  fmt::print(
      "model {} ({:.2f} GB), {} threads, prompts of {} tokens, {} tokens per stream, median [min-max] of {} runs; "
      "device: {}\n",
      opt.model, static_cast<double>(e.model().file().file_size()) / 1e9, e.model().pool().size(), opt.prompt, opt.gen,
      opt.repeat, device);
  if (opt.draft.source != "none")
    fmt::print("streams decode with --draft {} --draft-max {} (rows/step counts drafts)\n", opt.draft.source,
               opt.draft.max);
  nlohmann::json out = nlohmann::json::array();
  for (const ConcurrencyResult& r : results) {
    fmt::print("{:<9} {:>7}  {:<24} {:<20} {:<8} {:<9} {:<14} {:<11} {}\n", "policy", "streams",
               "aggregate decode tok/s", "per-stream tok/s", "TTFT s", "rows/step", "CPU expert MB", "moves",
               "admitted");
    fmt::print("{:<9} {:>7}  {:<24} {:<20} {:<8} {:<9} {:<14} {:<11} {}\n", "", "", "", "", "", "", "per token",
               "per token", "per token");
    double base = 0;
    nlohmann::json levels = nlohmann::json::array();
    for (const auto& entry : r.levels) {
      const int level = entry.first;
      const std::vector<LevelRun>& runs = entry.second;
      auto field = [&](double LevelRun::*f) {
        std::vector<double> v;
        for (const LevelRun& run : runs) v.push_back(run.*f);
        const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
        return std::make_tuple(median_of(v), *lo, *hi);
      };
      const auto [agg, agg_lo, agg_hi] = field(&LevelRun::aggregate_tok_s);
      const auto [per, per_lo, per_hi] = field(&LevelRun::per_stream_tok_s);
      const double ttft = std::get<0>(field(&LevelRun::ttft_s));
      const double rows = std::get<0>(field(&LevelRun::rows_per_step));
      const double cpu_bytes = std::get<0>(field(&LevelRun::cpu_expert_bytes_per_token));
      const double moves = std::get<0>(field(&LevelRun::moves_per_token));
      const double admitted = std::get<0>(field(&LevelRun::admissions_per_token));
      if (base == 0) base = agg;
      fmt::print("{:<9} {:>7}  {:<24} {:<20} {:<8.3f} {:<9.1f} {:<14.1f} {:<11.2f} {:.2f}\n", r.policy, level,
                 fmt::format("{:.1f} [{:.1f}-{:.1f}] {:.2f}x", agg, agg_lo, agg_hi, agg / base),
                 fmt::format("{:.1f} [{:.1f}-{:.1f}]", per, per_lo, per_hi), ttft, rows, cpu_bytes / 1e6, moves,
                 admitted);
      const double acceptance = std::get<0>(field(&LevelRun::acceptance));
      if (opt.draft.source != "none") fmt::print("{:<9} {:>7}  drafts accepted {:.0f} %\n", "", "", 100 * acceptance);
      nlohmann::json rs = nlohmann::json::array();
      for (const LevelRun& run : runs)
        rs.push_back({{"aggregate_decode_tok_s", run.aggregate_tok_s},
                      {"per_stream_decode_tok_s", run.per_stream_tok_s},
                      {"ttft_s", run.ttft_s},
                      {"rows_per_step", run.rows_per_step},
                      {"cpu_expert_bytes_per_token", run.cpu_expert_bytes_per_token},
                      {"moves_per_token", run.moves_per_token},
                      {"admissions_per_token", run.admissions_per_token},
                      {"draft_acceptance", run.acceptance}});
      levels.push_back({{"streams", level},
                        {"aggregate_decode_tok_s", agg},
                        {"per_stream_decode_tok_s", per},
                        {"ttft_s", ttft},
                        {"rows_per_step", rows},
                        {"cpu_expert_bytes_per_token", cpu_bytes},
                        {"moves_per_token", moves},
                        {"admissions_per_token", admitted},
                        {"speedup", agg / base},
                        {"draft_acceptance", acceptance},
                        {"runs", rs}});
    }
    out.push_back({{"policy", r.policy}, {"levels", levels}});
  }
  if (!opt.json.empty())
    io::write_file(opt.json, nlohmann::json{{"model", opt.model},
                                            {"prompt_tokens", opt.prompt},
                                            {"gen_tokens", opt.gen},
                                            {"device", device},
                                            {"concurrency", out}}
                                     .dump(2) +
                                 "\n");
  return 0;
}

// Every MoE layer's routing replaced by the steps of a source: Zipf draws (--synthetic zipf:S: a fixed ranking of
// each layer's experts, one workload for the warm-up counts that place experts and for the runs) or a trace replayed
// (--trace FILE).
class ReplacedRouting final : public model::RoutingOverride {
 public:
  using Source = std::function<sched::RoutingStep(int64_t layer, int64_t n_tokens)>;
  explicit ReplacedRouting(Source source) : source_(std::move(source)) {}
  void reroute(int64_t layer, int64_t n, int64_t n_used, int32_t* ids, float* weights) override {
    const sched::RoutingStep step = source_(layer, n);
    std::copy_n(step.ids.begin(), n * n_used, ids);
    std::copy_n(step.weights.begin(), n * n_used, weights);
  }

 private:
  Source source_;
};

// The exponent of "zipf:S"; fails for anything else.
double zipf_exponent(const std::string& spec) {
  double s = -1;
  if (spec.rfind("zipf:", 0) == 0) {
    const char* begin = spec.c_str() + 5;
    char* end = nullptr;
    s = std::strtod(begin, &end);
    if (end == begin || *end != '\0') s = -1;
  }
  if (!(s >= 0)) fail("--synthetic {}: use zipf:S with an exponent S >= 0 (zipf:0 is uniform)", spec);
  return s;
}

// "median [min-max]" of one field over the runs.
std::string spread(const PolicyResult& r, double Run::*f, double scale, int decimals) {
  double lo = 1e300, hi = -1e300;
  for (const Run& run : r.runs) {
    lo = std::min(lo, run.*f);
    hi = std::max(hi, run.*f);
  }
  return fmt::format("{:.{}f} [{:.{}f}-{:.{}f}]", r.median.*f * scale, decimals, lo * scale, decimals, hi * scale,
                     decimals);
}

}  // namespace

// Quotes a word for /bin/sh.
std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// One llama-bench run of the same prompt and generation lengths (one repetition): its prefill and decode tok/s.
std::pair<double, double> llama_bench_run(const BenchOptions& opt, int threads) {
  // -d only when asked for: llama-bench builds before its depth option reject it.
  const std::string depth = opt.depth > 0 ? fmt::format(" -d {}", opt.depth) : "";
  const std::string cmd =
      fmt::format("{} -m {} -t {} -p {} -n {}{} -r 1 -o json 2>&1", shell_quoted(opt.vs_llama_bench),
                  shell_quoted(opt.model), threads, opt.prompt, opt.gen, depth);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) fail("--vs-llama-bench: cannot run {}", opt.vs_llama_bench);
  std::string out;
  char buf[4096];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, got);
  const int status = ::pclose(pipe);
  // Its JSON is the array in what it printed (logs may come first).
  const size_t open = out.find("[\n"), close = out.rfind(']');
  if (status != 0 || open == std::string::npos || close == std::string::npos || close < open) {
    // Its last line says why.
    const size_t end = out.find_last_not_of('\n');
    const size_t from = end == std::string::npos ? 0 : out.rfind('\n', end);
    const size_t begin = from == std::string::npos || end == std::string::npos ? 0 : from + 1;
    const std::string last = end == std::string::npos ? "no output" : out.substr(begin, end + 1 - begin);
    fail("--vs-llama-bench: {} failed (exit status {}): {}", opt.vs_llama_bench, status, last);
  }
  const nlohmann::json j = nlohmann::json::parse(out.substr(open, close - open + 1), nullptr, false);
  double prefill = 0, decode = 0;
  if (j.is_array())
    for (const nlohmann::json& t : j) {
      if (!t.contains("avg_ts") || !t.contains("n_prompt") || !t.contains("n_gen")) continue;
      if (t["n_prompt"].get<int64_t>() > 0 && t["n_gen"].get<int64_t>() == 0) prefill = t["avg_ts"].get<double>();
      if (t["n_gen"].get<int64_t>() > 0 && t["n_prompt"].get<int64_t>() == 0) decode = t["avg_ts"].get<double>();
    }
  if (prefill <= 0 || decode <= 0)
    fail("--vs-llama-bench: {} printed no prefill and decode results", opt.vs_llama_bench);
  return {prefill, decode};
}

// hetmoe's CPU runs and llama-bench's, alternating (a shared machine's speed drifts within minutes), side by side.
int vs_llama_bench(const BenchOptions& opt, int threads) {
  if (opt.policies != std::vector<std::string>{"cpu"} || !opt.concurrency.empty() || opt.draft.source != "none" ||
      !opt.synthetic.empty() || !opt.trace.empty())
    fail("--vs-llama-bench compares the CPU runs of both: no other policy, --concurrency, --draft or routing");
  const std::unique_ptr<engine::Engine> e = open_engine({opt.model, threads, opt.critical, {.kind = "cpu"}});
  model::Model& m = e->model();
  EnergyMeter energy;
  const double bytes = model::active_bytes_per_token(m.file(), m.config());
  // hetmoe's weights fault in first, one read per 2 MB: its load may have dropped the file from the page cache to read
  // it again in 2 MB pages, and llama-bench reading it first would bring it back in small ones (the runs measured
  // hetmoe's decode through 4 kB pages then).
  for (const gguf::TensorInfo& t : m.file().tensors())
    for (size_t off = 0; off < static_cast<size_t>(t.n_rows) * t.row_bytes; off += size_t{2} << 20)
      (void)*static_cast<const volatile uint8_t*>(t.data + off);
  llama_bench_run(opt, threads);                                   // both warm up: caches settle
  run_cpu(m, opt, bytes, energy, nullptr, "hetmoe: warm-up run");  // (not counted; no roofline shown here)
  std::vector<double> hp, hd, lp, ld;
  for (int i = 0; i < opt.repeat; ++i) {
    const Run r = run_cpu(m, opt, bytes, energy, nullptr, fmt::format("hetmoe: run {}/{}", i + 1, opt.repeat));
    hp.push_back(r.prefill_tok_s);
    hd.push_back(r.decode_tok_s);
    fmt::print(stderr, "\r  llama-bench: run {}/{}{:30}", i + 1, opt.repeat, "");
    const auto [p, d] = llama_bench_run(opt, threads);
    lp.push_back(p);
    ld.push_back(d);
  }
  fmt::print(stderr, "\r{:60}\r", "");
  auto cell = [](const std::vector<double>& v) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return fmt::format("{:.1f} [{:.1f}-{:.1f}]", median_of(v), *lo, *hi);
  };
  fmt::print("model {}, {} threads, CPU only, median [min-max] of {} alternating runs each\n", opt.model, threads,
             opt.repeat);
  if (opt.depth > 0)
    fmt::print(
        "at depth {}: both after {} tokens of context; hetmoe decodes after its prompt (depth {}), llama-bench's "
        "tg from depth {}\n",
        opt.depth, opt.depth, opt.depth + opt.prompt, opt.depth);
  fmt::print("{:<12} {:<26} {:<26} {}\n", "", "hetmoe", "llama.cpp (llama-bench)", "hetmoe / llama.cpp");
  fmt::print("{:<12} {:<26} {:<26} {:.2f}x\n", fmt::format("pp{} tok/s", opt.prompt), cell(hp), cell(lp),
             median_of(hp) / median_of(lp));
  fmt::print("{:<12} {:<26} {:<26} {:.2f}x\n", fmt::format("tg{} tok/s", opt.gen), cell(hd), cell(ld),
             median_of(hd) / median_of(ld));
  if (!opt.json.empty()) {
    const nlohmann::json j = {{"model", opt.model},        {"threads", threads},        {"prompt_tokens", opt.prompt},
                              {"gen_tokens", opt.gen},     {"depth_tokens", opt.depth}, {"hetmoe_prefill_tok_s", hp},
                              {"hetmoe_decode_tok_s", hd}, {"llama_prefill_tok_s", lp}, {"llama_decode_tok_s", ld}};
    io::write_file(opt.json, j.dump(2) + "\n");
  }
  return 0;
}

int bench(const BenchOptions& opt) {
  if (opt.prompt < 1 || opt.gen < 1) fail("--prompt and --gen must be at least 1");
  if (opt.repeat < 1) fail("--repeat must be at least 1");
  if (opt.depth > 0 && !opt.concurrency.empty())
    fail("--depth measures one stream at a depth; --concurrency streams start from their prompts");
  if (!opt.vs_llama_bench.empty()) return vs_llama_bench(opt, resolve_threads(opt.threads));
  if (!opt.draft_text.empty()) {
    if (opt.draft.source == "none") fail("--draft-text measures drafts: give --draft ngram or --draft mtp");
    // Readable and in shape before the model loads.
    const std::string text = io::read_file(opt.draft_text, uint64_t{64} << 20, "--draft-text");
    const size_t split = text.find("\n===\n");
    if (split == std::string::npos)
      fail("--draft-text {}: no line '===' between the prompt and the reply", opt.draft_text);
    if (text.find_first_not_of(" \n\t", split + 5) == std::string::npos)
      fail("--draft-text {}: the reply after '===' is empty", opt.draft_text);
  }
  // What the policies need, checked before anything is loaded.
  std::vector<const sched::PolicyInfo*> infos;
  for (const std::string& p : opt.policies) {
    try {
      infos.push_back(&sched::find_policy(p));
    } catch (const std::invalid_argument& e) {
      fail("{}", e.what());
    }
  }
  const int threads = resolve_threads(opt.threads);
  for (const sched::PolicyInfo* p : infos) {
    if (p->traits.uses_device && !engine::wants_device(opt.device))
      fail("policy {} needs a device: --device emulated, or --device cuda on a machine with a GPU", p->name);
    if (p->traits.needs_split_model && !gguf::GgufFile::open(opt.model).find(model::kSplitVersionKey))
      fail("policy {} needs a split model (hetmoe split writes one)", p->name);
  }

  // Synthetic or replayed routing: the override for the runs, and warm-up counts of the same workload (Zipf: another
  // draw of it; a trace: its own counts) for the placement.
  if (!opt.synthetic.empty() && !opt.trace.empty()) fail("--synthetic and --trace: use one of them");
  std::optional<double> zipf;
  if (!opt.synthetic.empty()) zipf = zipf_exponent(opt.synthetic);
  std::optional<sched::RoutingTrace> trace;
  std::vector<std::vector<double>> warm;
  int64_t n_expert = 0, n_used = 0;
  if (zipf || !opt.trace.empty()) {
    const model::ModelConfig c = model::read_config(gguf::GgufFile::open(opt.model));
    if (c.n_expert == 0) fail("{}: {} has no routed experts", zipf ? "--synthetic" : "--trace", opt.model);
    n_expert = c.n_expert;
    n_used = c.n_expert_used;
    if (zipf) {
      warm = sched::ZipfRouter(n_expert, n_used, *zipf, 1, 3).counts(c.n_layer, c.n_leading_dense, 256);
    } else {
      try {
        trace = engine::load_routing_trace(opt.trace);
      } catch (const std::exception& e) {
        fail("--trace: {}", e.what());
      }
      if (trace->n_layer != c.n_layer || trace->n_expert != n_expert || trace->n_used != n_used)
        fail("--trace {}: recorded for {} layers, {} experts, {} used; {} has {}, {}, {}", opt.trace, trace->n_layer,
             trace->n_expert, trace->n_used, opt.model, c.n_layer, n_expert, n_used);
      for (int64_t l = c.n_leading_dense; l < c.n_layer; ++l)
        if (std::none_of(trace->steps.begin(), trace->steps.end(),
                         [&](const sched::RoutingStep& s) { return s.layer == l && s.n_tokens > 0; }))
          fail("--trace {}: no token routed in MoE layer {}", opt.trace, l);
      warm = trace->counts();
    }
  }

  // A warm trace is read once for all the policies.
  DeviceOptions device_options = opt.device;
  if (!device_options.warm_trace.empty()) {
    device_options.warm_counts = engine::load_routing_trace(device_options.warm_trace).counts();
    device_options.warm_trace.clear();
  }

  // Each policy on a freshly loaded model (the file stays mapped by the OS cache): cpu without a device, the others
  // with the device of --device, placed and run by their plans.
  std::vector<PolicyResult> results;
  std::vector<ConcurrencyResult> concurrency;
  std::optional<StepCosts> verification;  // with --draft: what a step of k drafts costs, k = 0..
  std::unique_ptr<engine::Engine> e;
  EnergyMeter energy;
  for (const std::string& policy : opt.policies) {
    DeviceOptions d = device_options;
    d.policy = policy;
    if (!sched::find_policy(policy).traits.uses_device) d.kind = "cpu";
    if (!warm.empty() && opt.device.warm_trace.empty()) d.warm_counts = warm;
    e.reset();
    e = open_engine({opt.model, threads, opt.critical, d});
    model::Model* m = &e->model();
    // Each policy meets the same routing from its start.
    std::optional<ReplacedRouting> routing;
    if (zipf)
      routing.emplace([router = sched::ZipfRouter(n_expert, n_used, *zipf, 1, 2)](int64_t l, int64_t n) mutable {
        return router.draw(l, n);
      });
    if (trace)
      routing.emplace(
          [replay = sched::TraceReplay(*trace)](int64_t l, int64_t n) mutable { return replay.next(l, n); });
    m->set_routing_override(routing ? &*routing : nullptr);
    if (!opt.concurrency.empty()) {
      ConcurrencyResult cr{.policy = policy, .levels = {}};
      run_level(*m, opt, opt.concurrency.front(), 99);  // warm-up: the mapped weights fault in
      for (const int level : opt.concurrency) {
        std::vector<LevelRun> runs;
        for (int i = 0; i < opt.repeat; ++i) {
          fmt::print(stderr, "\r  {}: {} streams, run {}/{}        ", policy, level, i + 1, opt.repeat);
          runs.push_back(run_level(*m, opt, level, static_cast<uint32_t>(1000 * level + i)));
        }
        cr.levels.emplace_back(level, std::move(runs));
      }
      fmt::print(stderr, "\r  {}: done{:40}\n", policy, "");
      m->set_routing_override(nullptr);
      concurrency.push_back(std::move(cr));
      continue;
    }
    PolicyResult r = bench_policy(*m, opt, threads, policy, energy);
    if (opt.draft.source != "none" && !verification)
      verification = step_costs(*m, opt, opt.draft.max, std::max(5, opt.repeat));
    m->set_routing_override(nullptr);
    if (const model::DeviceExperts* dev = m->device_experts())
      r.device_bytes = static_cast<double>(dev->device().used());
    results.push_back(std::move(r));
  }
  fmt::print(stderr, "\n");

  if (!concurrency.empty()) return report_concurrency(opt, *e, concurrency, zipf, trace.has_value());
  if (zipf) fmt::print("routing: synthetic, Zipf s = {} (the model's outputs are not its own)\n", *zipf);
  if (trace) fmt::print("routing: replayed from {} (the model's outputs are not its own)\n", opt.trace);
  fmt::print("model {}  ({:.2f} GB file, {:.3f} GB read per decoded token), median [min-max] of {} runs\n", opt.model,
             static_cast<double>(e->model().file().file_size()) / 1e9, results.front().bytes_per_token / 1e9,
             opt.repeat);
  if (opt.depth > 0)
    fmt::print("after {} tokens of context (not timed); roofline % counts the weights only, not the cache rows\n",
               opt.depth);
  const bool drafts = opt.draft.source != "none";
  if (drafts)
    fmt::print("decode with --draft {} --draft-max {} (greedy); roofline % counts one weight read per token\n",
               opt.draft.source, opt.draft.max);
  fmt::print("{:<9} {:>7}  {:<26} {:<24} {:<10} {:<18} {:<12}  {}\n", "policy", "threads", "prefill tok/s",
             "decode tok/s", "TTFT s", "DRAM GB/s", "roofline %", "device");
  for (const PolicyResult& r : results) {
    fmt::print("{:<9} {:>7}  {:<26} {:<24} {:<10.3f} {:<18} {:<12}  {}\n", r.policy, r.threads,
               spread(r, &Run::prefill_tok_s, 1, 1), spread(r, &Run::decode_tok_s, 1, 2), r.median.ttft_s,
               spread(r, &Run::bandwidth, 1e-9, 1), spread(r, &Run::roofline_fraction, 100, 0), r.device);
    fmt::print("{:<9} energy per decoded token: {} J ({})\n", "", spread(r, &Run::joules_per_token, 1, 2),
               energy.source());
    if (drafts)
      fmt::print("{:<9} drafts accepted {} %, tokens per step {}\n", "", spread(r, &Run::acceptance, 100, 0),
                 spread(r, &Run::tokens_per_step, 1, 2));
    if (r.device_bytes > 0)
      fmt::print(
          "{:<9} per decoded token: host to device {} KB, device to host {} KB, CPU expert weights {} MB; "
          "device memory {:.2f} GB\n",
          "", spread(r, &Run::h2d_bytes_per_token, 1e-3, 1), spread(r, &Run::d2h_bytes_per_token, 1e-3, 1),
          spread(r, &Run::cpu_expert_bytes_per_token, 1e-6, 1), r.device_bytes / 1e9);
    const model::DeviceExperts::Traffic& t = r.traffic;
    if (t.moves + t.admissions + t.prefetches > 0)
      fmt::print("{:<9} scheduler over {} runs: {} experts moved, {} admitted, {} evicted, {} prefetched ({} used)\n",
                 "", opt.repeat + 1, t.moves, t.admissions, t.evictions, t.prefetches, t.prefetch_hits);
  }

  std::optional<Replay> replay;
  if (verification) {
    report_verification(*verification, results.front().median.acceptance, opt.draft.source);
    if (!opt.draft_text.empty()) {
      replay = replay_drafts(e->model(), *open_tokenizer(e->model().file()), opt.draft_text, opt, *verification);
      fmt::print(
          "{} drafts on the reply of {} ({} tokens, replayed: what a model writing that reply accepts): {} of {} "
          "accepted ({:.0f} %), {:.2f} tokens per step; with the costs above {:.2f}x plain decoding's speed\n",
          opt.draft.source, opt.draft_text, replay->tokens, replay->accepted, replay->drafted,
          100.0 * static_cast<double>(replay->accepted) / static_cast<double>(std::max<int64_t>(1, replay->drafted)),
          static_cast<double>(replay->tokens) / static_cast<double>(replay->steps),
          static_cast<double>(replay->tokens) / replay->cost);
    }
  }

  if (!opt.svg.empty()) {
    std::vector<PolicyBar> bars;
    for (const PolicyResult& r : results) bars.push_back({r.policy, r.median.prefill_tok_s, r.median.decode_tok_s});
    std::vector<CostCurve> curves;
    if (!opt.device.profile.empty()) {
      // One routed expert of the model (its first MoE layer) against --profile's link and device.
      curves = crossover_curves(engine::load_machine(opt.device.profile),
                                e->model().ffn_weights(e->model().config().n_leading_dense).moe.expert_shape());
    }
    // Say what ran: an emulated device is host memory behind a throttled link, not a GPU.
    const bool emulated = std::any_of(results.begin(), results.end(), [](const PolicyResult& r) {
      return r.device.find("emulated") != std::string::npos;
    });
    const SvgLabels labels{
        .title = opt.model,
        .source =
            fmt::format("measured by hetmoe bench, median of {} runs{}", opt.repeat,
                        emulated ? "; the device is EMULATED (host memory behind a modelled link, not a GPU)" : ""),
        .no_curves = opt.device.profile.empty()
                         ? "no --profile given: no crossover curves (hetmoe calibrate --device writes one)"
                         : "the profile has no device: no crossover to draw"};
    write_svg(opt.svg, policies_svg(labels, bars, curves));
  }
  if (!opt.json.empty()) {
    nlohmann::json j = {{"model", opt.model},
                        {"prompt_tokens", opt.prompt},
                        {"gen_tokens", opt.gen},
                        {"depth_tokens", opt.depth},
                        {"results", nlohmann::json::array()}};
    for (const PolicyResult& r : results) {
      nlohmann::json runs = nlohmann::json::array();
      for (const Run& run : r.runs)
        runs.push_back({{"prefill_tok_s", run.prefill_tok_s},
                        {"decode_tok_s", run.decode_tok_s},
                        {"dram_read_bytes_per_s", run.bandwidth},
                        {"roofline_fraction", run.roofline_fraction},
                        {"h2d_bytes_per_token", run.h2d_bytes_per_token},
                        {"d2h_bytes_per_token", run.d2h_bytes_per_token},
                        {"ttft_s", run.ttft_s},
                        {"cpu_expert_bytes_per_token", run.cpu_expert_bytes_per_token},
                        {"dram_read_bytes_per_token", run.dram_bytes_per_token},
                        {"energy_j_per_token", run.joules_per_token},
                        {"energy_source", energy.source()},
                        {"draft_acceptance", run.acceptance},
                        {"tokens_per_step", run.tokens_per_step}});
      // The agreed fields hold the medians; "runs" keeps every measurement.
      j["results"].push_back(
          {{"policy", r.policy},
           {"device", r.device},
           {"threads", r.threads},
           {"prefill_tok_s", r.median.prefill_tok_s},
           {"decode_tok_s", r.median.decode_tok_s},
           {"bytes_per_token", r.bytes_per_token},
           {"dram_read_bytes_per_s", r.median.bandwidth},
           {"roofline_fraction", r.median.roofline_fraction},
           {"h2d_bytes_per_token", r.median.h2d_bytes_per_token},
           {"d2h_bytes_per_token", r.median.d2h_bytes_per_token},
           {"ttft_s", r.median.ttft_s},
           {"cpu_expert_bytes_per_token", r.median.cpu_expert_bytes_per_token},
           {"dram_read_bytes_per_token", r.median.dram_bytes_per_token},  // the name simulate's JSON uses
           {"device_memory_bytes", r.device_bytes},
           {"energy_j_per_token", r.median.joules_per_token},
           {"energy_source", energy.source()},
           {"scheduler",
            {{"runs", opt.repeat + 1},
             {"moves", r.traffic.moves},
             {"admissions", r.traffic.admissions},
             {"evictions", r.traffic.evictions},
             {"prefetches", r.traffic.prefetches},
             {"prefetch_hits", r.traffic.prefetch_hits}}},
           {"draft_acceptance", r.median.acceptance},
           {"tokens_per_step", r.median.tokens_per_step},
           {"runs", runs}});
    }
    if (verification) {
      j["draft"] = {{"source", opt.draft.source}, {"max", opt.draft.max}};
      for (size_t k = 0; k < verification->seconds.size(); ++k)
        j["verification"].push_back({{"drafts", k},
                                     {"seconds", verification->seconds[k]},
                                     {"draft_seconds", verification->draft.empty() ? 0.0 : verification->draft[k]},
                                     {"cost", verification->step(k)}});
      if (replay)
        j["draft_text"] = {
            {"file", opt.draft_text},       {"reply_tokens", replay->tokens},
            {"steps", replay->steps},       {"drafted", replay->drafted},
            {"accepted", replay->accepted}, {"speedup", static_cast<double>(replay->tokens) / replay->cost}};
    }
    io::write_file(opt.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace hetmoe::cli
