// Dot-product throughput per ISA tier and weight format, on weights that stay in L2 (the compute ceiling, not
// the DRAM one; "dot/..."), and matrix-vector products over 512 MB of weights streamed from DRAM through the
// pool at 1 and 2 threads ("stream/..."). Prints GB/s of weight bytes consumed. Run: build/tests/bench/bench_dot
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include "cpu_kernels/bandwidth.h"
#include "cpu_kernels/experts.h"
#include "cpu_kernels/isa.h"
#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/thread_pool.h"
#include "quant/ref.h"

namespace {

using hetmoe::cpu::Isa;
using hetmoe::quant::GgmlType;

// The tier's kernel table; nullopt, and the benchmark marked skipped, where this CPU lacks the tier.
std::optional<hetmoe::cpu::KernelTable> table_for(benchmark::State& state, Isa isa) {
  if (isa > hetmoe::cpu::detect_isa()) {
    state.SkipWithError("tier not supported by this CPU");
    return std::nullopt;
  }
  return hetmoe::cpu::make_kernel_table(isa);
}

// n_act activation rows per weight row through dot_rows, or per 8-row tile through gemm_tile (the prefill paths);
// GB/s counts each weight byte once per activation row, so it compares with bm_dot directly. n_act 0: all rows
// against one activation through dot_many (the decode path).
// `rows` 64: the weights stay in L2 (the compute ceiling); 65536 (150 MB at 4.5 bits): they stream from DRAM, as an
// expert's rows do in prefill.
void bm_dot(benchmark::State& state, Isa isa, GgmlType type, int64_t n_act, bool use_tiles = false, int64_t rows = 64) {
  const std::optional<hetmoe::cpu::KernelTable> tier = table_for(state, isa);
  if (!tier) return;
  const hetmoe::cpu::KernelTable& table = *tier;
  constexpr int64_t kCols = 2048;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(kCols * std::min<int64_t>(rows, 64)), x(kCols);
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  const size_t rb = hetmoe::quant::row_bytes(type, kCols);
  const size_t ab = hetmoe::quant::activation_row_bytes(type, kCols);
  // 64-byte aligned rows, as in a GGUF file whose row size is a multiple of the alignment.
  std::vector<uint8_t> wq_storage(rb * rows + 64), act_storage(ab * std::max<int64_t>(1, n_act) + 64);
  uint8_t* wq = wq_storage.data() + (64 - reinterpret_cast<uintptr_t>(wq_storage.data()) % 64) % 64;
  uint8_t* act = act_storage.data() + (64 - reinterpret_cast<uintptr_t>(act_storage.data()) % 64) % 64;
  // 64 rows quantized, repeated (the values do not matter for the speed).
  for (int64_t r = 0; r < rows; ++r)
    if (r < 64)
      hetmoe::quant::quantize_row(type, &w[r * kCols], wq + r * rb, kCols);
    else
      std::copy(wq + (r % 64) * rb, wq + (r % 64 + 1) * rb, wq + r * rb);
  for (int64_t j = 0; j < std::max<int64_t>(1, n_act); ++j)
    hetmoe::quant::quantize_activation(hetmoe::quant::type_info(type).vec_dot_type, x.data(), act + j * ab, kCols);
  std::vector<float> out(std::max(rows, n_act * hetmoe::cpu::kTileRows));
  const hetmoe::cpu::GemmTileFn tile = use_tiles ? table.tile_for(type) : nullptr;
  if (use_tiles && !tile) {
    state.SkipWithError("no tile kernel for this format in this tier");
    return;
  }
  for (auto _ : state) {
    if (n_act == 0) {
      table.dot_many(type, kCols, wq, rb, rows, act, out.data());
    } else if (tile) {
      for (int64_t r = 0; r < rows; r += hetmoe::cpu::kTileRows)
        tile(kCols, wq + r * rb, rb, act, ab, n_act, out.data(), hetmoe::cpu::kTileRows);
    } else {
      for (int64_t r = 0; r < rows; ++r) table.dot_rows(type, kCols, wq + r * rb, act, ab, n_act, out.data());
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(rb * rows) * std::max<int64_t>(1, n_act));
}

// One matrix-vector product over a 512 MB matrix (far beyond the last-level cache) in 2 MB pages, so every weight byte
// comes from DRAM: the gap to bm_dot is what memory stalls cost the kernel, the gap to bm_stream_loads what the
// kernel's arithmetic costs its stream.
void bm_stream(benchmark::State& state, Isa isa, GgmlType type, int threads) {
  if (isa > hetmoe::cpu::detect_isa()) {
    state.SkipWithError("tier not supported by this CPU");
    return;
  }
  const hetmoe::cpu::KernelTable table = hetmoe::cpu::make_kernel_table(isa);
  constexpr int64_t kCols = 2048, kTileRows = 256;
  const size_t rb = hetmoe::quant::row_bytes(type, kCols);
  const int64_t rows = static_cast<int64_t>((size_t{512} << 20) / rb) / kTileRows * kTileRows;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(kCols * kTileRows), x(kCols), y(rows);
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> tile(rb * kTileRows);
  const hetmoe::cpu::HugePageBuffer wq(rb * rows);
  for (int64_t r = 0; r < kTileRows; ++r) hetmoe::quant::quantize_row(type, &w[r * kCols], tile.data() + r * rb, kCols);
  for (int64_t r = 0; r < rows; r += kTileRows) std::copy(tile.begin(), tile.end(), wq.data() + r * rb);
  hetmoe::cpu::ThreadPool pool(threads);
  const hetmoe::cpu::WeightMatrix m{type, kCols, rows, rb, wq.data()};
  for (auto _ : state) {
    hetmoe::cpu::matmul(table, pool, m, x.data(), 1, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(rb * rows));
}

// The bandwidth probe itself (hetmoe bench's roofline) over 512 MB: what the memory gives these threads without a
// kernel's arithmetic, bm_stream's reference.
void bm_stream_loads(benchmark::State& state, int threads) {
  hetmoe::cpu::ThreadPool pool(threads);
  hetmoe::cpu::ReadBandwidthProbe probe(pool, size_t{512} << 20);
  for (auto _ : state) benchmark::DoNotOptimize(probe.measure(1));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(size_t{512} << 20));
}

// MLA's attn_k_b in a decode step through matmul_heads: V2-Lite's shape (16 heads of 512 rows x 128 values, Q5_0,
// 720 kB a layer), one layer of 64 after another (46 MB, beyond the caches), two threads. Rows of 128 values are
// short: what a row costs besides its bytes shows here. GB/s of weights.
void bm_heads(benchmark::State& state, Isa isa) {
  if (isa > hetmoe::cpu::detect_isa()) {
    state.SkipWithError("tier not supported by this CPU");
    return;
  }
  const hetmoe::cpu::KernelTable table = hetmoe::cpu::make_kernel_table(isa);
  constexpr int64_t kHeads = 16, kRows = 512, kCols = 128, kLayers = 64;
  const size_t rb = hetmoe::quant::row_bytes(GgmlType::Q5_0, kCols);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(kCols), x(kHeads * kCols), y(kHeads * kRows);
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> wq(rb * kHeads * kRows * kLayers);
  for (int64_t r = 0; r < kHeads * kRows * kLayers; ++r) {
    if (r < 4096)
      for (float& v : w) v = dist(rng);
    hetmoe::quant::quantize_row(GgmlType::Q5_0, w.data(), wq.data() + r * rb, kCols);
  }
  hetmoe::cpu::ThreadPool pool(2);
  const hetmoe::cpu::HeadsLayout layout{kHeads, kHeads * kCols, kCols, kHeads * kRows, kRows};
  int64_t layer = 0;
  for (auto _ : state) {
    const hetmoe::cpu::WeightMatrix m{GgmlType::Q5_0, kCols, kHeads * kRows, rb,
                                      wq.data() + static_cast<size_t>(layer) * rb * kHeads * kRows};
    hetmoe::cpu::matmul_heads(table, pool, m, layout, x.data(), 1, y.data());
    benchmark::DoNotOptimize(y.data());
    layer = (layer + 1) % kLayers;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(rb * kHeads * kRows));
}

// One MoE layer's experts for a decode step of n_tokens sequences through run_experts: V2-Lite shapes (gate/up Q4_K
// [1408, 2048], down Q5_0 [2048, 1408]), each token routed to 6 of 64 experts (333 MB, far beyond the caches), drawn
// afresh every call, the weights in 2 MB pages as a model file's are. GB/s of the distinct experts' weights read:
// the byte roofline is the stream/... rate of the same formats; at 8 tokens an expert sees 1-3 of them.
void bm_experts(benchmark::State& state, int threads, int64_t n_tokens, bool shared) {
  const hetmoe::cpu::KernelTable& table = hetmoe::cpu::kernels();
  constexpr int64_t kEmbd = 2048, kFf = 1408, kExperts = 64, kUsed = 6;
  const size_t gate_rb = hetmoe::quant::row_bytes(GgmlType::Q4_K, kEmbd);
  const size_t down_rb = hetmoe::quant::row_bytes(GgmlType::Q5_0, kFf);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  // One expert's matrices quantized once and copied to every expert (the values do not matter for the speed).
  std::vector<float> w(kFf * kEmbd);
  for (float& v : w) v = dist(rng);
  std::vector<uint8_t> gate1(gate_rb * kFf), down1(down_rb * kEmbd);
  for (int64_t r = 0; r < kFf; ++r)
    hetmoe::quant::quantize_row(GgmlType::Q4_K, &w[r * kEmbd], gate1.data() + r * gate_rb, kEmbd);
  for (int64_t r = 0; r < kEmbd; ++r)
    hetmoe::quant::quantize_row(GgmlType::Q5_0, &w[r * kFf], down1.data() + r * down_rb, kFf);
  const size_t expert_bytes = 2 * gate1.size() + down1.size();
  const hetmoe::cpu::HugePageBuffer buffer(expert_bytes * kExperts);
  uint8_t* base = buffer.data();
  for (int64_t e = 0; e < kExperts; ++e) {
    uint8_t* p = base + e * expert_bytes;
    std::copy(gate1.begin(), gate1.end(), p);
    std::copy(gate1.begin(), gate1.end(), p + gate1.size());
    std::copy(down1.begin(), down1.end(), p + 2 * gate1.size());
  }
  // The shared expert (V2-Lite: two experts' width, Q4_K down), every token's last item.
  constexpr int64_t kSharedFf = 2 * kFf;
  const size_t shared_down_rb = hetmoe::quant::row_bytes(GgmlType::Q4_K, kSharedFf);
  std::vector<float> ws(kSharedFf * kEmbd);
  for (float& v : ws) v = dist(rng);
  std::vector<uint8_t> shared_gate(gate_rb * kSharedFf), shared_up(shared_gate.size()),
      shared_down(shared_down_rb * kEmbd);
  for (int64_t r = 0; r < kSharedFf; ++r) {
    hetmoe::quant::quantize_row(GgmlType::Q4_K, &ws[r * kEmbd], shared_gate.data() + r * gate_rb, kEmbd);
    hetmoe::quant::quantize_row(GgmlType::Q4_K, &ws[r * kEmbd], shared_up.data() + r * gate_rb, kEmbd);
  }
  for (int64_t r = 0; r < kEmbd; ++r)
    hetmoe::quant::quantize_row(GgmlType::Q4_K, &ws[r * kSharedFf], shared_down.data() + r * shared_down_rb, kSharedFf);
  std::vector<float> x(kEmbd * n_tokens), y(kEmbd * n_tokens);
  for (float& v : x) v = dist(rng) * 20;
  hetmoe::cpu::ThreadPool pool(threads);
  hetmoe::cpu::ExpertBatch batch;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> items(kExperts);  // (token, rank) per expert
  int64_t distinct = 0;
  for (auto _ : state) {
    for (auto& v : items) v.clear();
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::vector<int> chosen;
      while (static_cast<int64_t>(chosen.size()) < kUsed) {
        const int e = static_cast<int>(rng() % kExperts);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int k = 0; k < kUsed; ++k) items[chosen[k]].emplace_back(static_cast<int32_t>(t), k);
    }
    batch.clear(n_tokens, kUsed + (shared ? 1 : 0));
    for (int64_t e = 0; e < kExperts; ++e) {
      if (items[e].empty()) continue;
      const uint8_t* p = base + e * expert_bytes;
      batch.add_expert({.gate = {GgmlType::Q4_K, kEmbd, kFf, gate_rb, p},
                        .up = {GgmlType::Q4_K, kEmbd, kFf, gate_rb, p + gate1.size()},
                        .down = {GgmlType::Q5_0, kFf, kEmbd, down_rb, p + 2 * gate1.size()}});
      for (const auto& [t, k] : items[e]) batch.add_item(t, k, 0.1f);
      ++distinct;
    }
    if (shared) {
      batch.add_expert({.gate = {GgmlType::Q4_K, kEmbd, kSharedFf, gate_rb, shared_gate.data()},
                        .up = {GgmlType::Q4_K, kEmbd, kSharedFf, gate_rb, shared_up.data()},
                        .down = {GgmlType::Q4_K, kSharedFf, kEmbd, shared_down_rb, shared_down.data()}});
      for (int64_t t = 0; t < n_tokens; ++t) batch.add_item(static_cast<int32_t>(t), kUsed, 1.0f);
    }
    hetmoe::cpu::run_experts(table, pool, batch, x.data(), kEmbd, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  const int64_t shared_bytes =
      shared ? static_cast<int64_t>(shared_gate.size() + shared_up.size() + shared_down.size()) * state.iterations()
             : 0;
  state.SetBytesProcessed(distinct * static_cast<int64_t>(expert_bytes) + shared_bytes);
  state.counters["experts"] =
      benchmark::Counter(static_cast<double>(distinct) / static_cast<double>(state.iterations()));
}

// A tier's activation conversion (what every quantized matmul does to its input rows first): 2048 floats to the
// activation format; bytes are the floats read.
void bm_convert(benchmark::State& state, Isa isa, GgmlType act, GgmlType weight) {
  const std::optional<hetmoe::cpu::KernelTable> table = table_for(state, isa);
  if (!table) return;
  constexpr int64_t kCols = 2048;
  std::vector<float> x(kCols);
  std::mt19937 rng(3);
  std::generate(x.begin(), x.end(),
                [&, dist = std::normal_distribution<float>(0.0f, 1.0f)]() mutable { return dist(rng); });
  std::vector<uint8_t> out(hetmoe::quant::activation_row_bytes(weight, kCols));
  const auto convert = table->activation_for(act);
  for (auto _ : state) {
    convert(x.data(), out.data(), kCols);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * kCols * static_cast<int64_t>(sizeof(float)));
}

// One MLA decode step's attention on one thread through the tier's head-group kernels: 16 heads' queries against
// n_keys cached latent rows of 576 floats (the keys; their first 512 floats are the values), scores, softmax,
// weighted sums. Bytes are the cached rows' (read once per step at best); 4096 rows are 9.4 MB, past L2.
void bm_attention(benchmark::State& state, Isa isa, int64_t n_keys) {
  const std::optional<hetmoe::cpu::KernelTable> table = table_for(state, isa);
  if (!table) return;
  constexpr int kHeads = 16;
  constexpr int64_t kWidth = 576, kValue = 512;
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(kHeads * kWidth), cache(n_keys * kWidth), scores(kHeads * n_keys), out(kHeads * kValue);
  for (float& v : q) v = dist(rng);
  for (float& v : cache) v = dist(rng);
  for (auto _ : state) {
    table->dot_heads(kWidth, kHeads, q.data(), kWidth, n_keys, cache.data(), kWidth, scores.data(), n_keys);
    for (int h = 0; h < kHeads; ++h) table->attention_softmax(scores.data() + h * n_keys, n_keys, -INFINITY);
    table->sum_heads(kValue, kHeads, n_keys, scores.data(), n_keys, cache.data(), kWidth, out.data(), kValue);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * n_keys * kWidth * static_cast<int64_t>(sizeof(float)));
}

void register_all() {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    for (int64_t keys : {512, 4096})
      benchmark::RegisterBenchmark(
          ("attention/" + std::string(hetmoe::cpu::isa_name(isa)) + "/keys" + std::to_string(keys)).c_str(),
          [isa, keys](benchmark::State& s) { bm_attention(s, isa, keys); });
  for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512})
    for (const auto& [act, weight] : {std::pair{GgmlType::Q8_0, GgmlType::Q8_0}, {GgmlType::Q8_K, GgmlType::Q4_K}})
      benchmark::RegisterBenchmark(
          (std::string("convert/") + std::string(hetmoe::cpu::isa_name(isa)) + "/" +
           std::string(hetmoe::quant::type_info(act).name))
              .c_str(),
          [isa, act = act, weight = weight](benchmark::State& s) { bm_convert(s, isa, act, weight); });
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    benchmark::RegisterBenchmark(("heads/" + std::string(hetmoe::cpu::isa_name(isa)) + "/kb").c_str(),
                                 [isa](benchmark::State& s) { bm_heads(s, isa); })
        ->UseRealTime();
  for (int threads : {1, 2})
    for (int64_t tokens : {1, 8, 128})
      for (bool shared : {false, true})
        benchmark::RegisterBenchmark(
            ("experts/t" + std::to_string(threads) + "/tokens" + std::to_string(tokens) + (shared ? "/shared" : ""))
                .c_str(),
            [threads, tokens, shared](benchmark::State& s) { bm_experts(s, threads, tokens, shared); })
            ->UseRealTime();
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::IQ2_XXS})
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark((std::string("stream/") + std::string(hetmoe::cpu::isa_name(isa)) + "/" +
                                      std::string(hetmoe::quant::type_info(t).name) + "/t" + std::to_string(threads))
                                         .c_str(),
                                     [isa, t, threads](benchmark::State& s) { bm_stream(s, isa, t, threads); })
            ->UseRealTime();
  for (int threads : {1, 2})
    benchmark::RegisterBenchmark(("stream/loads/t" + std::to_string(threads)).c_str(), [threads](benchmark::State& s) {
      bm_stream_loads(s, threads);
    })->UseRealTime();
  for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512})
    for (GgmlType t :
         {GgmlType::BF16,  GgmlType::Q4_1,    GgmlType::Q5_1,  GgmlType::Q4_0,   GgmlType::IQ4_NL,  GgmlType::MXFP4,
          GgmlType::TQ1_0, GgmlType::TQ2_0,   GgmlType::IQ1_S, GgmlType::IQ1_M,  GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
          GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ4_XS, GgmlType::Q2_K,    GgmlType::Q3_K,
          GgmlType::Q4_K,  GgmlType::Q5_K,    GgmlType::Q6_K,  GgmlType::Q5_0,   GgmlType::Q8_0,    GgmlType::F16})
      benchmark::RegisterBenchmark((std::string("dot/") + std::string(hetmoe::cpu::isa_name(isa)) + "/" +
                                    std::string(hetmoe::quant::type_info(t).name))
                                       .c_str(),
                                   [isa, t](benchmark::State& s) { bm_dot(s, isa, t, 1); });
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::IQ2_XXS,
                       GgmlType::Q2_K, GgmlType::Q3_K})
      benchmark::RegisterBenchmark((std::string("rows16/") + std::string(hetmoe::cpu::isa_name(isa)) + "/" +
                                    std::string(hetmoe::quant::type_info(t).name))
                                       .c_str(),
                                   [isa, t](benchmark::State& s) { bm_dot(s, isa, t, 16); });
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6_K})
      benchmark::RegisterBenchmark(
          ("many/" + std::string(hetmoe::cpu::isa_name(isa)) + "/" + std::string(hetmoe::quant::type_info(t).name))
              .c_str(),
          [isa, t](benchmark::State& s) { bm_dot(s, isa, t, 0); });
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0})
    benchmark::RegisterBenchmark(("rows4/avx512/" + std::string(hetmoe::quant::type_info(t).name)).c_str(),
                                 [t](benchmark::State& s) { bm_dot(s, Isa::kAvx512, t, 4); });
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6_K})
      for (int64_t n_act : {4, 8, 16, 64})
        benchmark::RegisterBenchmark(("tile" + std::to_string(n_act) + "/" + std::string(hetmoe::cpu::isa_name(isa)) +
                                      "/" + std::string(hetmoe::quant::type_info(t).name))
                                         .c_str(),
                                     [isa, t, n_act](benchmark::State& s) { bm_dot(s, isa, t, n_act, true); });
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q8_0})
      for (int64_t n_act : {8, 16})
        benchmark::RegisterBenchmark(
            ("tile" + std::to_string(n_act) + "dram/" + std::string(hetmoe::cpu::isa_name(isa)) + "/" +
             std::string(hetmoe::quant::type_info(t).name))
                .c_str(),
            [isa, t, n_act](benchmark::State& s) { bm_dot(s, isa, t, n_act, true, 65536); });
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
