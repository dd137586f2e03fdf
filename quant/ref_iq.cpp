// The IQ formats' scalar reference: each format's block decoded to the common IqBlock (quant/iq.h), and dequantize
// and dot product written once over that. The decoders follow ggml's bit layouts (quant/blocks.h); the values are
// checked against llama.cpp's block vectors bit for bit.

#include <array>
#include <cstring>
#include <iterator>
#include <vector>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/iq.h"
#include "quant/iq_grids.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant {
namespace {

// For each sign byte, 0xff in the bytes of the elements it marks negative.
constexpr auto kSignBytes = [] {
  std::array<uint64_t, 256> t{};
  for (unsigned s = 0; s < 256; ++s)
    for (unsigned j = 0; j < 8; ++j)
      if (s >> j & 1) t[s] |= uint64_t{0xff} << (8 * j);
  return t;
}();

// The 8 grid bytes of `entry` with the elements whose bit is set in `signs` negated (bytes are below 128, so the
// per-byte two's complement never carries into the next byte).
void put_signed8(uint64_t entry, uint8_t signs, int8_t* q) {
  const uint64_t mask = kSignBytes[signs];
  const uint64_t v = (entry ^ mask) + (mask & 0x0101010101010101ull);
  std::memcpy(q, &v, 8);
}

// Two IQ3 groups of 4 under one sign byte.
void put_signed4x2(uint32_t first, uint32_t second, uint8_t signs, int8_t* q) {
  put_signed8(static_cast<uint64_t>(second) << 32 | first, signs, q);
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void set_ls(IqBlock& out, int sub32, int s_first16, int s_second16) {
  out.ls[2 * sub32] = static_cast<uint8_t>(2 * s_first16 + 1);
  out.ls[2 * sub32 + 1] = static_cast<uint8_t>(2 * s_second16 + 1);
}

void unpack_iq2_xxs(const void* block, IqBlock& out) {
  const auto b = load_block<BlockIQ2_XXS>(block, 0);
  out.d = fp16_to_fp32(b.d);
  const auto* bytes = reinterpret_cast<const uint8_t*>(b.qs);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* idx = bytes + 8 * ib;
    const uint32_t aux = load_u32(bytes + 8 * ib + 4);
    set_ls(out, ib, static_cast<int>(aux >> 28), static_cast<int>(aux >> 28));
    for (int l = 0; l < 4; ++l)
      put_signed8(kIq2xxsGrid[idx[l]], kIqParitySigns[aux >> (7 * l) & 127], out.q + 32 * ib + 8 * l);
  }
}

void unpack_iq2_xs(const void* block, IqBlock& out) {
  const auto b = load_block<BlockIQ2_XS>(block, 0);
  out.d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    set_ls(out, ib, b.scales[ib] & 0xf, b.scales[ib] >> 4);
    for (int l = 0; l < 4; ++l) {
      const uint16_t v = b.qs[4 * ib + l];
      put_signed8(kIq2xsGrid[v & 511], kIqParitySigns[v >> 9], out.q + 32 * ib + 8 * l);
    }
  }
}

void unpack_iq2_s(const void* block, IqBlock& out) {
  const auto b = load_block<BlockIQ2_S>(block, 0);
  out.d = fp16_to_fp32(b.d);
  const uint8_t* signs = b.qs + kQK_K / 8;
  for (int ib = 0; ib < 8; ++ib) {
    set_ls(out, ib, b.scales[ib] & 0xf, b.scales[ib] >> 4);
    for (int l = 0; l < 4; ++l) {
      const int index = b.qs[4 * ib + l] | (b.qh[ib] << (8 - 2 * l) & 0x300);
      put_signed8(kIq2sGrid[index], signs[4 * ib + l], out.q + 32 * ib + 8 * l);
    }
  }
}

void unpack_iq3_xxs(const void* block, IqBlock& out) {
  const auto b = load_block<BlockIQ3_XXS>(block, 0);
  out.d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* idx = b.qs + 8 * ib;
    const uint32_t aux = load_u32(b.qs + kQK_K / 4 + 4 * ib);
    set_ls(out, ib, static_cast<int>(aux >> 28), static_cast<int>(aux >> 28));
    for (int l = 0; l < 4; ++l)
      put_signed4x2(kIq3xxsGrid[idx[2 * l]], kIq3xxsGrid[idx[2 * l + 1]], kIqParitySigns[aux >> (7 * l) & 127],
                    out.q + 32 * ib + 8 * l);
  }
}

void unpack_iq3_s(const void* block, IqBlock& out) {
  const auto b = load_block<BlockIQ3_S>(block, 0);
  out.d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const int s = ib % 2 == 0 ? b.scales[ib / 2] & 0xf : b.scales[ib / 2] >> 4;
    set_ls(out, ib, s, s);
    const uint8_t* idx = b.qs + 8 * ib;
    const int qh = b.qh[ib];
    for (int l = 0; l < 4; ++l) {
      const int first = idx[2 * l] | (qh << (8 - 2 * l) & 256);
      const int second = idx[2 * l + 1] | (qh << (7 - 2 * l) & 256);
      put_signed4x2(kIq3sGrid[first], kIq3sGrid[second], b.signs[4 * ib + l], out.q + 32 * ib + 8 * l);
    }
  }
}

// IQ1: q = 8 * grid value (-1, 0, 1) + the shift (+1, or -1 when its sign bit is set), the 8 bytes of every
// (entry, shift) pair computed once: 32 KB that stay in cache.
const std::vector<uint64_t>& iq1_values() {
  static const std::vector<uint64_t> table = [] {
    std::vector<uint64_t> t(2 * std::size(kIq1sGrid));
    for (size_t e = 0; e < std::size(kIq1sGrid); ++e)
      for (int negative = 0; negative < 2; ++negative) {
        uint64_t v = 0;
        for (int j = 0; j < 8; ++j) {
          const int q = 8 * static_cast<int8_t>(kIq1sGrid[e] >> (8 * j) & 0xff) + (negative ? -1 : 1);
          v |= static_cast<uint64_t>(static_cast<uint8_t>(q)) << (8 * j);
        }
        t[2 * e + static_cast<size_t>(negative)] = v;
      }
    return t;
  }();
  return table;
}

void put_iq1(const std::vector<uint64_t>& values, int index, bool negative_shift, int8_t* q) {
  std::memcpy(q, &values[2 * static_cast<size_t>(index) + (negative_shift ? 1 : 0)], 8);
}

void unpack_iq1_s(const void* block, IqBlock& out) {
  const auto b = load_block<BlockIQ1_S>(block, 0);
  const std::vector<uint64_t>& values = iq1_values();
  out.d = fp16_to_fp32(b.d);
  for (int ib = 0; ib < 8; ++ib) {
    const uint16_t qh = b.qh[ib];
    const int s = qh >> 12 & 7;
    set_ls(out, ib, s, s);
    for (int l = 0; l < 4; ++l)
      put_iq1(values, b.qs[4 * ib + l] | (qh >> (3 * l) & 7) << 8, (qh & 0x8000) != 0, out.q + 32 * ib + 8 * l);
  }
}

void unpack_iq1_m(const void* block, IqBlock& out) {
  const auto b = load_block<BlockIQ1_M>(block, 0);
  const std::vector<uint64_t>& values = iq1_values();
  uint16_t sc[4];
  std::memcpy(sc, b.scales, sizeof sc);
  out.d = fp16_to_fp32(
      static_cast<uint16_t>((sc[0] >> 12) | (sc[1] >> 8 & 0x00f0) | (sc[2] >> 4 & 0x0f00) | (sc[3] & 0xf000)));
  for (int ib = 0; ib < 8; ++ib) {
    const int shift = 6 * (ib % 2);
    set_ls(out, ib, sc[ib / 2] >> shift & 7, sc[ib / 2] >> (shift + 3) & 7);
    for (int l = 0; l < 4; ++l) {
      const int qh = b.qh[2 * ib + l / 2];
      const int high = l % 2 == 0 ? (qh << 8 & 0x700) : (qh << 4 & 0x700);
      const bool negative = (qh & (l % 2 == 0 ? 0x08 : 0x80)) != 0;
      put_iq1(values, b.qs[4 * ib + l] | high, negative, out.q + 32 * ib + 8 * l);
    }
  }
}

void dequantize_iq(GgmlType type, const void* src, float* dst, int64_t n) {
  const IqUnpackFn unpack = iq_unpack_fn(type);
  const float unit = iq_unit(type);
  const size_t size = type_info(type).type_size;
  IqBlock b;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    unpack(static_cast<const uint8_t*>(src) + i * size, b);
    float* y = dst + i * kQK_K;
    for (int g = 0; g < 16; ++g) {
      const float dl = b.d * (static_cast<float>(b.ls[g]) * unit);
      for (int j = 16 * g; j < 16 * g + 16; ++j) y[j] = dl * static_cast<float>(b.q[j]);
    }
  }
}

float vec_dot_iq(GgmlType type, int64_t n, const void* weight, const void* activation) {
  const IqUnpackFn unpack = iq_unpack_fn(type);
  const size_t size = type_info(type).type_size;
  IqBlock b;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    unpack(static_cast<const uint8_t*>(weight) + i * size, b);
    const auto a = load_block<BlockQ8_K>(activation, i);
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) s += b.q[j] * a.qs[j];
      isum += b.ls[g] * s;
    }
    sum += b.d * a.d * static_cast<float>(isum);
  }
  return sum * iq_unit(type);
}

}  // namespace

bool is_iq_grid_type(GgmlType type) { return iq_unpack_fn(type) != nullptr; }

IqUnpackFn iq_unpack_fn(GgmlType type) {
  switch (type) {
    case GgmlType::IQ1_S:
      return unpack_iq1_s;
    case GgmlType::IQ1_M:
      return unpack_iq1_m;
    case GgmlType::IQ2_XXS:
      return unpack_iq2_xxs;
    case GgmlType::IQ2_XS:
      return unpack_iq2_xs;
    case GgmlType::IQ2_S:
      return unpack_iq2_s;
    case GgmlType::IQ3_XXS:
      return unpack_iq3_xxs;
    case GgmlType::IQ3_S:
      return unpack_iq3_s;
    default:
      return nullptr;
  }
}

float iq_unit(GgmlType type) {
  switch (type) {
    case GgmlType::IQ3_XXS:
      return 0.25f;
    case GgmlType::IQ3_S:
      return 1.0f;
    default:
      return 0.125f;
  }
}

namespace ref_detail {

void dequantize_iq1_s(const void* src, float* dst, int64_t n) { dequantize_iq(GgmlType::IQ1_S, src, dst, n); }
float vec_dot_iq1_s(int64_t n, const void* w, const void* a) { return vec_dot_iq(GgmlType::IQ1_S, n, w, a); }
void dequantize_iq1_m(const void* src, float* dst, int64_t n) { dequantize_iq(GgmlType::IQ1_M, src, dst, n); }
float vec_dot_iq1_m(int64_t n, const void* w, const void* a) { return vec_dot_iq(GgmlType::IQ1_M, n, w, a); }
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) { dequantize_iq(GgmlType::IQ2_XXS, src, dst, n); }
float vec_dot_iq2_xxs(int64_t n, const void* w, const void* a) { return vec_dot_iq(GgmlType::IQ2_XXS, n, w, a); }
void dequantize_iq2_xs(const void* src, float* dst, int64_t n) { dequantize_iq(GgmlType::IQ2_XS, src, dst, n); }
float vec_dot_iq2_xs(int64_t n, const void* w, const void* a) { return vec_dot_iq(GgmlType::IQ2_XS, n, w, a); }
void dequantize_iq2_s(const void* src, float* dst, int64_t n) { dequantize_iq(GgmlType::IQ2_S, src, dst, n); }
float vec_dot_iq2_s(int64_t n, const void* w, const void* a) { return vec_dot_iq(GgmlType::IQ2_S, n, w, a); }
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) { dequantize_iq(GgmlType::IQ3_XXS, src, dst, n); }
float vec_dot_iq3_xxs(int64_t n, const void* w, const void* a) { return vec_dot_iq(GgmlType::IQ3_XXS, n, w, a); }
void dequantize_iq3_s(const void* src, float* dst, int64_t n) { dequantize_iq(GgmlType::IQ3_S, src, dst, n); }
float vec_dot_iq3_s(int64_t n, const void* w, const void* a) { return vec_dot_iq(GgmlType::IQ3_S, n, w, a); }

}  // namespace ref_detail
}  // namespace hetmoe::quant
