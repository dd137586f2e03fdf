#pragma once

#include <cstdint>
#include <string>

namespace hetmoe::model {

// A split model file (hetmoe split): each routed expert tensor "blk.N.ffn_X_exps.weight" of the source gets a
// low-bit GPU part W^Q ("blk.N.ffn_X_exps.wq", an HQ type of quant/lowbit.h), and what the CPU computes a token's
// critical experts from:
//   residual  the tensor is replaced by its residual W^R ("blk.N.ffn_X_exps.wr", a CPU dot-product format), so that
//             W ~ deq(W^Q) + deq(W^R): a critical item adds W^R's product to W^Q's;
//   source    the tensor stays as it was: a critical item runs on the source expert instead of W^Q (exact), no
//             expert costs the CPU more bytes than the original, and the file is the source plus W^Q.
// Every other tensor and metadata key is the source's; these keys record the split:
inline constexpr const char* kSplitVersionKey = "hetmoe.split.version";             // u32: quant::kLowBitLayoutVersion
inline constexpr const char* kSplitGpuTypeKey = "hetmoe.split.gpu_type";            // string, e.g. "HQ2_G64"
inline constexpr const char* kSplitResidualBitsKey = "hetmoe.split.residual_bits";  // u32, as asked for
inline constexpr const char* kSplitSourceKey = "hetmoe.split.source";               // string: the source's file name
inline constexpr const char* kSplitCriticalFromKey = "hetmoe.split.critical_from";  // string; absent: "residual"

enum class CriticalFrom { kResidual, kSource };
// "residual" or "source"; fails (hetmoe::Error) on anything else, naming `what`.
CriticalFrom parse_critical_from(const std::string& name, const std::string& what);
const char* critical_from_name(CriticalFrom from);

// How many of each token's routed experts (largest mixing weights first) add their residual unless --critical says
// otherwise: the KL table of README "Split experts" (scripts/split_quality.sh) shows the first two experts taking
// away half (the tiny DeepSeek-V3 model, 4 of 16 experts) to three quarters (Qwen3-MoE) of W^Q's divergence, the
// rest far less per expert, while the CPU reads r / n_used of the residual bytes.
inline constexpr int64_t kDefaultCritical = 2;

// Whether a tensor of a model file is a routed expert tensor (the ones a split replaces).
bool is_routed_expert_tensor(const std::string& name);
// The names of the two parts of routed expert tensor `name`.
std::string split_gpu_name(const std::string& name);       // "blk.N.ffn_X_exps.wq"
std::string split_residual_name(const std::string& name);  // "blk.N.ffn_X_exps.wr"

}  // namespace hetmoe::model
