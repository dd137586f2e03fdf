#pragma once

// The IQ decoders (quant/iq.h's common block), inline so that every kernel tier compiles them into its own loop. They
// sit in an unnamed namespace: each translation unit keeps its own copy, so copies compiled with different ISA flags
// never meet at link time.

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"
#include "quant/iq.h"
#include "quant/iq_grids.h"

namespace hetmoe::quant {
namespace {  // NOLINT: internal linkage on purpose (see above)

// Blocks are copied out of their bytes here rather than through quant/blocks.h's load_block, and halves converted
// out of line: an external inline function compiled in a kernel tier's unit could be the copy the linker keeps for
// every caller.
template <typename Block>
Block iq_block(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof b);
  return b;
}

inline uint32_t iq_load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline void iq_set_ls(IqBlock& out, int sub32, int s_first16, int s_second16) {
  out.ls[2 * sub32] = static_cast<uint8_t>(2 * s_first16 + 1);
  out.ls[2 * sub32 + 1] = static_cast<uint8_t>(2 * s_second16 + 1);
}

template <GgmlType kType>
struct IqDecoder;

template <>
struct IqDecoder<GgmlType::IQ2_XXS> {
  static void decode(const uint8_t* p, IqBlock& out) {
    out.d = iq_half_to_float(static_cast<uint16_t>(p[0] | p[1] << 8));
    const uint8_t* bytes = p + 2;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t aux = iq_load_u32(bytes + 8 * ib + 4);
      iq_set_ls(out, ib, static_cast<int>(aux >> 28), static_cast<int>(aux >> 28));
      for (int l = 0; l < 4; ++l) {
        out.mag[4 * ib + l] = iq2xxs_grid[bytes[8 * ib + l]];
        out.sign[4 * ib + l] = kIqParitySigns[aux >> (7 * l) & 127];
      }
    }
  }
};

template <>
struct IqDecoder<GgmlType::IQ2_XS> {
  static void decode(const uint8_t* p, IqBlock& out) {
    const auto b = iq_block<BlockIQ2_XS>(p);
    out.d = iq_half_to_float(b.d);
    for (int ib = 0; ib < 8; ++ib) {
      iq_set_ls(out, ib, b.scales[ib] & 0xf, b.scales[ib] >> 4);
      for (int l = 0; l < 4; ++l) {
        const uint16_t v = b.qs[4 * ib + l];
        out.mag[4 * ib + l] = iq2xs_grid[v & 511];
        out.sign[4 * ib + l] = kIqParitySigns[v >> 9];
      }
    }
  }
};

template <>
struct IqDecoder<GgmlType::IQ2_S> {
  static void decode(const uint8_t* p, IqBlock& out) {
    const auto b = iq_block<BlockIQ2_S>(p);
    out.d = iq_half_to_float(b.d);
    std::memcpy(out.sign, b.qs + kQK_K / 8, 32);
    for (int ib = 0; ib < 8; ++ib) {
      iq_set_ls(out, ib, b.scales[ib] & 0xf, b.scales[ib] >> 4);
      for (int l = 0; l < 4; ++l) out.mag[4 * ib + l] = iq2s_grid[b.qs[4 * ib + l] | (b.qh[ib] << (8 - 2 * l) & 0x300)];
    }
  }
};

template <>
struct IqDecoder<GgmlType::IQ3_XXS> {
  static void decode(const uint8_t* p, IqBlock& out) {
    out.d = iq_half_to_float(static_cast<uint16_t>(p[0] | p[1] << 8));
    const uint8_t* qs = p + 2;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* idx = qs + 8 * ib;
      const uint32_t aux = iq_load_u32(qs + kQK_K / 4 + 4 * ib);
      iq_set_ls(out, ib, static_cast<int>(aux >> 28), static_cast<int>(aux >> 28));
      for (int l = 0; l < 4; ++l) {
        out.mag[4 * ib + l] = iq3xxs_grid[idx[2 * l]] | static_cast<uint64_t>(iq3xxs_grid[idx[2 * l + 1]]) << 32;
        out.sign[4 * ib + l] = kIqParitySigns[aux >> (7 * l) & 127];
      }
    }
  }
};

template <>
struct IqDecoder<GgmlType::IQ3_S> {
  static void decode(const uint8_t* p, IqBlock& out) {
    const auto b = iq_block<BlockIQ3_S>(p);
    out.d = iq_half_to_float(b.d);
    std::memcpy(out.sign, b.signs, 32);
    for (int ib = 0; ib < 8; ++ib) {
      const int s = ib % 2 == 0 ? b.scales[ib / 2] & 0xf : b.scales[ib / 2] >> 4;
      iq_set_ls(out, ib, s, s);
      const uint8_t* idx = b.qs + 8 * ib;
      const int qh = b.qh[ib];
      for (int l = 0; l < 4; ++l) {
        const int first = idx[2 * l] | (qh << (8 - 2 * l) & 256);
        const int second = idx[2 * l + 1] | (qh << (7 - 2 * l) & 256);
        out.mag[4 * ib + l] = iq3s_grid[first] | static_cast<uint64_t>(iq3s_grid[second]) << 32;
      }
    }
  }
};

inline void iq1_put(const Iq1Group* groups, int index, bool negative_shift, IqBlock& out, int g) {
  const Iq1Group& e = groups[2 * index + (negative_shift ? 1 : 0)];
  out.mag[g] = e.mag;
  out.sign[g] = e.sign;
}

template <>
struct IqDecoder<GgmlType::IQ1_S> {
  static void decode(const uint8_t* p, IqBlock& out) {
    const auto b = iq_block<BlockIQ1_S>(p);
    const Iq1Group* groups = iq1_groups();
    out.d = iq_half_to_float(b.d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = b.qh[ib];
      const int s = qh >> 12 & 7;
      iq_set_ls(out, ib, s, s);
      for (int l = 0; l < 4; ++l)
        iq1_put(groups, b.qs[4 * ib + l] | (qh >> (3 * l) & 7) << 8, (qh & 0x8000) != 0, out, 4 * ib + l);
    }
  }
};

template <>
struct IqDecoder<GgmlType::IQ1_M> {
  static void decode(const uint8_t* p, IqBlock& out) {
    const auto b = iq_block<BlockIQ1_M>(p);
    const Iq1Group* groups = iq1_groups();
    uint16_t sc[4];
    std::memcpy(sc, b.scales, sizeof sc);
    out.d = iq_half_to_float(
        static_cast<uint16_t>((sc[0] >> 12) | (sc[1] >> 8 & 0x00f0) | (sc[2] >> 4 & 0x0f00) | (sc[3] & 0xf000)));
    for (int ib = 0; ib < 8; ++ib) {
      const int shift = 6 * (ib % 2);
      iq_set_ls(out, ib, sc[ib / 2] >> shift & 7, sc[ib / 2] >> (shift + 3) & 7);
      for (int l = 0; l < 4; ++l) {
        const int qh = b.qh[2 * ib + l / 2];
        const int high = l % 2 == 0 ? (qh << 8 & 0x700) : (qh << 4 & 0x700);
        const bool negative = (qh & (l % 2 == 0 ? 0x08 : 0x80)) != 0;
        iq1_put(groups, b.qs[4 * ib + l] | high, negative, out, 4 * ib + l);
      }
    }
  }
};

// The signed value of element j of group g.
inline int iq_value(const IqBlock& b, int g, int j) {
  const int m = static_cast<int>(b.mag[g] >> (8 * j) & 0xff);
  return (b.sign[g] >> j & 1) ? -m : m;
}

}  // namespace
}  // namespace hetmoe::quant
