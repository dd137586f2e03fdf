// The engine: one builder opens a model with its device and policy; what it refuses, and that a session on what it
// opens gives the CPU's logits wherever the pass runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/error.h"
#include "tests/support/compare.h"

namespace hetmoe::engine {
namespace {

namespace fs = std::filesystem;

std::string model_path(const std::string& name) { return (fs::path(HETMOE_TEST_DATA_DIR) / "models" / name).string(); }

std::vector<float> last_logits(Engine& e, const std::vector<int32_t>& tokens) {
  auto s = e.session(32);
  const std::span<const float> l = s->eval(tokens);
  return {l.begin(), l.end()};
}

// The message of the Error that opening with `options` throws ("" when it opens).
std::string refusal(const EngineOptions& options) {
  try {
    Engine::open(options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Engine, OpensOnTheCpuByDefaultWhereThereIsNoGpu) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA GPU is present: auto takes it";
  auto e = Engine::open({.model = model_path("tiny-qwen3moe-Q4_K_M.gguf"), .threads = 2});
  EXPECT_EQ(e->device(), nullptr);
  EXPECT_EQ(e->policy(), "cpu");
  EXPECT_TRUE(e->notes().empty());
  EXPECT_EQ(e->session()->n_ctx(), std::min<int64_t>(4096, e->model().config().n_ctx_train));
}

TEST(Engine, PutsTheModelOnTheEmulatedDeviceByItsPolicyAndGivesTheCpusLogits) {
  const std::string path = model_path("tiny-deepseek3-Q4_K_M.gguf");
  const std::vector<int32_t> tokens = {3, 17, 42, 100, 7};
  auto cpu = Engine::open({.model = path, .threads = 2, .device = {.kind = "cpu"}});
  for (const std::string policy : {"", "static", "kt", "crossover"}) {
    auto e =
        Engine::open({.model = path, .threads = 2, .device = {.kind = "emulated", .memory_gb = 0.1, .policy = policy}});
    ASSERT_NE(e->device(), nullptr);
    EXPECT_TRUE(e->device()->emulated());
    EXPECT_EQ(e->policy(), policy.empty() ? "crossover" : policy);
    EXPECT_EQ(e->model().device_experts()->policy(), e->policy());
    ASSERT_FALSE(e->notes().empty());
    EXPECT_NE(e->notes().front().find("emulated"), std::string::npos) << e->notes().front();
    EXPECT_TRUE(e->model().pass_on_device()) << policy;
    EXPECT_LT(test_support::relative_rms(last_logits(*e, tokens), last_logits(*cpu, tokens)), 1e-4) << policy;
  }
}

TEST(Engine, RefusesWhatCannotRunWithOneLine) {
  const std::string path = model_path("tiny-deepseek3-Q4_K_M.gguf");
  // A device policy with --device cpu is an error that says so, not a silent run on the CPU.
  EXPECT_NE(refusal({.model = path, .device = {.kind = "cpu", .policy = "crossover"}}).find("--device cpu"),
            std::string::npos);
  EXPECT_NE(refusal({.model = path, .device = {.kind = "emulated", .policy = "cpu"}}).find("--device emulated"),
            std::string::npos);
  if (!cuda_available()) {
    EXPECT_NE(refusal({.model = path, .device = {.kind = "auto", .policy = "kt"}}).find("no CUDA GPU"),
              std::string::npos);
  }
  EXPECT_NE(refusal({.model = path, .device = {.kind = "emulated", .policy = "fastest"}}).find("unknown policy"),
            std::string::npos);
  EXPECT_NE(refusal({.model = path, .device = {.kind = "emulated", .policy = "split"}}).find("split model"),
            std::string::npos);
  EXPECT_NE(refusal({.model = path, .device = {.kind = "gpu"}}).find("--device gpu"), std::string::npos);
  EXPECT_NE(refusal({.model = path, .device = {.kind = "emulated", .move_slots = -1}}).find("negative"),
            std::string::npos);
  EXPECT_NE(refusal({.model = path, .critical = "2"}).find("not a split model"), std::string::npos);
  EXPECT_NE(refusal({.model = "/nonexistent/model.gguf"}).find("/nonexistent/model.gguf"), std::string::npos);
  if (!cuda_available()) {
    EXPECT_FALSE(refusal({.model = path, .device = {.kind = "cuda"}}).empty());
  }
}

}  // namespace
}  // namespace hetmoe::engine
