#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "quant/ggml_type.h"

namespace hetmoe {

// llama.cpp's llama_ftype numbers (what general.file_type stores) for the mixes make-model writes.
enum class LlamaFtype : uint32_t {
  kAllF32 = 0,
  kMostlyF16 = 1,
  kMostlyQ4_0 = 2,
  kMostlyQ4_1 = 3,
  kMostlyQ8_0 = 7,
  kMostlyQ5_0 = 8,
  kMostlyQ5_1 = 9,
  kMostlyQ2_K = 10,
  kMostlyQ3_K_M = 12,
  kMostlyQ4_K_M = 15,
  kMostlyQ5_K_M = 17,
  kMostlyQ6_K = 18,
  kMostlyIQ2_XXS = 19,
  kMostlyIQ2_XS = 20,
  kMostlyIQ3_XXS = 23,
  kMostlyIQ1_S = 24,
  kMostlyIQ4_NL = 25,
  kMostlyIQ3_S = 26,
  kMostlyIQ2_S = 28,
  kMostlyIQ2_M = 29,
  kMostlyIQ4_XS = 30,
  kMostlyIQ1_M = 31,
  kMostlyBF16 = 32,
  kMostlyTQ1_0 = 36,
  kMostlyTQ2_0 = 37,
  kMostlyMXFP4Moe = 38,
};

// One --type value: its name, the llama_ftype it is, and the type most weight tensors get.
struct FileType {
  std::string_view name;  // "Q4_K_M"
  LlamaFtype ftype;
  quant::GgmlType default_type;
  // An unsloth-like "dynamic" mix rather than llama.cpp's rules for the ftype (UD-IQ2_XXS): routed experts in the
  // low-bit types, every other weight in K-quants.
  bool dynamic = false;
};

// The block index of a tensor name ("blk.%d."), or -1 for a tensor outside the blocks.
int layer_of(std::string_view name);

std::span<const FileType> file_types();
// Case-insensitive; nullptr for an unknown name.
const FileType* find_file_type(std::string_view name);

// What decides a tensor's type besides its name and shape.
struct TensorTypeQuery {
  std::string_view name;        // GGUF tensor name, "blk.2.ffn_down_exps.weight"
  std::span<const int64_t> ne;  // ggml order; ne[0] is the row length
  int n_layer = 0;              // block count of the model
  int64_t n_expert = 0;         // routed experts per MoE block
  int ffn_down_index = 0;       // how many tensors named "*ffn_down*" come before this one in the file
  int attn_v_index = 0;         // how many attn_v tensors come before this one (GQA files)
  int64_t n_gqa = 1;            // query heads per key/value head
};

// The type llama.cpp's quantizer (llama_tensor_get_type, no importance matrix, no overrides) gives this tensor when
// it writes a `ft` file from an F32 model, for the deepseek2 tensors make-model writes. F16 and BF16 follow the
// converter rule (every 2-D+ ".weight" except ffn_gate_inp); F32 keeps everything F32.
quant::GgmlType tensor_type_for(const FileType& ft, const TensorTypeQuery& q);

// tensor_type_for over a file's tensors in file order, keeping the counts of ffn_down and attn_v tensors seen so far
// that llama.cpp's quantizer keeps.
class TensorTypeWalk {
 public:
  TensorTypeWalk(const FileType& ft, int n_layer, int64_t n_expert, int64_t n_gqa)
      : ft_(ft), n_layer_(n_layer), n_expert_(n_expert), n_gqa_(n_gqa) {}
  // The type of the next tensor of the file.
  quant::GgmlType next(std::string_view name, std::span<const int64_t> ne);

 private:
  const FileType& ft_;
  int n_layer_;
  int64_t n_expert_, n_gqa_;
  int ffn_down_index_ = 0, attn_v_index_ = 0;
};

}  // namespace hetmoe
