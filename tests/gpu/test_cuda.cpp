// The CUDA device against the CPU: the Device interface (copies, events, host callbacks, failures), the low-bit
// matmul and SiLU kernels against the scalar reference on awkward sizes, and a split model with its experts on the
// GPU against the same model on the CPU. Needs a GPU; without one every test says so and skips.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "quant/lowbit.h"
#include "quant/ref.h"
#include "runtime/device/device.h"
#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/model/make_model.h"
#include "runtime/model/model.h"
#include "runtime/model/split_writer.h"
#include "tests/support/compare.h"
#include "tests/support/device_checks.h"
#include "tests/support/temp_dir.h"

namespace hetmoe::device {
namespace {

namespace fs = std::filesystem;

// Without a GPU every test skips; with HETMOE_REQUIRE_GPU=1 (scripts/gpu_check.sh) a missing GPU or a device
// library that does not load fails instead, so a GPU machine never reports skips as a pass.
std::unique_ptr<Device> gpu_or_skip() {
  if (cuda_device_count() == 0) return nullptr;
  return make_cuda_device(0);
}

bool gpu_required() {
  const char* env = std::getenv("HETMOE_REQUIRE_GPU");
  return env && std::string(env) == "1";
}

#define REQUIRE_GPU(d)                                                                      \
  auto d = gpu_or_skip();                                                                   \
  if (!d && gpu_required()) FAIL() << "HETMOE_REQUIRE_GPU=1 and no CUDA GPU could be used"; \
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

// Every weight matrix of the reference models that the device runs, at the files' own shapes (MLA's 64-value k_b
// rows, the 288-row kv_a, 512-value down rows), for the row counts of a decode step, a short prefill and the batched
// cuBLAS path. One expert or head of a 3-D tensor stands for the others.
TEST(Cuda, MatmulAtTheReferenceModelsShapes) {
  REQUIRE_GPU(d);
  const int s = d->create_stream();
  std::set<std::tuple<quant::GgmlType, int64_t, int64_t>> shapes;
  for (const auto& entry : fs::directory_iterator(fs::path(HETMOE_TEST_DATA_DIR) / "models")) {
    if (entry.path().extension() != ".gguf") continue;
    const gguf::GgufFile file = gguf::GgufFile::open(entry.path().string());
    for (const gguf::TensorInfo& t : file.tensors())
      if (t.n_dims >= 2 && t.name != "token_embd.weight" && d->supports(t.type) && t.type != quant::GgmlType::F32)
        shapes.emplace(t.type, t.ne[0], t.ne[1]);
  }
  ASSERT_GT(shapes.size(), 10u);
  uint64_t seed = 100;
  for (const auto& [type, cols, rows] : shapes)
    for (int64_t n : {1, 5, 12, 16, 33}) test_support::check_matmul_and_silu(*d, s, type, cols, rows, n, 5e-5, seed++);
}

// matmul_heads (one launch for all heads) gives what one matmul per head gives, bit for bit, and both the dequantized
// rows' products (5e-5 of the sum of |w x|): MLA's k_b and v_b formats and a low-bit one, heads packed side by side
// (the 16-byte activation loads) and at odd strides, the kernels' token counts and the cuBLAS path.
TEST(Cuda, MatmulHeadsIsOneMatmulPerHead) {
  REQUIRE_GPU(d);
  const int s = d->create_stream();
  const int64_t heads = 4, rows = 17;
  for (const auto& [type, cols] : {std::pair{quant::GgmlType::Q5_0, int64_t{64}},
                                   {quant::GgmlType::Q4_K, 256},
                                   {quant::GgmlType::HQ2_G64, 128},
                                   {quant::GgmlType::F32, 40}})
    for (const bool packed : {true, false})
      for (const int64_t n : {1, 5, 20}) {
        const size_t rb = quant::row_bytes(type, cols);
        const std::vector<float> wf = test_support::random_values(heads * rows * cols, 50 + n, 0.1f);
        std::vector<uint8_t> w(rb * heads * rows);
        for (int64_t r = 0; r < heads * rows; ++r) quant::quantize_row(type, &wf[r * cols], w.data() + r * rb, cols);
        const int64_t x_head = packed ? cols : cols + 1;
        const cpu::HeadsLayout layout{.n_heads = heads,
                                      .x_token_stride = heads * x_head + (packed ? 0 : 3),
                                      .x_head_stride = x_head,
                                      .y_token_stride = heads * rows + (packed ? 0 : 2),
                                      .y_head_stride = rows};
        const std::vector<float> x = test_support::random_values(n * layout.x_token_stride, 60 + n);
        test_support::OpHarness h(*d, s);
        const DeviceMatrix m{type, cols, heads * rows, rb, h.up(w)};
        const float* dx = h.up(x);
        float* one = h.zeros(n * layout.y_token_stride);
        float* each = h.zeros(n * layout.y_token_stride);
        d->matmul_heads(s, m, layout, dx, n, one);
        for (int64_t hd = 0; hd < heads; ++hd)
          d->matmul(s, m.rows(hd * rows, rows), dx + hd * layout.x_head_stride, layout.x_token_stride, n,
                    each + hd * layout.y_head_stride, layout.y_token_stride);
        const std::vector<float> got = h.down(one, n * layout.y_token_stride);
        EXPECT_EQ(got, h.down(each, n * layout.y_token_stride))
            << quant::type_info(type).name << " n " << n << " packed " << packed;
        std::vector<float> row(cols);
        for (int64_t hd = 0; hd < heads; ++hd)
          for (int64_t r = 0; r < rows; ++r) {
            quant::dequantize_row(type, w.data() + (hd * rows + r) * rb, row.data(), cols);
            for (int64_t t = 0; t < n; ++t) {
              const test_support::ExactDot want =
                  test_support::exact_dot(row.data(), &x[t * layout.x_token_stride + hd * layout.x_head_stride], cols);
              ASSERT_NEAR(got[t * layout.y_token_stride + hd * layout.y_head_stride + r], want.value,
                          5e-5 * want.scale + 1e-6)
                  << quant::type_info(type).name << " n " << n << " packed " << packed << " head " << hd;
            }
          }
      }
}

// Each layer's output (l_out) of `got` against `want` over the same tokens, as "layer: relative RMS" lines: where a
// whole-model comparison that failed went wrong.
class LayerOutputs final : public model::Trace {
 public:
  void values(int64_t layer, std::string_view name, const float* data, int64_t rows, int64_t cols) override {
    if (name == "l_out") l_out[layer].assign(data, data + rows * cols);
  }
  void ids(int64_t, std::string_view, const int32_t*, int64_t, int64_t) override {}
  std::map<int64_t, std::vector<float>> l_out;
};

std::string layer_errors(model::Model& want, model::Model& got, std::span<const int32_t> tokens) {
  LayerOutputs a, b;
  std::vector<float> logits;
  model::KvCache ca = want.make_cache(static_cast<int64_t>(tokens.size()));
  model::KvCache cb = got.make_cache(static_cast<int64_t>(tokens.size()));
  want.forward(tokens, 0, ca, false, logits, &a);
  got.forward(tokens, 0, cb, false, logits, &b);
  std::ostringstream out;
  for (const auto& [layer, values] : a.l_out)
    out << "\n  layer " << layer << " output: relative RMS " << test_support::relative_rms(b.l_out[layer], values);
  return out.str();
}

// The op harness: every layer op against the CPU reference (the GPU sums in float where the CPU uses double).
TEST(Cuda, LayerOpsMatchTheCpuReference) {
  REQUIRE_GPU(d);
  test_support::check_layer_ops(*d, d->create_stream(), 1e-4);
}

// A split model with its dense FFN, shared experts and every expert's W^Q on the GPU gives the CPU's logits. Its
// source is F32 (tiny-deepseek-v3's shapes, made here): the W^Q types and F32 meet F32 activations on both sides, and
// the residuals of critical experts run on the CPU either way, so only the order of float sums differs.
TEST(Cuda, SplitModelOnTheGpuMatchesTheCpu) {
  REQUIRE_GPU(d);
  const fs::path dir = test_support::temp_dir("hetmoe_cuda_");
  const fs::path src = dir / "tiny-deepseek-v3-F32.gguf", out = dir / "split.gguf";
  make_model({.preset = "tiny-deepseek-v3", .out_path = src.string(), .type = "F32", .seed = 5}, nullptr);
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
      ASSERT_EQ(gpu->pass_on_device(), whole_pass);              // F32 attention and router weights
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
      EXPECT_LE(diff, 1e-3f * scale) << "critical " << critical << " whole pass " << whole_pass
                                     << (diff > 1e-3f * scale ? layer_errors(*cpu, *gpu, tokens) : "");
    }
}

// The whole forward pass of `file` on the GPU (prefill in chunks, then decode through the device's KV cache) against
// the CPU: the relative RMS of all logits, or -1 when a weight type keeps the pass off the device. `report` receives
// each layer's error when the bound is crossed.
double whole_pass_error(Device& d, const std::string& file, double bound, std::string& report) {
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7, 255, 256, 300, 11, 64, 128};
  auto cpu = model::Model::load(file, 2);
  auto gpu = model::Model::load(file, 2);
  gpu->attach_device(d, {.budget_bytes = size_t{1} << 30});
  if (!gpu->pass_on_device()) return -1;
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
  const double err = test_support::relative_rms(got, want);
  if (err >= bound) report = layer_errors(*cpu, *gpu, tokens);
  return err;
}

// Every architecture's toy in F32 (the presets' shapes, made here): with F32 weights neither side converts
// activations, so the GPU's whole pass must give the CPU's logits up to the order of float sums.
TEST(Cuda, WholePassOnTheGpuMatchesTheCpu) {
  REQUIRE_GPU(d);
  const fs::path dir = test_support::temp_dir("hetmoe_cuda_f32_");
  int ran = 0;
  for (const char* preset : {"tiny-deepseek-v3", "tiny-deepseek-v3.2", "tiny-glm4moe", "tiny-gpt-oss",
                             "tiny-minimax-m2", "tiny-qwen3.5-moe", "tiny-deepseek-v4"}) {
    const std::string file = (dir / (std::string(preset) + ".gguf")).string();
    make_model({.preset = preset, .out_path = file, .type = "F32", .seed = 5}, nullptr);
    std::string report;
    const double err = whole_pass_error(*d, file, 1e-3, report);
    if (err < 0) continue;
    ++ran;
    EXPECT_LT(err, 1e-3) << preset << report;
  }
  EXPECT_GE(ran, 5);
}

// The reference files in their GGUF block formats. The CPU converts activations to 8 bits for these weights (Q8_K,
// Q8_0), as llama.cpp does; the GPU keeps them in F32. On random weights that moves each layer's output by about 1 %
// per matrix product, and the differences add up through the layers (on an H200: 3.4 % and 7.7 % relative RMS of the
// logits of the DeepSeek-V2-Lite and -V3 toys, whose F32 versions above agree to float rounding). Bounded at 15 %:
// unrelated logits are about 140 % apart.
TEST(Cuda, QuantizedFilesOnTheGpuStayNearTheCpu) {
  REQUIRE_GPU(d);
  const fs::path data = fs::path(HETMOE_TEST_DATA_DIR) / "models";
  int ran = 0;
  for (const char* name : {"tiny-deepseek2lite-Q4_K_M.gguf", "tiny-deepseek3-Q4_K_M.gguf", "tiny-qwen3moe-Q4_K_M.gguf",
                           "tiny-mixtral-Q4_K_M.gguf", "tiny-gptoss-MXFP4_MOE.gguf", "tiny-deepseek3-IQ2_XXS.gguf"}) {
    std::string report;
    const double err = whole_pass_error(*d, (data / name).string(), 0.15, report);
    if (err < 0) continue;
    ++ran;
    EXPECT_LT(err, 0.15) << name << report;
    std::printf("%s: relative RMS of the logits, GPU against CPU: %.4f\n", name, err);
  }
  EXPECT_GE(ran, 3);
}

}  // namespace
}  // namespace hetmoe::device
