// fp16 / bf16 conversions (quant/half.h) against an independent oracle: the nearest representable value found
// by searching the sorted list of all finite halves, with ties to the even encoding.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "quant/half.h"

namespace hetmoe::quant {
namespace {

// A small-float format as (mantissa bits, exponent bias, largest finite encoding, infinity encoding).
struct HalfFormat {
  int mant_bits;
  int bias;
  uint16_t max_finite;
  uint16_t inf;
};

constexpr HalfFormat kFp16{10, 15, 0x7bff, 0x7c00};
constexpr HalfFormat kBf16{7, 127, 0x7f7f, 0x7f80};

// The value of a non-negative finite encoding, computed in double from the IEEE definition.
double decode(const HalfFormat& f, uint16_t h) {
  const int exp = h >> f.mant_bits;
  const int mant = h & ((1 << f.mant_bits) - 1);
  if (exp == 0) return std::ldexp(static_cast<double>(mant), 1 - f.bias - f.mant_bits);
  return std::ldexp(static_cast<double>(mant + (1 << f.mant_bits)), exp - f.bias - f.mant_bits);
}

// IEEE round-to-nearest-even of a non-NaN float: round with an unbounded exponent, and overflow to infinity
// when the result is the first power of two past the largest finite value (whose encoding is inf's).
uint16_t oracle(const HalfFormat& f, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  auto value = [&](uint16_t h) {
    return h <= f.max_finite ? decode(f, h) : std::ldexp(1.0, (f.inf >> f.mant_bits) - f.bias);
  };
  if (a >= value(f.inf)) return sign | f.inf;
  // Largest encoding whose value is <= a; encodings of non-negative values increase with their value.
  uint16_t lo = 0;
  uint16_t hi = f.inf;
  while (hi - lo > 1) {
    const auto mid = static_cast<uint16_t>((lo + hi) / 2);
    if (value(mid) <= a) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const double below = a - value(lo);
  const double above = value(hi) - a;
  if (below < above || (below == above && (lo & 1) == 0)) return sign | lo;
  return sign | hi;
}

bool is_nan16(const HalfFormat& f, uint16_t h) { return (h & 0x7fff) > f.inf; }

// Floats that sit on rounding decisions of fp16: ties between neighbours, the subnormal range, its lower end,
// the overflow threshold, and the specials.
std::vector<float> fp16_edge_cases() {
  std::vector<float> v = {
      0.0f,
      -0.0f,
      1.0f,
      -1.0f,
      1.0f + 0x1p-11f,             // tie between 1 and 1 + 2^-10: to even (1)
      1.0f + 3 * 0x1p-11f,         // tie between 1 + 2^-10 and 1 + 2^-9: to even (up)
      1.0f + 0x1p-11f + 0x1p-23f,  // just above a tie: up
      0x1p-24f,                    // smallest subnormal half
      0x1p-25f,                    // tie between 0 and 2^-24: to even (0)
      0x1p-25f + 0x1p-40f,         // just above: 2^-24
      3 * 0x1p-25f,                // tie between 2^-24 and 2^-23: to even (2^-23)
      0x1p-14f,                    // smallest normal half
      0x1p-14f - 0x1p-25f,         // tie at the top of the subnormals
      0x1.ffcp-15f,
      0x1p-26f,
      0x1p-126f,
      0x1p-149f,  // float subnormals flush to zero in fp16
      65504.0f,
      65519.99f,
      65520.0f,
      65536.0f,
      1e10f,
      -65520.0f,
      std::numeric_limits<float>::max(),
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      2049.0f,
      2051.0f,
      4097.0f,
      0.1f,
      -0.3f,
      3.14159265f,
  };
  return v;
}

TEST(Fp16, DecodesEveryHalfAsIeeeDefines) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const uint16_t magnitude = h & 0x7fff;
    if (magnitude > kFp16.inf) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
    } else if (magnitude == kFp16.inf) {
      EXPECT_TRUE(std::isinf(f)) << std::hex << h;
    } else {
      const double expected = (h & 0x8000 ? -1.0 : 1.0) * decode(kFp16, magnitude);
      EXPECT_EQ(static_cast<double>(f), expected) << std::hex << h;
    }
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
  }
}

TEST(Fp16, EveryHalfSurvivesARoundTrip) {
  int mismatches = 0;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t back = fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h)));
    if (is_nan16(kFp16, static_cast<uint16_t>(h))) {
      // NaNs come back quiet (bit 9 set) with their sign; the payload is not kept in the other bits.
      EXPECT_TRUE(is_nan16(kFp16, back)) << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else if (back != h) {
      ++mismatches;
      ADD_FAILURE() << "half 0x" << std::hex << h << " came back as 0x" << back;
      if (mismatches > 10) return;
    }
  }
}

TEST(Fp16, RoundsToNearestEvenAtTheEdges) {
  for (float x : fp16_edge_cases()) {
    for (float s : {x, -x}) {
      EXPECT_EQ(fp32_to_fp16(s), oracle(kFp16, s)) << "x = " << std::hexfloat << s;
    }
  }
  // A few answers spelled out, in case the oracle and the conversion share a mistake.
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_TRUE(is_nan16(kFp16, fp32_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_nan16(kFp16, fp32_to_fp16(-std::numeric_limits<float>::signaling_NaN())));
}

TEST(Fp16, RoundsRandomFloatsToNearestEven) {
  std::mt19937 rng(1234);
  // Exponents spread over the half range and a little beyond, so overflow and underflow are both hit.
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-28, 17);
  int failures = 0;
  for (int i = 0; i < 200000 && failures < 10; ++i) {
    float x = std::ldexp(mantissa(rng), exponent(rng));
    if (i % 2) x = -x;
    if (fp32_to_fp16(x) != oracle(kFp16, x)) {
      ++failures;
      ADD_FAILURE() << "x = " << std::hexfloat << x << " gave 0x" << std::hex << fp32_to_fp16(x) << ", expected 0x"
                    << oracle(kFp16, x);
    }
  }
}

TEST(Bf16, EveryBf16SurvivesARoundTrip) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    const uint16_t back = fp32_to_bf16(f);
    if (is_nan16(kBf16, static_cast<uint16_t>(h))) {
      EXPECT_TRUE(is_nan16(kBf16, back)) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  std::vector<float> cases = {
      1.0f + 0x1p-8f,             // tie: to even (1)
      1.0f + 3 * 0x1p-8f,         // tie: up to even
      1.0f + 0x1p-8f + 0x1p-23f,  // above the tie: up
      0x1p-133f,
      0x1p-149f,                          // float subnormals are kept, rounded like any other value
      std::numeric_limits<float>::max(),  // rounds past the largest bf16: infinity
      0x1.fep127f,
      0x1.fdp127f,
      std::numeric_limits<float>::infinity(),
      0.0f,
      -0.0f,
      0.1f,
      1e-30f,
      3e38f,
  };
  std::mt19937 rng(99);
  for (int i = 0; i < 100000; ++i) {
    const auto bits = static_cast<uint32_t>(rng());
    const float x = std::bit_cast<float>(bits);
    if (!std::isnan(x)) cases.push_back(x);
  }
  int failures = 0;
  for (float x : cases) {
    if (fp32_to_bf16(x) != oracle(kBf16, x) && ++failures <= 10)
      ADD_FAILURE() << "x = " << std::hexfloat << x << " gave 0x" << std::hex << fp32_to_bf16(x);
  }
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(is_nan16(kBf16, fp32_to_bf16(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace hetmoe::quant
