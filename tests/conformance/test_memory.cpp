// Loading a model must not copy its weights: they are used where the file mapping holds them. Anonymous memory
// (heap, stacks; not the file's page cache) may grow by at most 5 % of the file size plus the KV cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/model/model.h"
#include "tests/support/reference.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;

// RssAnon of this process in bytes, from /proc/self/status.
int64_t rss_anon() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8)) * 1024;
  return -1;
}

class Memory : public testing::TestWithParam<std::string> {};

TEST_P(Memory, LoadDoesNotCopyWeights) {
#if defined(HETMOE_SANITIZED)
  GTEST_SKIP() << "skipped under a sanitizer: its shadow memory (and ASan's quarantine) make RssAnon meaningless";
#endif
  fs::path path;
  for (const fs::path& root : {fs::path(HETMOE_TEST_DATA_DIR), fs::path(HETMOE_SHARED_REF)})
    if (fs::exists(root / "models" / GetParam())) {
      path = root / "models" / GetParam();
      break;
    }
  if (path.empty()) HETMOE_MISSING_REFERENCE(GetParam() << " is neither in tests/data nor in " << HETMOE_SHARED_REF);
  const int64_t before = rss_anon();
  ASSERT_GT(before, 0) << "no RssAnon in /proc/self/status";
  auto model = model::Model::load(path.string(), 1);
  model::KvCache cache = model->make_cache(64);
  const int64_t grown = rss_anon() - before;
  const double file_size = static_cast<double>(fs::file_size(path));
  const double budget = 0.05 * file_size + static_cast<double>(cache.bytes());
  std::cout << "[ memory   ] " << GetParam() << ": file " << file_size / 1e6 << " MB, anonymous growth " << grown / 1e3
            << " kB, KV cache " << cache.bytes() / 1e3 << " kB, budget " << budget / 1e3 << " kB\n";
  EXPECT_LT(static_cast<double>(grown), budget);
}

INSTANTIATE_TEST_SUITE_P(Models, Memory,
                         testing::Values("tiny-deepseek3-F32.gguf", "tiny-deepseek3-Q4_K_M.gguf",
                                         "tiny-deepseek2lite-Q4_K_M.gguf", "tiny-qwen3moe-Q4_K_M.gguf",
                                         "tiny-mixtral-Q4_K_M.gguf"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(0, info.param.size() - 5);
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace hetmoe
