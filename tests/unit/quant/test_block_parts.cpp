// quant/block_parts.h, the eight-value parts the CUDA matmul kernels decode, against quant/ref's dequantization of
// the same rows: every part of every block of each format.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/block_parts.h"
#include "quant/ref.h"

namespace hetmoe::quant {
namespace {

template <GgmlType kType>
void check_parts(int64_t n, uint64_t seed) {
  using Parts = BlockParts<kType>;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> src(n);
  for (float& v : src) v = dist(rng);
  src[3] = 0.0f;  // a zero and an outlier in the first block
  src[5] = 9.0f;
  std::vector<uint8_t> row(row_bytes(kType, n));
  quantize_row(kType, src.data(), row.data(), n);
  std::vector<float> want(n);
  dequantize_row(kType, row.data(), want.data(), n);
  static_assert(Parts::kValues % 8 == 0);
  for (int64_t b = 0; b < n / Parts::kValues; ++b)
    for (int p = 0; p < Parts::kValues / 8; ++p) {
      float got[8];
      Parts::part(row.data() + b * Parts::kBytes, p, got);
      for (int i = 0; i < 8; ++i) {
        const float w = want[b * Parts::kValues + 8 * p + i];
        ASSERT_NEAR(got[i], w, 1e-6f * std::abs(w)) << type_info(kType).name << " block " << b << " part " << p;
      }
    }
}

TEST(BlockParts, EveryPartAgreesWithTheReference) {
  check_parts<GgmlType::F32>(64, 1);
  check_parts<GgmlType::F16>(64, 2);
  check_parts<GgmlType::Q8_0>(128, 3);
  check_parts<GgmlType::Q5_0>(128, 4);
  check_parts<GgmlType::Q4_K>(512, 5);
  check_parts<GgmlType::Q6_K>(512, 6);
}

}  // namespace
}  // namespace hetmoe::quant
