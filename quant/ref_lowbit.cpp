// The low-bit split formats HQ<b>_G<group> (quant/lowbit.h): bit packing, a quantizer that fits each group's
// scale and offset by least squares, dequantization and the dot product with F32 activations.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quant/half.h"
#include "quant/lowbit.h"
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

// The codes of 32 values from / to their `bits` words (quant/lowbit.h).
template <int kBits>
void pack_unit(const uint8_t* q, uint32_t* words) {
  std::memset(words, 0, kBits * sizeof(uint32_t));
  for (int j = 0; j < kUnit; ++j) {
    if constexpr (kBits == 4) {
      words[j / 8] |= static_cast<uint32_t>(q[j]) << (4 * (j % 8));
    } else {
      words[j / 16] |= static_cast<uint32_t>(q[j] & 3) << (2 * (j % 16));
      if constexpr (kBits == 3) words[2] |= static_cast<uint32_t>(q[j] >> 2) << j;
    }
  }
}

template <int kBits>
void unpack_unit(const uint32_t* words, uint8_t* q) {
  for (int j = 0; j < kUnit; ++j) q[j] = static_cast<uint8_t>(lowbit_code<kBits>(words, j));
}

// Where the parts of a row of n values start.
struct RowParts {
  size_t codes = 0, scales, offsets;
  RowParts(int bits, int group, int64_t n)
      : scales(static_cast<size_t>(n) * bits / 8), offsets(scales + static_cast<size_t>(n / group) * 2) {}
};

// Words are stored little-endian; the copies keep unaligned rows legal.
uint32_t load_word(const uint8_t* p) { return load_u32_le(p); }
uint16_t load_half(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
void store_half(uint8_t* p, uint16_t h) {
  p[0] = static_cast<uint8_t>(h);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// q = the nearest level of (x - m) / d, clamped to [0, levels].
uint8_t level_of(float x, float d, float m, int levels) {
  if (!(d > 0)) return 0;
  const float v = (x - m) / d;
  if (!(v > 0)) return 0;  // also NaN
  if (v >= static_cast<float>(levels)) return static_cast<uint8_t>(levels);
  return static_cast<uint8_t>(nearest_int(v));
}

double group_error(const float* x, const uint8_t* q, int n, float d, float m) {
  double e = 0;
  for (int i = 0; i < n; ++i) {
    const double r = static_cast<double>(d) * q[i] + m - x[i];
    e += r * r;
  }
  return e;
}

// One group's d and m: from the full range and from a range shrunk by 5% at both ends, alternate assigning levels
// and solving the least-squares (d, m) for those levels. Every candidate (d, m), the starting ones included, is
// judged as stored: rounded to fp16, with its levels assigned again; the best is kept, so the fit is never worse
// than quantizing over the plain [min, max] range.
void fit_group(const float* x, int n, int levels, uint8_t* q, uint16_t& d16, uint16_t& m16) {
  const auto [lo_it, hi_it] = std::minmax_element(x, x + n);
  const float lo = *lo_it, hi = *hi_it;
  std::vector<uint8_t> trial(n);
  double best = INFINITY;
  auto consider = [&](float d, float m) {
    const uint16_t dh = fp32_to_fp16(std::max(d, 0.0f)), mh = fp32_to_fp16(m);
    const float ds = fp16_to_fp32(dh), ms = fp16_to_fp32(mh);
    for (int i = 0; i < n; ++i) trial[i] = level_of(x[i], ds, ms, levels);
    const double e = group_error(x, trial.data(), n, ds, ms);
    if (e < best) {
      best = e;
      std::copy(trial.begin(), trial.end(), q);
      d16 = dh;
      m16 = mh;
    }
  };
  for (const float shrink : {0.0f, 0.05f}) {
    float m = lo + shrink * (hi - lo);
    float d = (hi - lo) * (1 - 2 * shrink) / levels;
    consider(d, m);
    for (int iter = 0; iter < 4 && d > 0; ++iter) {
      for (int i = 0; i < n; ++i) trial[i] = level_of(x[i], d, m, levels);
      // Least squares of x ~ d q + m over the group.
      double sq = 0, sqq = 0, sx = 0, sqx = 0;
      for (int i = 0; i < n; ++i) {
        sq += trial[i];
        sqq += static_cast<double>(trial[i]) * trial[i];
        sx += x[i];
        sqx += static_cast<double>(trial[i]) * x[i];
      }
      const double det = n * sqq - sq * sq;
      if (det <= 0) break;  // every value on one level: keep d and m
      d = static_cast<float>((n * sqx - sq * sx) / det);
      m = static_cast<float>((sx - d * sq) / n);
      consider(d, m);
    }
  }
}

template <int kBits, int kGroup>
void quantize_hq(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  const RowParts parts(kBits, kGroup, n);
  uint8_t q[kGroup];
  for (int64_t g = 0; g < n / kGroup; ++g) {
    uint16_t d = 0, m = 0;
    fit_group(src + g * kGroup, kGroup, (1 << kBits) - 1, q, d, m);
    store_half(out + parts.scales + 2 * g, d);
    store_half(out + parts.offsets + 2 * g, m);
    for (int u = 0; u < kGroup / kUnit; ++u) {
      uint32_t words[kBits];
      pack_unit<kBits>(q + u * kUnit, words);
      const int64_t unit = g * (kGroup / kUnit) + u;
      for (int k = 0; k < kBits; ++k) store_u32_le(out + parts.codes + (unit * kBits + k) * 4, words[k]);
    }
  }
}

// Calls f(group, d, m, codes of the group) for each group of a row.
template <int kBits, int kGroup, typename F>
void for_each_group(const void* src, int64_t n, F f) {
  const auto* in = static_cast<const uint8_t*>(src);
  const RowParts parts(kBits, kGroup, n);
  uint8_t q[kGroup];
  for (int64_t g = 0; g < n / kGroup; ++g) {
    for (int u = 0; u < kGroup / kUnit; ++u) {
      uint32_t words[kBits];
      const int64_t unit = g * (kGroup / kUnit) + u;
      for (int k = 0; k < kBits; ++k) words[k] = load_word(in + parts.codes + (unit * kBits + k) * 4);
      unpack_unit<kBits>(words, q + u * kUnit);
    }
    f(g, fp16_to_fp32(load_half(in + parts.scales + 2 * g)), fp16_to_fp32(load_half(in + parts.offsets + 2 * g)), q);
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
