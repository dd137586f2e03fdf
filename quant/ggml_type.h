#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hetmoe::quant {

// The ggml weight formats hetmoe reads, with ggml's numeric ids (they are what GGUF files store), and hetmoe's own
// low-bit split formats (quant/lowbit.h) with ids far outside ggml's range.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I32 = 26,  // integer tables (DeepSeek-V4's ffn_gate_tid2eid): read as ids, never multiplied
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  HQ2_G64 = 1020,  // id = 1000 + 10 * bits + (group == 128)
  HQ2_G128 = 1021,
  HQ3_G64 = 1030,
  HQ3_G128 = 1031,
  HQ4_G64 = 1040,
  HQ4_G128 = 1041,
};

struct TypeInfo {
  GgmlType type;
  std::string_view name;  // as this project writes it: "Q4_K", "F16"
  int64_t block_size;     // elements per block
  size_t type_size;       // bytes per block (HQ types: per group, codes plus scale and offset; rows are not blocks)
  GgmlType vec_dot_type;  // the format an activation is converted to before a dot product with this type
};

// nullptr for ids hetmoe does not know (the GGUF reader reports those as errors).
const TypeInfo* type_info(uint32_t id);
const TypeInfo& type_info(GgmlType type);
std::optional<GgmlType> type_from_name(std::string_view name);  // case-insensitive, "q4_k" or "Q4_K"
// Whether activations for weights of types a and b are converted to the same format (one conversion serves both).
inline bool same_vec_dot_type(GgmlType a, GgmlType b) { return type_info(a).vec_dot_type == type_info(b).vec_dot_type; }

// Bytes of a row of n elements; 0 when n is not a multiple of the block size.
size_t row_bytes(GgmlType type, int64_t n);

}  // namespace hetmoe::quant
