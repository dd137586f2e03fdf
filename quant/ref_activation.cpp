// The 8-bit activation formats as ggml-cpu's x86 build writes them before a quantized dot product (reference
// README 7.1 / 7.2). They differ from ggml's *_ref quantizers in small ways that change bytes: Q8_0 / Q8_1 use
// 127 / amax as the multiplier (not 1 / d) and round half to even (_mm256_round_ps), not half away from zero.

#include <algorithm>
#include <cmath>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

struct Q8Block {
  float d;  // amax / 127, before rounding to half
  int sum;  // sum of the codes
};

// Codes of one block of 32; the AVX2 code packs them with signed saturation, hence the clamp (finite input
// never needs it: |x| * 127 / amax rounds to at most 127).
Q8Block quantize_q8_block(const float* x, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.f;
  const float id = amax != 0.0f ? 127.f / amax : 0.0f;
  int sum = 0;
  for (int j = 0; j < kQK8_0; ++j) {
    const int q = std::clamp(nearest_int(x[j] * id), -128, 127);
    qs[j] = static_cast<int8_t>(q);
    sum += q;
  }
  return {d, sum};
}

}  // namespace

void quantize_activation_q8_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    BlockQ8_0 b{};
    const Q8Block r = quantize_q8_block(src + i * kQK8_0, b.qs);
    b.d = fp32_to_fp16(r.d);
    store_block(dst, i, b);
  }
}

// s carries d * sum(q) so a dot product with a weight's min costs one multiply per block; it is formed from the
// float d, before d is rounded to half, so it is not exactly half(d) * sum(q).
void quantize_activation_q8_1(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_1; ++i) {
    BlockQ8_1 b{};
    const Q8Block r = quantize_q8_block(src + i * kQK8_1, b.qs);
    b.d = fp32_to_fp16(r.d);
    b.s = fp32_to_fp16(r.d * static_cast<float>(r.sum));
    store_block(dst, i, b);
  }
}

// The scale is fixed by the signed element of largest magnitude (the first on ties), which maps to -127; d is
// then negative when that element is positive. It is ggml's quantize_row_q8_K_ref, which x86 uses as is.
void quantize_activation_q8_k(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    float max = 0;
    float amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    BlockQ8_K b{};
    if (amax != 0.0f) {
      const float iscale = -127.f / max;
      for (int j = 0; j < kQK_K; ++j) b.qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
      for (int g = 0; g < kQK_K / 16; ++g) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += b.qs[16 * g + j];
        b.bsums[g] = static_cast<int16_t>(sum);
      }
      b.d = 1 / iscale;
    }
    store_block(dst, i, b);
  }
}

}  // namespace hetmoe::quant::ref_detail
