// oneDNN's matmul against the project's own kernels on the shapes of the bench model's routed experts: a weight
// matrix of 1408 x 2048 (an expert's gate) times N tokens, one thread. oneDNN runs u8 x s8 -> f32 (weights as plain
// int8 rows, one scale per row) and f32 x f32; the project runs the GGUF blocks in place (Q4_K, Q8_0 tiles, N >= 4;
// dot products below). Prints GMAC/s: N * 1408 * 2048 multiply-adds per call. Run: build/tests/bench/bench_onednn
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <vector>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/thread_pool.h"
#include "quant/ref.h"

namespace {

using hetmoe::quant::GgmlType;
constexpr int64_t kRows = 1408, kCols = 2048;

void set_macs(benchmark::State& state, int64_t tokens) {
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(tokens * kRows * kCols) * state.iterations(),
                                                benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// oneDNN matmul: src [tokens, cols] x weights [cols, rows] -> dst [tokens, rows] f32.
void bm_onednn(benchmark::State& state, dnnl::memory::data_type src_type, dnnl::memory::data_type wei_type) {
  const int64_t tokens = state.range(0);
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc src_md({tokens, kCols}, src_type, tag::ab);
  const dnnl::memory::desc wei_any({kCols, kRows}, wei_type, tag::any);
  const dnnl::memory::desc dst_md({tokens, kRows}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (wei_type == dt::s8) attr.set_output_scales(2, {DNNL_RUNTIME_F32_VAL});  // one scale per output column
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_any, dst_md), attr, engine);
  dnnl::memory src(pd.src_desc(), engine), wei(pd.weights_desc(), engine), dst(pd.dst_desc(), engine);
  std::mt19937 rng(1);
  auto fill = [&](dnnl::memory& m, dt type) {
    const size_t bytes = m.get_desc().get_size();
    auto* p = static_cast<uint8_t*>(m.get_data_handle());
    if (type == dt::f32) {
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (size_t i = 0; i < bytes / 4; ++i) reinterpret_cast<float*>(p)[i] = d(rng);
    } else {
      for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(rng() & (type == dt::u8 ? 0xFF : 0x3F));
    }
  };
  fill(src, src_type);
  fill(wei, wei_type);  // already in oneDNN's preferred layout: the relayout a real use would pay once is not timed
  std::vector<float> scales(kRows, 0.01f);
  dnnl::memory scale_mem({{kRows}, dt::f32, tag::x}, engine, scales.data());
  const dnnl::matmul mm(pd);
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  if (wei_type == dt::s8) args[DNNL_ARG_ATTR_OUTPUT_SCALES] = scale_mem;
  for (auto _ : state) {
    mm.execute(stream, args);
    stream.wait();
  }
  set_macs(state, tokens);
}

// The project's matmul on GGUF blocks (activation conversion included, as in the model), one thread.
void bm_own(benchmark::State& state, GgmlType type) {
  const int64_t tokens = state.range(0);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(kRows * kCols), x(tokens * kCols), y(tokens * kRows);
  for (float& v : w) v = d(rng);
  for (float& v : x) v = d(rng) * 20;
  const size_t rb = hetmoe::quant::row_bytes(type, kCols);
  std::vector<uint8_t> wq(rb * kRows);
  for (int64_t r = 0; r < kRows; ++r) hetmoe::quant::quantize_row(type, &w[r * kCols], wq.data() + r * rb, kCols);
  const hetmoe::cpu::WeightMatrix m{type, kCols, kRows, rb, wq.data()};
  hetmoe::cpu::ThreadPool pool(1);
  for (auto _ : state) {
    hetmoe::cpu::matmul(hetmoe::cpu::kernels(), pool, m, x.data(), tokens, y.data(), kRows);
    benchmark::DoNotOptimize(y.data());
  }
  set_macs(state, tokens);
}

void register_all() {
  using dt = dnnl::memory::data_type;
  auto args = [](benchmark::internal::Benchmark* b) {
    for (int64_t n : {1, 4, 16, 64, 256}) b->Arg(n);
  };
  benchmark::RegisterBenchmark("onednn/u8s8", [](benchmark::State& s) { bm_onednn(s, dt::u8, dt::s8); })->Apply(args);
  benchmark::RegisterBenchmark("onednn/f32", [](benchmark::State& s) { bm_onednn(s, dt::f32, dt::f32); })->Apply(args);
  benchmark::RegisterBenchmark("own/Q8_0", [](benchmark::State& s) { bm_own(s, GgmlType::Q8_0); })->Apply(args);
  benchmark::RegisterBenchmark("own/Q4_K", [](benchmark::State& s) { bm_own(s, GgmlType::Q4_K); })->Apply(args);
  benchmark::RegisterBenchmark("own/F32", [](benchmark::State& s) { bm_own(s, GgmlType::F32); })->Apply(args);
}

}  // namespace

int main(int argc, char** argv) {
  // One thread for oneDNN too (its OpenMP/TBB pool would otherwise take every core).
  setenv("OMP_NUM_THREADS", "1", 0);
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
