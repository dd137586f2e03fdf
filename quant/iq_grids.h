#pragma once

// The lookup tables of ggml's IQ formats (values in iq_grids.cpp): a group of 8 (IQ1, IQ2) or 4 (IQ3) weights is one
// index into a grid of allowed magnitude patterns, one byte per element, least significant byte first.
//   IQ2_XXS, IQ2_XS, IQ2_S: bytes 8, 25, 43 (in eighths of the sub-block scale), under sign bits.
//   IQ3_XXS: bytes 4, 12, ..., 52, 62 (quarters); IQ3_S: bytes 1, 3, ..., 15 (whole units), under sign bits.
//   IQ1_S, IQ1_M: signed bytes -1, 0, 1, plus a shift of +-1/8 per group.

#include <array>
#include <cstdint>

namespace hetmoe::quant {

extern const uint64_t iq2xxs_grid[256];
extern const uint64_t iq2xs_grid[512];
extern const uint64_t iq2s_grid[1024];
extern const uint32_t iq3xxs_grid[256];
extern const uint32_t iq3s_grid[512];
extern const uint64_t iq1s_grid[2048];

// IQ2_XXS, IQ2_XS and IQ3_XXS store 7 sign bits per group of 8; the eighth makes the count of negatives even.
// Entry i is the full 8-bit sign mask (bit j set: element j negative), as ggml's ksigns_iq2xs.
inline constexpr std::array<uint8_t, 128> kIqParitySigns = [] {
  std::array<uint8_t, 128> t{};
  for (unsigned i = 0; i < 128; ++i) {
    unsigned parity = 0;
    for (unsigned b = i; b != 0; b >>= 1) parity ^= b & 1u;
    t[i] = static_cast<uint8_t>(i | parity << 7);
  }
  return t;
}();

// For each sign byte, 0xff in the bytes of the elements it marks negative (IQ2_S and IQ3_S store whole sign bytes).
inline constexpr std::array<uint64_t, 256> kIqSignByteMasks = [] {
  std::array<uint64_t, 256> t{};
  for (unsigned s = 0; s < 256; ++s)
    for (unsigned j = 0; j < 8; ++j)
      if (s >> j & 1) t[s] |= uint64_t{0xff} << (8 * j);
  return t;
}();

// kIqParitySigns as byte masks.
inline constexpr std::array<uint64_t, 128> kIqParitySignMasks = [] {
  std::array<uint64_t, 128> t{};
  for (unsigned i = 0; i < 128; ++i) t[i] = kIqSignByteMasks[kIqParitySigns[i]];
  return t;
}();

}  // namespace hetmoe::quant
