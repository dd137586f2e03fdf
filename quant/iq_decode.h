#pragma once

// The IQ decoders (quant/iq.h's common form), inline so that every kernel tier compiles them into its own loop, 32
// values at a time: a kernel builds its vectors from a chunk's eight words without a store and reload in between.
// They sit in an unnamed namespace: each translation unit keeps its own copy, so copies compiled with different ISA
// flags never meet at link time (for the same reason blocks are copied out with memcpy here, not load_block, and
// halves converted out of line).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq.h"
#include "quant/iq_grids.h"

namespace hetmoe::quant {
namespace {  // NOLINT: internal linkage on purpose (see above)

// 32 values of a block: four groups of 8. The decoders' loops over the four groups are unrolled on purpose: rolled,
// GCC keeps the chunk in memory and the kernel's 32-byte read of four 8-byte stores stalls (0.7 against 3.4 GB/s).
struct IqChunk {
  uint64_t mag[4];  // magnitude bytes
  uint64_t neg[4];  // 0xff in the bytes of the negative values
  int ls[2];        // the odd multipliers of the two 16s
};

inline uint32_t iq_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t iq_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// One per format: kBytes per block, kUnit (quant/iq.h's unit), scale(block) and chunk(block, k, chunk).
template <GgmlType kType>
struct IqDecoder;

// d, then per 32: 4 index bytes, a uint32 of 4 x 7 sign bits and the 4-bit scale.
template <>
struct IqDecoder<GgmlType::IQ2_XXS> {
  static constexpr size_t kBytes = sizeof(BlockIQ2_XXS);
  static constexpr float kUnit = 0.125f;
  static float scale(const uint8_t* b) { return iq_half_to_float(iq_u16(b)); }
  static void chunk(const uint8_t* b, int k, IqChunk& c) {
    const uint8_t* g = b + 2 + 8 * k;
    const uint32_t aux = iq_u32(g + 4);
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      c.mag[l] = iq2xxs_grid[g[l]];
      c.neg[l] = kIqParitySignMasks[aux >> (7 * l) & 127];
    }
    c.ls[0] = c.ls[1] = static_cast<int>(2 * (aux >> 28) + 1);
  }
};

// d, 32 uint16 (9-bit index, 7 sign bits), 8 scale bytes (two 4-bit scales each).
template <>
struct IqDecoder<GgmlType::IQ2_XS> {
  static constexpr size_t kBytes = sizeof(BlockIQ2_XS);
  static constexpr float kUnit = 0.125f;
  static float scale(const uint8_t* b) { return iq_half_to_float(iq_u16(b)); }
  static void chunk(const uint8_t* b, int k, IqChunk& c) {
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      const uint16_t v = iq_u16(b + 2 + 2 * (4 * k + l));
      c.mag[l] = iq2xs_grid[v & 511];
      c.neg[l] = kIqParitySignMasks[v >> 9];
    }
    const uint8_t sc = b[66 + k];
    c.ls[0] = 2 * (sc & 0xf) + 1;
    c.ls[1] = 2 * (sc >> 4) + 1;
  }
};

// d, 32 index low bytes, 32 sign bytes, 8 qh bytes (2 high index bits per group), 8 scale bytes.
template <>
struct IqDecoder<GgmlType::IQ2_S> {
  static constexpr size_t kBytes = sizeof(BlockIQ2_S);
  static constexpr float kUnit = 0.125f;
  static float scale(const uint8_t* b) { return iq_half_to_float(iq_u16(b)); }
  static void chunk(const uint8_t* b, int k, IqChunk& c) {
    const uint8_t* qs = b + 2;
    const int qh = b[66 + k];
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      c.mag[l] = iq2s_grid[qs[4 * k + l] | (qh << (8 - 2 * l) & 0x300)];
      c.neg[l] = kIqSignByteMasks[qs[32 + 4 * k + l]];
    }
    const uint8_t sc = b[74 + k];
    c.ls[0] = 2 * (sc & 0xf) + 1;
    c.ls[1] = 2 * (sc >> 4) + 1;
  }
};

// d, 64 index bytes (groups of 4), then per 32 a uint32 of 4 x 7 sign bits and the scale.
template <>
struct IqDecoder<GgmlType::IQ3_XXS> {
  static constexpr size_t kBytes = sizeof(BlockIQ3_XXS);
  static constexpr float kUnit = 0.25f;
  static float scale(const uint8_t* b) { return iq_half_to_float(iq_u16(b)); }
  static void chunk(const uint8_t* b, int k, IqChunk& c) {
    const uint8_t* idx = b + 2 + 8 * k;
    const uint32_t aux = iq_u32(b + 2 + kQK_K / 4 + 4 * k);
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      c.mag[l] = iq3xxs_grid[idx[2 * l]] | static_cast<uint64_t>(iq3xxs_grid[idx[2 * l + 1]]) << 32;
      c.neg[l] = kIqParitySignMasks[aux >> (7 * l) & 127];
    }
    c.ls[0] = c.ls[1] = static_cast<int>(2 * (aux >> 28) + 1);
  }
};

// d, 64 index low bytes, 8 qh bytes (the ninth bits), 32 sign bytes, 4 scale bytes (two 4-bit scales: one per 32).
template <>
struct IqDecoder<GgmlType::IQ3_S> {
  static constexpr size_t kBytes = sizeof(BlockIQ3_S);
  static constexpr float kUnit = 1.0f;
  static float scale(const uint8_t* b) { return iq_half_to_float(iq_u16(b)); }
  static void chunk(const uint8_t* b, int k, IqChunk& c) {
    const uint8_t* idx = b + 2 + 8 * k;
    const int qh = b[66 + k];
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      const int first = idx[2 * l] | (qh << (8 - 2 * l) & 256);
      const int second = idx[2 * l + 1] | (qh << (7 - 2 * l) & 256);
      c.mag[l] = iq3s_grid[first] | static_cast<uint64_t>(iq3s_grid[second]) << 32;
      c.neg[l] = kIqSignByteMasks[b[74 + 4 * k + l]];
    }
    const uint8_t sc = b[106 + k / 2];
    c.ls[0] = c.ls[1] = 2 * (k % 2 == 0 ? sc & 0xf : sc >> 4) + 1;
  }
};

inline void iq1_put(const Iq1Group* groups, int index, bool negative_shift, IqChunk& c, int l) {
  const Iq1Group& e = groups[2 * index + (negative_shift ? 1 : 0)];
  c.mag[l] = e.mag;
  c.neg[l] = e.neg;
}

// d, 32 index low bytes, 8 uint16 qh (4 x 3 index bits, a 3-bit scale, the shift's sign).
template <>
struct IqDecoder<GgmlType::IQ1_S> {
  static constexpr size_t kBytes = sizeof(BlockIQ1_S);
  static constexpr float kUnit = 0.125f;
  static float scale(const uint8_t* b) { return iq_half_to_float(iq_u16(b)); }
  static void chunk(const uint8_t* b, int k, IqChunk& c) {
    const Iq1Group* groups = iq1_groups();
    const uint16_t qh = iq_u16(b + 34 + 2 * k);
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) iq1_put(groups, b[2 + 4 * k + l] | (qh >> (3 * l) & 7) << 8, (qh & 0x8000) != 0, c, l);
    c.ls[0] = c.ls[1] = 2 * (qh >> 12 & 7) + 1;
  }
};

// 32 index low bytes, 16 qh bytes (per group 3 index bits and the shift's sign), 4 uint16 scale words whose top
// nibbles hold the fp16 block scale.
template <>
struct IqDecoder<GgmlType::IQ1_M> {
  static constexpr size_t kBytes = sizeof(BlockIQ1_M);
  static constexpr float kUnit = 0.125f;
  static float scale(const uint8_t* b) {
    const uint16_t s0 = iq_u16(b + 48), s1 = iq_u16(b + 50), s2 = iq_u16(b + 52), s3 = iq_u16(b + 54);
    return iq_half_to_float(
        static_cast<uint16_t>((s0 >> 12) | (s1 >> 8 & 0x00f0) | (s2 >> 4 & 0x0f00) | (s3 & 0xf000)));
  }
  static void chunk(const uint8_t* b, int k, IqChunk& c) {
    const Iq1Group* groups = iq1_groups();
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      const int qh = b[32 + 2 * k + l / 2];
      const int high = l % 2 == 0 ? (qh << 8 & 0x700) : (qh << 4 & 0x700);
      const bool negative = (qh & (l % 2 == 0 ? 0x08 : 0x80)) != 0;
      iq1_put(groups, b[4 * k + l] | high, negative, c, l);
    }
    const uint16_t sc = iq_u16(b + 48 + 2 * (k / 2));
    const int shift = 6 * (k % 2);
    c.ls[0] = 2 * (sc >> shift & 7) + 1;
    c.ls[1] = 2 * (sc >> (shift + 3) & 7) + 1;
  }
};

// The signed value of element j of group l.
inline int iq_value(const IqChunk& c, int l, int j) {
  const int m = static_cast<int>(c.mag[l] >> (8 * j) & 0xff);
  return (c.neg[l] >> (8 * j) & 1) ? -m : m;
}

}  // namespace
}  // namespace hetmoe::quant
