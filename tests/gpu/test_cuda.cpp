// The CUDA device against the CPU: the Device interface (copies, events, host callbacks, failures), the low-bit
// matmul and SiLU kernels against the scalar reference on awkward sizes, and a split model with its experts on the
// GPU against the same model on the CPU. Needs a GPU; without one every test says so and skips.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include "quant/lowbit.h"
#include "quant/ref.h"
#include "runtime/device/device.h"
#include "runtime/error.h"
#include "runtime/model/model.h"
#include "runtime/model/split_writer.h"
#include "tests/support/compare.h"
#include "tests/support/device_checks.h"
#include "tests/support/temp_dir.h"

namespace hetmoe::device {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Device> gpu_or_skip() {
  if (cuda_device_count() == 0) return nullptr;
  return make_cuda_device(0);
}

#define REQUIRE_GPU(d)    \
  auto d = gpu_or_skip(); \
  if (!d) GTEST_SKIP() << "no CUDA GPU here"

TEST(Cuda, CopiesEventsAndCallbacks) {
  REQUIRE_GPU(d);
  EXPECT_FALSE(d->emulated());
  EXPECT_GT(d->capacity(), 0u);
  const int compute = d->create_stream(), copy = d->create_stream();
  std::vector<float> a(1 << 20), b(1 << 20, 2.0f), out(1 << 20);
  std::iota(a.begin(), a.end(), 0.0f);
  DeviceMemory da(*d, a.size() * 4), db(*d, b.size() * 4);
  d->copy_to_device(compute, db.get(), b.data(), b.size() * 4);
  d->copy_to_device(copy, da.get(), a.data(), a.size() * 4);
  d->wait(compute, d->record(copy));
  d->add(compute, da.as<float>(), static_cast<int64_t>(a.size()), db.as<float>());
  std::vector<int> order;
  d->host_callback(compute, [&] { order.push_back(1); });
  d->copy_to_host(compute, out.data(), db.get(), out.size() * 4);
  d->host_callback(compute, [&] { order.push_back(2); });
  d->synchronize(d->record(compute));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], a[i] + 2.0f) << i;
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  const TransferStats t = d->transfers();
  EXPECT_EQ(t.to_device_bytes, 2 * a.size() * 4);
  EXPECT_EQ(t.to_host_bytes, a.size() * 4);
  d->host_callback(compute, [] { throw Error("boom"); });
  EXPECT_THROW(d->synchronize(), Error);
}

TEST(Cuda, LowBitMatmulAndSiluMatchTheReference) {
  REQUIRE_GPU(d);
  const int s = d->create_stream();
  uint64_t seed = 3;
  for (quant::GgmlType type : {quant::GgmlType::HQ2_G64, quant::GgmlType::HQ2_G128, quant::GgmlType::HQ3_G64,
                               quant::GgmlType::HQ3_G128, quant::GgmlType::HQ4_G64, quant::GgmlType::HQ4_G128}) {
    ASSERT_TRUE(d->supports(type));
    for (int64_t cols : {128, 1408, 7168})
      for (int64_t rows : {1, 17, 97})
        for (int64_t n : {1, 3, 9, 17, 40})  // 40 rows: the dequantize-and-cuBLAS path
          test_support::check_matmul_and_silu(*d, s, type, cols, rows, n, 5e-5, seed++);
  }
  // The GGUF block formats of dense and shared weights, against F32 activations.
  // The IQ2_XXS, IQ3_XXS, IQ4_XS and MXFP4 experts of the popular mixes among them.
  for (quant::GgmlType type : {quant::GgmlType::F32, quant::GgmlType::F16, quant::GgmlType::Q8_0, quant::GgmlType::Q5_0,
                               quant::GgmlType::Q4_K, quant::GgmlType::Q6_K, quant::GgmlType::IQ2_XXS,
                               quant::GgmlType::IQ3_XXS, quant::GgmlType::IQ4_XS, quant::GgmlType::MXFP4}) {
    ASSERT_TRUE(d->supports(type));
    for (int64_t cols : {256, 2048})
      for (int64_t rows : {1, 17, 97})
        for (int64_t n : {1, 9, 40}) test_support::check_matmul_and_silu(*d, s, type, cols, rows, n, 5e-5, seed++);
  }
  EXPECT_FALSE(d->supports(quant::GgmlType::Q2_K));
}

// The op harness: every layer op against the CPU reference (the GPU sums in float where the CPU uses double).
TEST(Cuda, LayerOpsMatchTheCpuReference) {
  REQUIRE_GPU(d);
  test_support::check_layer_ops(*d, d->create_stream(), 1e-4);
}

// A split model with its dense FFN, shared experts and every expert's W^Q on the GPU gives the CPU's logits to
// float rounding and the activations' 8-bit conversion (the CPU converts them for Q4_K/Q6_K/Q8_0, the GPU does
// not): within 2e-2 of the largest logit.
TEST(Cuda, SplitModelOnTheGpuMatchesTheCpu) {
  REQUIRE_GPU(d);
  const fs::path src = fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf";
  const fs::path out = test_support::temp_dir("hetmoe_cuda_") / "split.gguf";
  split_model({.model = src.string(), .out = out.string(), .threads = 2}, nullptr);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) tokens.push_back((i * 53 + 7) % 500);
  for (int64_t critical : {0, 2, -1})
    for (const bool whole_pass : {false, true}) {
      auto cpu = model::Model::load(out.string(), 2);
      auto gpu = model::Model::load(out.string(), 2);
      cpu->set_critical(critical);
      gpu->set_critical(critical);
      gpu->attach_device(*d, {.budget_bytes = size_t{1} << 30}, whole_pass);
      ASSERT_EQ(gpu->pass_on_device(), whole_pass);              // Q4_K, Q5_0 and F32 attention and router weights
      ASSERT_EQ(gpu->device_experts()->resident_experts(), 36);  // output, dense FFN, 2 x shared, 2 x 16 routed
      model::KvCache c1 = cpu->make_cache(16), c2 = gpu->make_cache(16);
      ASSERT_EQ(c2.device() != nullptr, whole_pass);
      std::vector<float> want, got;
      cpu->forward(tokens, 0, c1, true, want);
      gpu->forward(tokens, 0, c2, true, got);
      float scale = 0, diff = 0;
      for (size_t j = 0; j < want.size(); ++j) {
        scale = std::max(scale, std::abs(want[j]));
        diff = std::max(diff, std::abs(want[j] - got[j]));
      }
      EXPECT_LE(diff, 2e-2f * scale) << "critical " << critical << " whole pass " << whole_pass;
    }
}

// The whole forward pass on the GPU for every reference model whose weights the GPU runs (prefill in chunks, then
// decode through the device's KV cache) against the CPU.
TEST(Cuda, WholePassOnTheGpuMatchesTheCpu) {
  REQUIRE_GPU(d);
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7, 255, 256, 300, 11, 64, 128};
  const fs::path data = fs::path(HETMOE_TEST_DATA_DIR) / "models";
  int ran = 0;
  for (const char* name : {"tiny-deepseek2lite-Q4_K_M.gguf", "tiny-deepseek3-Q4_K_M.gguf", "tiny-qwen3moe-Q4_K_M.gguf",
                           "tiny-mixtral-Q4_K_M.gguf"}) {
    const std::string file = (data / name).string();
    auto cpu = model::Model::load(file, 2);
    auto gpu = model::Model::load(file, 2);
    gpu->attach_device(*d, {.budget_bytes = size_t{1} << 30});
    if (!gpu->pass_on_device()) continue;  // a weight type the GPU kernels do not run
    ++ran;
    std::vector<float> want, got, part;
    for (auto [m, out] : {std::pair{cpu.get(), &want}, std::pair{gpu.get(), &got}}) {
      model::KvCache cache = m->make_cache(32);
      int64_t pos = 0;
      for (int len : {6, 3, 1, 1}) {
        m->forward(std::span(tokens).subspan(pos, len), pos, cache, true, part);
        out->insert(out->end(), part.begin(), part.end());
        pos += len;
      }
    }
    EXPECT_LT(test_support::relative_rms(got, want), 2e-2)
        << name;  // the GPU takes activations in F32, the CPU in Q8_K / Q8_0
  }
  EXPECT_GE(ran, 2);
}

}  // namespace
}  // namespace hetmoe::device
