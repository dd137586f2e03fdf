#include "runtime/model/archs.h"

namespace hetmoe::model {

// The architectures this build runs, one line each (their files are in archs/).
extern const ArchSpec deepseek2_arch, deepseek32_arch, qwen3moe_arch, llama_arch, glm4moe_arch, minimax_m2_arch,
    gpt_oss_arch, qwen35moe_arch, deepseek4_arch;
namespace {
constexpr const ArchSpec* kArchs[] = {&deepseek2_arch, &deepseek32_arch, &qwen3moe_arch,  &llama_arch,    &glm4moe_arch,
                                      &gpt_oss_arch,   &minimax_m2_arch, &qwen35moe_arch, &deepseek4_arch};
}  // namespace

const ArchSpec* find_arch(std::string_view name) {
  for (const ArchSpec* a : kArchs)
    if (a->name == name) return a;
  return nullptr;
}

std::string arch_names() {
  std::string names;
  for (const ArchSpec* a : kArchs) names += (names.empty() ? "" : ", ") + std::string(a->name);
  return names;
}

}  // namespace hetmoe::model
