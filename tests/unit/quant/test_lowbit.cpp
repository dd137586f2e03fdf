// hetmoe's low-bit split formats HQ<b>_G<group> (quant/lowbit.h): the documented byte layout, the fit against a
// plain min/max quantizer, dequantization and the dot product.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "quant/half.h"
#include "quant/lowbit.h"
#include "quant/ref.h"

namespace hetmoe::quant {
namespace {

const GgmlType kHqTypes[] = {GgmlType::HQ2_G64,  GgmlType::HQ2_G128, GgmlType::HQ3_G64,
                             GgmlType::HQ3_G128, GgmlType::HQ4_G64,  GgmlType::HQ4_G128};

std::vector<float> normal_row(int64_t n, uint64_t seed, float scale = 0.02f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

uint32_t word_at(const std::vector<uint8_t>& row, size_t offset) {
  return row[offset] | row[offset + 1] << 8 | row[offset + 2] << 16 | static_cast<uint32_t>(row[offset + 3]) << 24;
}

TEST(LowBit, TypesNamesAndRowSizes) {
  for (GgmlType t : kHqTypes) {
    const auto f = lowbit_format(t);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(lowbit_type(*f), t);
    EXPECT_EQ(type_from_name(type_info(t).name), t);
    EXPECT_EQ(type_info(t).vec_dot_type, GgmlType::F32);
    for (int64_t groups : {1, 11, 22}) {
      const int64_t n = groups * f->group;
      EXPECT_EQ(row_bytes(t, n), static_cast<size_t>(n * f->bits / 8 + 4 * groups)) << type_info(t).name;
    }
  }
  EXPECT_FALSE(lowbit_format(GgmlType::Q4_K).has_value());
  EXPECT_FALSE(lowbit_type({.bits = 5, .group = 64}).has_value());
  EXPECT_FALSE(lowbit_type({.bits = 2, .group = 32}).has_value());
}

// Values that lie exactly on levels d q + m (d and m exact in fp16) come back as exactly those codes, d and m, in
// the documented places: the codes as words of 32-value units, then the scales, then the offsets.
TEST(LowBit, LayoutOfExactLevels) {
  for (GgmlType t : kHqTypes) {
    const LowBitFormat f = *lowbit_format(t);
    const int levels = (1 << f.bits) - 1;
    const int64_t groups = 3, n = groups * f.group;
    std::vector<int> codes(n);
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = i / f.group;
      // Every level appears in every group (so the fit is pinned), in an order that differs per group.
      codes[i] = static_cast<int>((i * 7 + g * 3) % (levels + 1));
      x[i] = 0.25f * static_cast<float>(g + 1) * codes[i] - 0.5f * static_cast<float>(g);
    }
    std::vector<uint8_t> row(row_bytes(t, n));
    quantize_row(t, x.data(), row.data(), n);
    const size_t scales = static_cast<size_t>(n) * f.bits / 8, offsets = scales + 2 * groups;
    for (int64_t g = 0; g < groups; ++g) {
      EXPECT_EQ(fp16_to_fp32(static_cast<uint16_t>(row[scales + 2 * g] | row[scales + 2 * g + 1] << 8)),
                0.25f * static_cast<float>(g + 1))
          << type_info(t).name << " group " << g;
      EXPECT_EQ(fp16_to_fp32(static_cast<uint16_t>(row[offsets + 2 * g] | row[offsets + 2 * g + 1] << 8)),
                -0.5f * static_cast<float>(g))
          << type_info(t).name << " group " << g;
    }
    for (int64_t i = 0; i < n; ++i) {
      const size_t unit = static_cast<size_t>(i / 32) * f.bits * 4;
      const int j = static_cast<int>(i % 32);
      int got = 0;
      if (f.bits == 4) {
        got = word_at(row, unit + 4 * (j / 8)) >> (4 * (j % 8)) & 15;
      } else {
        got = word_at(row, unit + 4 * (j / 16)) >> (2 * (j % 16)) & 3;
        if (f.bits == 3) got |= (word_at(row, unit + 8) >> j & 1) << 2;
      }
      ASSERT_EQ(got, codes[i]) << type_info(t).name << " value " << i;
    }
    std::vector<float> back(n);
    dequantize_row(t, row.data(), back.data(), n);
    EXPECT_EQ(back, x) << type_info(t).name;
  }
}

// The least-squares fit never loses to quantizing each group over its plain [min, max] range, the error shrinks
// with every bit, and a constant group comes back exactly.
TEST(LowBit, FitBeatsMinMaxAndImprovesWithBits) {
  const int64_t n = 1408;  // DeepSeek-V2-Lite's expert width: 22 groups of 64, 11 of 128
  const std::vector<float> x = normal_row(n, 7);
  double norm = 0;
  for (float v : x) norm += static_cast<double>(v) * v;
  for (int group : {64, 128}) {
    double previous = INFINITY;
    for (int bits : {2, 3, 4}) {
      const GgmlType t = *lowbit_type({.bits = bits, .group = group});
      std::vector<uint8_t> row(row_bytes(t, n));
      quantize_row(t, x.data(), row.data(), n);
      std::vector<float> back(n);
      dequantize_row(t, row.data(), back.data(), n);
      double err = 0, naive = 0;
      const int levels = (1 << bits) - 1;
      for (int64_t g = 0; g < n / group; ++g) {
        const auto [lo, hi] = std::minmax_element(x.begin() + g * group, x.begin() + (g + 1) * group);
        const float m = fp16_to_fp32(fp32_to_fp16(*lo)), d = fp16_to_fp32(fp32_to_fp16((*hi - *lo) / levels));
        for (int64_t i = g * group; i < (g + 1) * group; ++i) {
          const float q = std::clamp(std::round((x[i] - m) / d), 0.0f, static_cast<float>(levels));
          naive += std::pow(static_cast<double>(d * q + m - x[i]), 2);
          err += std::pow(static_cast<double>(back[i] - x[i]), 2);
        }
      }
      const double rel = std::sqrt(err / norm);
      EXPECT_LE(err, naive) << type_info(t).name;
      EXPECT_LT(rel, previous) << type_info(t).name;
      EXPECT_LT(rel, bits == 2 ? 0.40 : bits == 3 ? 0.20 : 0.10) << type_info(t).name;
      previous = rel;
    }
  }
  for (GgmlType t : kHqTypes) {
    const int64_t n2 = 256;
    const std::vector<float> same(n2, 0.375f), zero(n2, 0.0f);
    for (const std::vector<float>* v : {&same, &zero}) {
      std::vector<uint8_t> row(row_bytes(t, n2));
      quantize_row(t, v->data(), row.data(), n2);
      std::vector<float> back(n2, -1.0f);
      dequantize_row(t, row.data(), back.data(), n2);
      EXPECT_EQ(back, *v) << type_info(t).name;
    }
  }
}

TEST(LowBit, DotEqualsDotOfTheDequantizedRow) {
  const int64_t n = 2048;
  const std::vector<float> w = normal_row(n, 11), a = normal_row(n, 12, 1.0f);
  for (GgmlType t : kHqTypes) {
    std::vector<uint8_t> row(row_bytes(t, n));
    quantize_row(t, w.data(), row.data(), n);
    std::vector<float> back(n);
    dequantize_row(t, row.data(), back.data(), n);
    double want = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      want += static_cast<double>(back[i]) * a[i];
      scale += std::abs(static_cast<double>(back[i]) * a[i]);
    }
    EXPECT_NEAR(vec_dot(t, n, row.data(), a.data()), want, 1e-5 * scale) << type_info(t).name;
  }
}

// The eight-code reads of the CUDA kernels give the codes lowbit_code reads, for every part of random units.
template <int kBits>
void check_codes8(uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    uint32_t unit[kBits];
    for (uint32_t& w : unit) w = static_cast<uint32_t>(rng());
    for (int part = 0; part < 4; ++part) {
      int q[8];
      lowbit_codes8<kBits>(unit, part, q);
      for (int i = 0; i < 8; ++i)
        ASSERT_EQ(q[i], lowbit_code<kBits>(unit, 8 * part + i)) << kBits << " bits, part " << part;
    }
  }
}

TEST(LowBit, EightCodesAtATime) {
  check_codes8<2>(1);
  check_codes8<3>(2);
  check_codes8<4>(3);
}

}  // namespace
}  // namespace hetmoe::quant
