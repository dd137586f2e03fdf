#pragma once

// ggml's block structs, field for field. A row of a quantized tensor is an array of these, so the layouts
// (sizes and field offsets) must match ggml exactly; the static_asserts below pin them. Half-precision fields
// are stored as raw uint16_t bits (decode with fp16_to_fp32), as in the file.
//
// Rows in a file or a caller's buffer are not guaranteed to be aligned for these structs; code that reads them
// from a byte buffer copies a block out (load_block) instead of casting the pointer.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/lowbit.h"  // HETMOE_HOST_DEVICE

namespace hetmoe::quant {

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK5_0 = 32;
inline constexpr int kQK5_1 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK8_1 = 32;
inline constexpr int kQK4_NL = 32;
inline constexpr int kQK_MXFP4 = 32;
inline constexpr int kQK_K = 256;        // elements per K-quant super-block
inline constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K, and Q3_K's scales

// The 16 levels of IQ4_NL and IQ4_XS, in units of the block scale.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The 16 codes of MXFP4: E2M1's values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) doubled, so they are integers;
// the block scale is read back halved (e8m0_to_fp32_half) to make up for it.
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// An E8M0 scale (a bare float exponent, bias 127) times one half: 2^(e - 128), 2^-128 and 2^-127 as denormals.
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

struct BlockQ4_0 {
  uint16_t d;              // fp16 scale
  uint8_t qs[kQK4_0 / 2];  // element j in the low nibble of qs[j], element j+16 in the high nibble
};

struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 min
  uint8_t qs[kQK4_1 / 2];
};

struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // fifth bit of element j at bit j (little-endian uint32)
  uint8_t qs[kQK5_0 / 2];
};

struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};

struct BlockQ8_1 {
  uint16_t d;  // fp16 scale
  uint16_t s;  // fp16 of d * sum(qs), d taken before rounding to half
  int8_t qs[kQK8_1];
};

// 2.625 bits per weight: 16 groups of 16, each with a 4-bit scale and a 4-bit min.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // low nibble scale, high nibble min
  uint8_t qs[kQK_K / 4];
  uint16_t d;     // fp16 super-scale of the scales
  uint16_t dmin;  // fp16 super-scale of the mins
};

// 3.4375 bits per weight: 16 groups of 16 with 6-bit signed scales.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];  // third bit of each element
  uint8_t qs[kQK_K / 4];     // low two bits
  uint8_t scales[kKScaleBytes];
  uint16_t d;
};

// The 6-bit scale and min of group g (0..7) of a Q4_K / Q5_K block from its packed scales (ggml's
// get_scale_min_k4): groups 0-3 in the low 6 bits of bytes g and g + 4, groups 4-7 in the nibbles of byte g + 4 with
// their top two bits in bytes g - 4 and g.
HETMOE_HOST_DEVICE inline void k4_scale_min(const uint8_t* scales, int g, int& scale, int& min) {
  if (g < 4) {
    scale = scales[g] & 63;
    min = scales[g + 4] & 63;
  } else {
    scale = (scales[g + 4] & 0x0f) | ((scales[g - 4] >> 6) << 4);
    min = (scales[g + 4] >> 4) | ((scales[g] >> 6) << 4);
  }
}

// 4.5 bits per weight: 8 groups of 32 with 6-bit scales and mins.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};

// 5.5 bits per weight: as Q4_K plus a fifth bit per element.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// 6.5625 bits per weight: 16 groups of 16 with 8-bit signed scales.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];  // low four bits
  uint8_t qh[kQK_K / 4];  // high two bits
  int8_t scales[kQK_K / 16];
  uint16_t d;
};

// Activation format of the K-quants: the scale is a full float, and bsums lets a dot product fold in the
// weights' mins without touching qs again.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];  // sum of qs over each group of 16
};

struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK4_NL / 2];  // indices into kIq4NlValues, nibbles laid out as Q4_0
};

struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;             // high two bits of the 8 six-bit block scales
  uint8_t scales_l[kQK_K / 64];  // low four bits, two per byte
  uint8_t qs[kQK_K / 2];
};

// The IQ formats (importance-matrix "i-quants"): per 256 an fp16 scale, per sub-block of 32 or 16 a small odd
// multiplier 2s + 1, per group of 8 (or 4) one grid index (quant/iq_grids.h) and sign bits. Group g of sub-block b
// is elements 32 b + 8 g ... (IQ3: groups of 4, in pairs sharing a sign byte).
struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];  // per 32: 4 bytes of grid indices, then a uint32 of 4 x 7 sign bits and the 4-bit scale
};

struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];      // per group of 8: 9-bit grid index, 7 sign bits above it
  uint8_t scales[kQK_K / 32];  // per 32: two 4-bit scales, one per 16
};

struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[kQK_K / 4];       // 32 low bytes of 10-bit grid indices, then 32 sign bytes (one per group of 8)
  uint8_t qh[kQK_K / 32];      // per 32: the indices' top two bits, 2 bits per group
  uint8_t scales[kQK_K / 32];  // per 32: two 4-bit scales, one per 16
};

struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[3 * kQK_K / 8];  // 64 grid indices (groups of 4), then per 32 a uint32 of 4 x 7 sign bits and the scale
};

struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[kQK_K / 4];       // low bytes of the 9-bit grid indices (groups of 4)
  uint8_t qh[kQK_K / 32];      // per 32: the 8 indices' ninth bits
  uint8_t signs[kQK_K / 8];    // one sign bit per element
  uint8_t scales[kQK_K / 64];  // per 64: two 4-bit scales, one per 32
};

struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[kQK_K / 8];    // low bytes of the 11-bit grid indices
  uint16_t qh[kQK_K / 32];  // per 32: 4 x 3 index bits, a 3-bit scale, the sign of the shift in bit 15
};

// IQ1_M has no separate fp16 field: its scale's 16 bits sit in the top nibbles of the four uint16 scale words.
struct BlockIQ1_M {
  uint8_t qs[kQK_K / 8];       // low bytes of the 11-bit grid indices
  uint8_t qh[kQK_K / 16];      // per pair of groups: 3 index bits and the shift's sign for each
  uint8_t scales[kQK_K / 32];  // 4 little-endian uint16: four 3-bit scales (one per 16) and a nibble of the fp16
};

// MXFP4 (OCP microscaling, gpt-oss's experts): 32 E2M1 codes under one power-of-two scale.
struct BlockMXFP4 {
  uint8_t e;                  // E8M0 scale
  uint8_t qs[kQK_MXFP4 / 2];  // codes into kMxfp4Values, nibbles laid out as Q4_0
};

// The ternary formats (values -1, 0, 1 times one fp16 scale per 256). TQ1_0 packs 5 values per byte in base 3 as a
// fixed-point fraction (byte = ceil(256 * v / 243) for the 5-trit number v, so value n is the integer part of
// 3 * (byte * 3^n mod 256) / 256): 240 values in qs, in runs of 32 and then 16 bytes, the last 16 values 4 per byte in
// qh. TQ2_0 stores 2 bits per value (code - 1), value 32 * (4 * c + l) + m in bits 2l of qs[32 c + m].
struct BlockTQ1_0 {
  uint8_t qs[(kQK_K - 4 * kQK_K / 64) / 5];
  uint8_t qh[kQK_K / 64];
  uint16_t d;
};

struct BlockTQ2_0 {
  uint8_t qs[kQK_K / 4];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && offsetof(BlockQ5_0, qs) == 6);
static_assert(sizeof(BlockQ5_1) == 24 && offsetof(BlockQ5_1, qs) == 8);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36 && offsetof(BlockQ8_1, qs) == 4);
static_assert(sizeof(BlockQ2_K) == 84 && offsetof(BlockQ2_K, d) == 80);
static_assert(sizeof(BlockQ3_K) == 110 && offsetof(BlockQ3_K, d) == 108);
static_assert(sizeof(BlockQ4_K) == 144 && offsetof(BlockQ4_K, qs) == 16);
static_assert(sizeof(BlockQ5_K) == 176 && offsetof(BlockQ5_K, qs) == 48);
static_assert(sizeof(BlockQ6_K) == 210 && offsetof(BlockQ6_K, d) == 208);
static_assert(sizeof(BlockQ8_K) == 292 && offsetof(BlockQ8_K, bsums) == 260);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136 && offsetof(BlockIQ4_XS, qs) == 8);
static_assert(sizeof(BlockIQ2_XXS) == 66);
static_assert(sizeof(BlockIQ2_XS) == 74 && offsetof(BlockIQ2_XS, scales) == 66);
static_assert(sizeof(BlockIQ2_S) == 82 && offsetof(BlockIQ2_S, qh) == 66 && offsetof(BlockIQ2_S, scales) == 74);
static_assert(sizeof(BlockIQ3_XXS) == 98);
static_assert(sizeof(BlockIQ3_S) == 110 && offsetof(BlockIQ3_S, signs) == 74 && offsetof(BlockIQ3_S, scales) == 106);
static_assert(sizeof(BlockIQ1_S) == 50 && offsetof(BlockIQ1_S, qh) == 34);
static_assert(sizeof(BlockIQ1_M) == 56 && offsetof(BlockIQ1_M, scales) == 48);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockTQ1_0) == 54 && offsetof(BlockTQ1_0, d) == 52);
static_assert(sizeof(BlockTQ2_0) == 66 && offsetof(BlockTQ2_0, d) == 64);

// Block i of a row that may sit at any byte address.
template <typename Block>
Block load_block(const void* row, int64_t i) {
  static_assert(std::is_trivially_copyable_v<Block>);
  Block b;
  std::memcpy(&b, static_cast<const std::byte*>(row) + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

template <typename Block>
void store_block(void* row, int64_t i, const Block& b) {
  static_assert(std::is_trivially_copyable_v<Block>);
  std::memcpy(static_cast<std::byte*>(row) + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

}  // namespace hetmoe::quant
