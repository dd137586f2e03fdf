// The low-bit split formats HQ<b>_G<group> (quant/lowbit.h): the reference quantizer (quant/lowbit_fit.h with its
// scalar pass), unpacking, dequantization and the dot product with F32 activations.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/half.h"
#include "quant/lowbit.h"
#include "quant/lowbit_fit.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant {

std::optional<LowBitFormat> lowbit_format(GgmlType type) {
  const uint32_t id = static_cast<uint32_t>(type);
  if (id < 1000 || !type_info(id)) return std::nullopt;
  return LowBitFormat{.bits = static_cast<int>((id - 1000) / 10), .group = (id % 10) ? 128 : 64};
}

std::optional<GgmlType> lowbit_type(LowBitFormat format) {
  if (format.bits < 2 || format.bits > 4 || (format.group != 64 && format.group != 128)) return std::nullopt;
  return static_cast<GgmlType>(1000 + 10 * format.bits + (format.group == 128));
}

namespace ref_detail {
namespace {

constexpr int kUnit = kLowBitUnit;

template <int kBits>
void unpack_unit(const uint32_t* words, uint8_t* q) {
  for (int j = 0; j < kUnit; ++j) q[j] = static_cast<uint8_t>(lowbit_code<kBits>(words, j));
}

// Where the parts of a row of n values start.
template <int kBits, int kGroup>
void quantize_hq(const float* src, void* dst, int64_t n) {
  lowbit_fit::quantize_row<kBits, kGroup, 1>(
      src, dst, n,
      [](const float* x, int, uint8_t(&q)[1][kGroup], uint16_t(&d)[1], uint16_t(&m)[1]) {
        lowbit_fit::fit_group(x, kGroup, (1 << kBits) - 1, q[0], d[0], m[0]);
      },
      lowbit_fit::pack_unit<kBits>);
}

// Calls f(group, d, m, codes of the group) for each group of a row.
template <int kBits, int kGroup, typename F>
void for_each_group(const void* src, int64_t n, F f) {
  const auto* in = static_cast<const uint8_t*>(src);
  const LowBitRowParts parts = lowbit_row_parts(kBits, kGroup, n);
  uint8_t q[kGroup];
  for (int64_t g = 0; g < n / kGroup; ++g) {
    for (int u = 0; u < kGroup / kUnit; ++u) {
      uint32_t words[kBits];
      const int64_t unit = g * (kGroup / kUnit) + u;
      for (int k = 0; k < kBits; ++k) words[k] = load_u32_le(in + parts.codes + (unit * kBits + k) * 4);
      unpack_unit<kBits>(words, q + u * kUnit);
    }
    f(g, fp16_to_fp32(load_u16_le(in + parts.scales + 2 * g)), fp16_to_fp32(load_u16_le(in + parts.offsets + 2 * g)),
      q);
  }
}

template <int kBits, int kGroup>
void dequantize_hq(const void* src, float* dst, int64_t n) {
  for_each_group<kBits, kGroup>(src, n, [&](int64_t g, float d, float m, const uint8_t* q) {
    for (int i = 0; i < kGroup; ++i) dst[g * kGroup + i] = d * q[i] + m;
  });
}

// Per group d * sum(q x) + m * sum(x), in F32 as a GPU kernel would sum it.
template <int kBits, int kGroup>
float vec_dot_hq(int64_t n, const void* weight, const void* activation) {
  const auto* x = static_cast<const float*>(activation);
  float sum = 0;
  for_each_group<kBits, kGroup>(weight, n, [&](int64_t g, float d, float m, const uint8_t* q) {
    float sq = 0, sx = 0;
    for (int i = 0; i < kGroup; ++i) {
      sq += q[i] * x[g * kGroup + i];
      sx += x[g * kGroup + i];
    }
    sum += d * sq + m * sx;
  });
  return sum;
}

}  // namespace

void dequantize_hq2_g64(const void* src, float* dst, int64_t n) { dequantize_hq<2, 64>(src, dst, n); }
void dequantize_hq2_g128(const void* src, float* dst, int64_t n) { dequantize_hq<2, 128>(src, dst, n); }
void dequantize_hq3_g64(const void* src, float* dst, int64_t n) { dequantize_hq<3, 64>(src, dst, n); }
void dequantize_hq3_g128(const void* src, float* dst, int64_t n) { dequantize_hq<3, 128>(src, dst, n); }
void dequantize_hq4_g64(const void* src, float* dst, int64_t n) { dequantize_hq<4, 64>(src, dst, n); }
void dequantize_hq4_g128(const void* src, float* dst, int64_t n) { dequantize_hq<4, 128>(src, dst, n); }
void quantize_hq2_g64(const float* src, void* dst, int64_t n) { quantize_hq<2, 64>(src, dst, n); }
void quantize_hq2_g128(const float* src, void* dst, int64_t n) { quantize_hq<2, 128>(src, dst, n); }
void quantize_hq3_g64(const float* src, void* dst, int64_t n) { quantize_hq<3, 64>(src, dst, n); }
void quantize_hq3_g128(const float* src, void* dst, int64_t n) { quantize_hq<3, 128>(src, dst, n); }
void quantize_hq4_g64(const float* src, void* dst, int64_t n) { quantize_hq<4, 64>(src, dst, n); }
void quantize_hq4_g128(const float* src, void* dst, int64_t n) { quantize_hq<4, 128>(src, dst, n); }
float vec_dot_hq2_g64(int64_t n, const void* w, const void* a) { return vec_dot_hq<2, 64>(n, w, a); }
float vec_dot_hq2_g128(int64_t n, const void* w, const void* a) { return vec_dot_hq<2, 128>(n, w, a); }
float vec_dot_hq3_g64(int64_t n, const void* w, const void* a) { return vec_dot_hq<3, 64>(n, w, a); }
float vec_dot_hq3_g128(int64_t n, const void* w, const void* a) { return vec_dot_hq<3, 128>(n, w, a); }
float vec_dot_hq4_g64(int64_t n, const void* w, const void* a) { return vec_dot_hq<4, 64>(n, w, a); }
float vec_dot_hq4_g128(int64_t n, const void* w, const void* a) { return vec_dot_hq<4, 128>(n, w, a); }

}  // namespace ref_detail
}  // namespace hetmoe::quant
