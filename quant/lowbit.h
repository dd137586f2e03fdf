#pragma once

// W^Q, the low-bit part of a split expert weight: the copy that lives on the GPU. Each row is cut into
// groups of 64 or 128 values; every value is stored in b = 2, 3 or 4 bits as q in [0, 2^b - 1] and read back as
// d * q + m, with an fp16 scale d and an fp16 offset m per group. The types are GgmlType::HQ<b>_G<group>, ids
// outside ggml's range, and only hetmoe's split files hold them.
//
// Layout version kLowBitLayoutVersion (written to a split file's metadata), for a row of n values:
//   codes    n * b / 8 bytes, in units of 32 values of b little-endian uint32 words each:
//              b = 2: word k of a unit holds values 16k..16k+15, value j at bits 2 (j % 16)
//              b = 4: word k holds values 8k..8k+7, value j at bits 4 (j % 8)
//              b = 3: words 0-1 hold the two low bits as for b = 2, word 2 holds the third bit of value j at bit j
//   scales   n / group fp16 values d
//   offsets  n / group fp16 values m
// Each part starts on a 4-byte boundary, so a GPU warp reads a row's codes as consecutive 32-bit words (coalesced)
// and the scales and offsets as a second and third contiguous run. A row is not an array of blocks: the quant::
// entry points take whole rows of these types, never part of one.

#include <cstdint>
#include <optional>

#include "quant/ggml_type.h"

// Functions the CUDA kernels share with the CPU: compiled for both where nvcc compiles them.
#if defined(__CUDACC__)
#define HETMOE_HOST_DEVICE __host__ __device__
#else
#define HETMOE_HOST_DEVICE
#endif

namespace hetmoe::quant {

inline constexpr uint32_t kLowBitLayoutVersion = 1;
inline constexpr int kLowBitUnit = 32;  // values per packing unit of kBits words

// Where a row's three parts start, in bytes from the row's start, for a row of n values (the layout above).
struct LowBitRowParts {
  int64_t codes, scales, offsets;
};
HETMOE_HOST_DEVICE constexpr LowBitRowParts lowbit_row_parts(int bits, int group, int64_t n) {
  return {0, n * bits / 8, n * bits / 8 + n / group * 2};
}

// Code j (0..31) of one 32-value unit from the unit's kBits words, as the layout above stores it: the one reading of
// the layout, shared by the CPU reference and the CUDA kernels (compiled for the device there).
template <int kBits>
HETMOE_HOST_DEVICE constexpr int lowbit_code(const uint32_t* unit, int j) {
  if constexpr (kBits == 4) return static_cast<int>(unit[j / 8] >> (4 * (j % 8)) & 15);
  int q = static_cast<int>(unit[j / 16] >> (2 * (j % 16)) & 3);
  if constexpr (kBits == 3) q |= static_cast<int>((unit[2] >> j) & 1) << 2;
  return q;
}

// Codes 8 part .. 8 part + 7 (part 0..3) of one unit into q, reading only the words that hold them: the CUDA kernels
// give each lane one part, and index no register array by a run-time value.
template <int kBits>
HETMOE_HOST_DEVICE constexpr void lowbit_codes8(const uint32_t* unit, int part, int (&q)[8]) {
  if constexpr (kBits == 4) {
    const uint32_t word = unit[part];
    for (int i = 0; i < 8; ++i) q[i] = static_cast<int>(word >> (4 * i) & 15);
  } else {
    const uint32_t low = unit[part / 2] >> (16 * (part % 2));
    for (int i = 0; i < 8; ++i) q[i] = static_cast<int>(low >> (2 * i) & 3);
    if constexpr (kBits == 3) {
      const uint32_t high = unit[2] >> (8 * part);
      for (int i = 0; i < 8; ++i) q[i] |= static_cast<int>(high >> i & 1) << 2;
    }
  }
}

struct LowBitFormat {
  int bits = 0;   // 2, 3 or 4
  int group = 0;  // 64 or 128
};

// The format of an HQ type; nullopt for every other type.
std::optional<LowBitFormat> lowbit_format(GgmlType type);
// The HQ type of a format; nullopt when bits or group is not one of the supported values.
std::optional<GgmlType> lowbit_type(LowBitFormat format);

}  // namespace hetmoe::quant
