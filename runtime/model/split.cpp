#include "runtime/model/split.h"

#include <regex>

#include "runtime/error.h"

namespace hetmoe::model {
namespace {

// "blk.N.ffn_X_exps.weight" without its ".weight".
std::string stem(const std::string& name) {
  constexpr size_t kSuffix = sizeof(".weight") - 1;
  return name.size() > kSuffix ? name.substr(0, name.size() - kSuffix) : name;
}

}  // namespace

bool is_routed_expert_tensor(const std::string& name) {
  static const std::regex pattern(R"(blk\.\d+\.ffn_(gate|up|down)_exps\.weight)");
  return std::regex_match(name, pattern);
}

std::string split_gpu_name(const std::string& name) { return stem(name) + ".wq"; }
std::string split_residual_name(const std::string& name) { return stem(name) + ".wr"; }

CriticalFrom parse_critical_from(const std::string& name, const std::string& what) {
  if (name == "residual") return CriticalFrom::kResidual;
  if (name == "source") return CriticalFrom::kSource;
  fail("{}: critical experts are computed from \"residual\" or \"source\", not \"{}\"", what, name);
}

const char* critical_from_name(CriticalFrom from) { return from == CriticalFrom::kSource ? "source" : "residual"; }

}  // namespace hetmoe::model
