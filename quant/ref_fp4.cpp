// MXFP4, the OCP microscaling 4-bit float format in which gpt-oss ships its experts: blocks of 32 E2M1 values under
// one E8M0 (power-of-two) scale. The codes index kMxfp4Values (E2M1 doubled); the scale is read back halved.
//
// Quantization as ggml's quantize_row_mxfp4_ref: the scale's exponent is floor(log2(amax)) - 2 (so amax lands in
// the top two codes' range), each value takes the code of the nearest level (the first of equal distances), and an
// all-zero block gets exponent 0.

#include <algorithm>
#include <cmath>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

constexpr int kBlock = kQK_MXFP4;

int nearest_level(float x, float d) {
  int best = 0;
  float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(kMxfp4Values[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

}  // namespace

void dequantize_mxfp4(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kBlock; ++i) {
    const auto b = load_block<BlockMXFP4>(src, i);
    const float d = e8m0_to_fp32_half(b.e);
    float* y = dst + i * kBlock;
    for (int j = 0; j < kBlock / 2; ++j) {
      y[j] = static_cast<float>(kMxfp4Values[b.qs[j] & 0x0f]) * d;
      y[j + kBlock / 2] = static_cast<float>(kMxfp4Values[b.qs[j] >> 4]) * d;
    }
  }
}

void quantize_mxfp4(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kBlock; ++i) {
    const float* x = src + i * kBlock;
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    BlockMXFP4 b{};
    // As ggml computes it in float, converted through int (the exponent of a tiny amax wraps as ggml's does).
    b.e = amax > 0.0f ? static_cast<uint8_t>(static_cast<int>(std::floor(std::log2(amax)) - 2 + 127)) : 0;
    const float d = e8m0_to_fp32_half(b.e);
    for (int j = 0; j < kBlock / 2; ++j)
      b.qs[j] = static_cast<uint8_t>(nearest_level(x[j], d) | nearest_level(x[j + kBlock / 2], d) << 4);
    store_block(dst, i, b);
  }
}

float vec_dot_mxfp4(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kBlock; ++i) {
    const auto w = load_block<BlockMXFP4>(weight, i);
    const auto a = load_block<BlockQ8_0>(activation, i);
    const float d = fp16_to_fp32(a.d) * e8m0_to_fp32_half(w.e);
    int low = 0, high = 0;
    for (int j = 0; j < kBlock / 2; ++j) {
      low += a.qs[j] * kMxfp4Values[w.qs[j] & 0x0f];
      high += a.qs[j + kBlock / 2] * kMxfp4Values[w.qs[j] >> 4];
    }
    sum += d * static_cast<float>(low + high);
  }
  return sum;
}

}  // namespace hetmoe::quant::ref_detail
