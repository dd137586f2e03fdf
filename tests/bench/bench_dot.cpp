// Dot-product throughput per ISA tier and weight format, on weights that stay in L2 (the compute ceiling, not
// the DRAM one). Prints GB/s of weight bytes consumed per thread. Run: build/tests/bench/bench_dot
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "cpu_kernels/isa.h"
#include "cpu_kernels/kernel_table.h"
#include "quant/ref.h"

namespace {

using hetmoe::cpu::Isa;
using hetmoe::quant::GgmlType;

void bm_dot(benchmark::State& state, Isa isa, GgmlType type) {
  if (isa > hetmoe::cpu::detect_isa()) {
    state.SkipWithError("tier not supported by this CPU");
    return;
  }
  const hetmoe::cpu::KernelTable table = hetmoe::cpu::make_kernel_table(isa);
  constexpr int64_t kCols = 2048, kRows = 64;  // 64 rows of 2048: about 150 kB at 4.5 bits, L2-resident
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(kCols * kRows), x(kCols);
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  const size_t rb = hetmoe::quant::row_bytes(type, kCols);
  std::vector<uint8_t> wq(rb * kRows), act(hetmoe::quant::activation_row_bytes(type, kCols));
  for (int64_t r = 0; r < kRows; ++r) hetmoe::quant::quantize_row(type, &w[r * kCols], wq.data() + r * rb, kCols);
  hetmoe::quant::quantize_activation(hetmoe::quant::type_info(type).vec_dot_type, x.data(), act.data(), kCols);
  const hetmoe::cpu::VecDotFn dot = table.dot_for(type);
  for (auto _ : state) {
    float sum = 0;
    for (int64_t r = 0; r < kRows; ++r) sum += dot(kCols, wq.data() + r * rb, act.data());
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(rb * kRows));
}

void register_all() {
  for (Isa isa : {Isa::kRef, Isa::kAvx2, Isa::kAvx512})
    for (GgmlType t : {GgmlType::BF16, GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::Q4_0, GgmlType::IQ4_NL,
                       GgmlType::IQ4_XS, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                       GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::F16})
      benchmark::RegisterBenchmark(
          (std::string(hetmoe::cpu::isa_name(isa)) + "/" + std::string(hetmoe::quant::type_info(t).name)).c_str(),
          [isa, t](benchmark::State& s) { bm_dot(s, isa, t); });
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
