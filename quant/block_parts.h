#pragma once

// Eight values of a GGUF block at a time: part p of a block holds its values 8p .. 8p + 7. The CUDA matmul kernels
// give each lane of a warp one part, so that the lanes share a block (a 256-value K-quant block is the 32 parts of
// one warp step, a 32-value block the 4 parts of a quarter of the lanes) instead of each lane decoding whole blocks
// alone. The same code compiles for the host, where the tests check every part against quant/ref's dequantization.
// F32 and F16 rows are read as "blocks" of 8 values.

#include <cstdint>

#include "quant/blocks.h"
#include "quant/ggml_type.h"
#include "quant/lowbit.h"  // HETMOE_HOST_DEVICE

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#else
#include "quant/half.h"
#endif

namespace hetmoe::quant {

HETMOE_HOST_DEVICE inline float half_value(uint16_t bits) {
#if defined(__CUDACC__)
  return __half2float(__ushort_as_half(bits));
#else
  return fp16_to_fp32(bits);
#endif
}

template <GgmlType kType>
struct BlockParts;  // kValues per block, kBytes per block, part(block, p, v): v[i] = value 8p + i

// The formats with BlockParts.
template <GgmlType kType>
inline constexpr bool kHasBlockParts = kType == GgmlType::F32 || kType == GgmlType::F16 || kType == GgmlType::Q8_0 ||
                                       kType == GgmlType::Q5_0 || kType == GgmlType::Q4_K || kType == GgmlType::Q6_K;

template <>
struct BlockParts<GgmlType::F32> {
  static constexpr int kValues = 8, kBytes = 32;
  HETMOE_HOST_DEVICE static void part(const uint8_t* b, int, float (&v)[8]) {
    const auto* f = reinterpret_cast<const float*>(b);
    for (int i = 0; i < 8; ++i) v[i] = f[i];
  }
};

template <>
struct BlockParts<GgmlType::F16> {
  static constexpr int kValues = 8, kBytes = 16;
  HETMOE_HOST_DEVICE static void part(const uint8_t* b, int, float (&v)[8]) {
    const auto* h = reinterpret_cast<const uint16_t*>(b);
    for (int i = 0; i < 8; ++i) v[i] = half_value(h[i]);
  }
};

template <>
struct BlockParts<GgmlType::Q8_0> {
  using Block = BlockQ8_0;
  static constexpr int kValues = kQK8_0, kBytes = sizeof(Block);
  HETMOE_HOST_DEVICE static void part(const uint8_t* p, int part, float (&v)[8]) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    const float d = half_value(b.d);
    for (int i = 0; i < 8; ++i) v[i] = d * static_cast<float>(b.qs[8 * part + i]);
  }
};

template <>
struct BlockParts<GgmlType::Q5_0> {
  using Block = BlockQ5_0;
  static constexpr int kValues = kQK5_0, kBytes = sizeof(Block);
  // Values 0-15 are the low nibbles of qs, 16-31 the high ones; byte p of qh holds the fifth bits of part p.
  HETMOE_HOST_DEVICE static void part(const uint8_t* p, int part, float (&v)[8]) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    const float d = half_value(b.d);
    const uint8_t* qs = b.qs + 8 * (part % 2);
    const int shift = part < 2 ? 0 : 4;
    const int high = b.qh[part];
    for (int i = 0; i < 8; ++i) {
      const int q = ((qs[i] >> shift) & 15) | ((high >> i) & 1) << 4;
      v[i] = d * static_cast<float>(q - 16);
    }
  }
};

template <>
struct BlockParts<GgmlType::Q4_K> {
  using Block = BlockQ4_K;
  static constexpr int kValues = kQK_K, kBytes = sizeof(Block);
  // Sub-block g = part / 4 (32 values, 6-bit scale and min); its codes are the low (g even) or high nibbles of the
  // 32 bytes qs[32 (g / 2) ...].
  HETMOE_HOST_DEVICE static void part(const uint8_t* p, int part, float (&v)[8]) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    const int g = part / 4;
    const uint8_t* sc = b.scales;
    int scale, min;
    k4_scale_min(sc, g, scale, min);
    const float ds = half_value(b.d) * static_cast<float>(scale), dm = half_value(b.dmin) * static_cast<float>(min);
    const uint8_t* q = b.qs + 32 * (g / 2) + 8 * (part % 4);
    const int shift = g % 2 ? 4 : 0;
    for (int i = 0; i < 8; ++i) v[i] = ds * static_cast<float>((q[i] >> shift) & 15) - dm;
  }
};

template <>
struct BlockParts<GgmlType::Q6_K> {
  using Block = BlockQ6_K;
  static constexpr int kValues = kQK_K, kBytes = sizeof(Block);
  // Each half of 128 values: quarter k (32 values) takes the low (k < 2) or high nibbles of ql[64 half + 32 (k % 2)
  // ...], two bits of qh[32 half ...] at 2k, and the scale of its 16 values.
  HETMOE_HOST_DEVICE static void part(const uint8_t* p, int part, float (&v)[8]) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    const int half = part / 16, quarter = (part / 4) % 4, l0 = 8 * (part % 4);
    const uint8_t* ql = b.ql + 64 * half + 32 * (quarter % 2) + l0;
    const uint8_t* qh = b.qh + 32 * half + l0;
    const int low_shift = quarter < 2 ? 0 : 4, high_shift = 2 * quarter;
    const int scale = b.scales[8 * half + l0 / 16 + 2 * quarter];
    const float d = half_value(b.d);
    for (int i = 0; i < 8; ++i) {
      const int q = (((ql[i] >> low_shift) & 15) | ((qh[i] >> high_shift) & 3) << 4) - 32;
      v[i] = d * static_cast<float>(scale * q);
    }
  }
};

}  // namespace hetmoe::quant
