#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quant/ggml_type.h"
#include "runtime/gguf/value.h"
#include "runtime/model/file_types.h"
#include "runtime/model/presets.h"

namespace hetmoe {

// What `hetmoe make-model` is asked for.
struct MakeModelOptions {
  std::string preset;  // a name from preset_names()
  std::string out_path;
  std::string type = "Q4_K_M";  // a name from file_type_names()
  int layers = -1;              // -1: the preset's default block count
  uint64_t seed = 1;
  int threads = 1;               // threads generating and quantizing rows; < 1: all cores
  uint64_t max_shard_bytes = 0;  // > 0: shards of at most this much data (<out>-NNNNN-of-MMMMM.gguf)
  // An MTP block after the trunk (DeepSeek-V3's multi-token prediction, GLM-4.5's NextN): the presets of deepseek2,
  // deepseek32 and glm4moe; the block uses the trunk's embedding and output head.
  bool mtp = false;
};

// How a tensor's values are drawn (README section 2.1 of the reference data).
enum class WeightInit {
  kMatrix,     // scale * N(0,1)
  kNorm,       // 1 + 0.1 * N(0,1): not 1, so a runtime that drops or swaps a norm weight shows up
  kBias,       // 0.05 * N(0,1) (exp_probs_b)
  kSpread,     // 0.5 * N(0,1): DeepSeek-V4's hyper-connection bases and compressor ape, Qwen3.5's ssm_dt bias
  kDecay,      // -exp(0.5 * N(0,1)): Qwen3.5's ssm_a (the converter stores -exp(A_log)), a decay in every head
  kExpertIds,  // I32 rows of n_used distinct expert ids (DeepSeek-V4's ffn_gate_tid2eid), ne[0] of them per row
};

struct PlannedTensor {
  std::string name;
  quant::GgmlType type = quant::GgmlType::F32;
  std::vector<int64_t> ne;  // ggml order
  WeightInit init = WeightInit::kMatrix;
  float scale = 0.05f;  // standard deviation of kMatrix values
  int64_t n_ids = 0;    // kExpertIds: the expert count the ids are drawn from

  int64_t n_rows() const;
  int64_t n_elements() const { return ne[0] * n_rows(); }
  size_t nbytes() const;
};

// Everything make_model writes, computed without generating a single weight: the metadata in file order and the
// tensors in the converter's order with their final types. make_model writes exactly this.
struct ModelPlan {
  const ModelPreset* preset = nullptr;
  const FileType* file_type = nullptr;
  int n_layer = 0;
  int n_leading_dense = 0;
  int n_mtp = 0;  // MTP blocks after the trunk's n_layer
  uint64_t seed = 0;
  std::vector<std::pair<std::string, gguf::Value>> metadata;
  std::vector<PlannedTensor> tensors;

  uint64_t n_params() const;
  uint64_t data_bytes() const;  // tensor data without alignment padding
};

// Fails (hetmoe::Error) on an unknown preset or type and on a block count outside 1..preset.max_layers.
ModelPlan plan_model(const MakeModelOptions& opt);

// Plans and writes the model. `log` (when set) gets one line per tensor and a summary.
// Memory: the GGUF writer holds one tensor's bytes (the largest is an expert tensor: 2.1 GB for deepseek-v3 at
// Q4_K_M); the weights are generated and converted row by row into it, `threads` rows at a time.
void make_model(const MakeModelOptions& opt, const std::function<void(const std::string& line)>& log = {});

std::vector<std::string> preset_names();
std::vector<std::string> file_type_names();

// Row `row` of tensor `t` as floats, before conversion to t.type: a pure function of (seed, t.name, row), so the
// values do not depend on the file type or the thread count.
void generate_row(uint64_t seed, const PlannedTensor& t, int64_t row, float* out);

// zlib's CRC-32 (IEEE 802.3, reflected), which seeds each tensor's stream.
uint32_t crc32(std::string_view bytes);

}  // namespace hetmoe
