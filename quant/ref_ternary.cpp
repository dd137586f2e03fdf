// The ternary formats TQ1_0 and TQ2_0: values -1, 0, 1 times one fp16 scale (the block's absolute maximum) per 256.
// Layouts in quant/blocks.h. Quantization, dequantization and the dot with Q8_K follow ggml's reference code; value i
// of a block pairs with activation i of its Q8_K block in both formats.

#include <algorithm>
#include <cmath>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
constexpr int kQs1 = sizeof(BlockTQ1_0::qs), kQh1 = sizeof(BlockTQ1_0::qh);

// Trit n (0 = the most significant) of a TQ1_0 byte, as ggml reads it: the integer part of 3 * frac(byte * 3^n / 256).
int trit(uint8_t byte, int n) {
  const auto q = static_cast<uint8_t>(byte * kPow3[n]);
  return (static_cast<uint16_t>(q) * 3) >> 8;
}

// Calls f(value index, code 0..2) for the 256 values of a TQ1_0 block, in the order of the values.
template <typename F>
void tq1_codes(const BlockTQ1_0& b, F f) {
  const int split = kQs1 - kQs1 % 32;  // 32 bytes in one run, then 16
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) f(n * 32 + m, trit(b.qs[m], n));
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < kQs1 - split; ++m) f(5 * split + n * 16 + m, trit(b.qs[split + m], n));
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < kQh1; ++j) f(5 * kQs1 + n * kQh1 + j, trit(b.qh[j], n));
}

// -1, 0, 1 -> 0, 1, 2 for x / d rounded half away from zero, as lroundf.
int ternary(float x, float id) { return static_cast<int>(std::lround(x * id)) + 1; }

// The 5 (or 4, shifted up one trit) codes as a base-3 fraction of 256, rounded up.
uint8_t pack_trits(const float* x, int stride, int count, float id) {
  uint8_t q = 0;
  for (int n = 0; n < count; ++n) q = static_cast<uint8_t>(q * 3 + ternary(x[n * stride], id));
  if (count == 4) q = static_cast<uint8_t>(q * 3);
  return static_cast<uint8_t>((static_cast<uint16_t>(q) * 256 + (243 - 1)) / 243);
}

// The block's scale as stored (its absolute maximum in fp16), with the inverse of the unrounded one in `id`.
uint16_t ternary_scale(const float* x, float* id) {
  float amax = 0.0f;
  for (int j = 0; j < kQK_K; ++j) amax = std::max(amax, std::fabs(x[j]));
  *id = amax != 0.0f ? 1.0f / amax : 0.0f;
  return fp32_to_fp16(amax);
}

}  // namespace

void dequantize_tq1_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockTQ1_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    float* y = dst + i * kQK_K;
    tq1_codes(b, [&](int v, int code) { y[v] = static_cast<float>(code - 1) * d; });
  }
}

void dequantize_tq2_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockTQ2_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    float* y = dst + i * kQK_K;
    for (int c = 0; c < 2; ++c)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m)
          y[128 * c + 32 * l + m] = static_cast<float>(((b.qs[32 * c + m] >> (2 * l)) & 3) - 1) * d;
  }
}

void quantize_tq1_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockTQ1_0 b{};
    float id = 0.0f;
    b.d = ternary_scale(x, &id);
    const int split = kQs1 - kQs1 % 32;
    for (int m = 0; m < 32; ++m) b.qs[m] = pack_trits(x + m, 32, 5, id);
    for (int m = 0; m < kQs1 - split; ++m) b.qs[split + m] = pack_trits(x + 5 * split + m, 16, 5, id);
    for (int j = 0; j < kQh1; ++j) b.qh[j] = pack_trits(x + 5 * kQs1 + j, kQh1, 4, id);
    store_block(dst, i, b);
  }
}

void quantize_tq2_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockTQ2_0 b{};
    float id = 0.0f;
    b.d = ternary_scale(x, &id);
    for (int c = 0; c < 2; ++c)
      for (int m = 0; m < 32; ++m) {
        int q = 0;
        for (int l = 0; l < 4; ++l) q += (ternary(x[128 * c + 32 * l + m], id) & 3) << (2 * l);
        b.qs[32 * c + m] = static_cast<uint8_t>(q);
      }
    store_block(dst, i, b);
  }
}

float vec_dot_tq1_0(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto w = load_block<BlockTQ1_0>(weight, i);
    const auto a = load_block<BlockQ8_K>(activation, i);
    int sumi = 0;
    tq1_codes(w, [&](int v, int code) { sumi += (code - 1) * a.qs[v]; });
    sum += static_cast<float>(sumi) * (fp16_to_fp32(w.d) * a.d);
  }
  return sum;
}

float vec_dot_tq2_0(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto w = load_block<BlockTQ2_0>(weight, i);
    const auto a = load_block<BlockQ8_K>(activation, i);
    int sumi = 0;
    for (int c = 0; c < 2; ++c)
      for (int l = 0; l < 4; ++l)
        for (int m = 0; m < 32; ++m) sumi += a.qs[128 * c + 32 * l + m] * (((w.qs[32 * c + m] >> (2 * l)) & 3) - 1);
    sum += static_cast<float>(sumi) * (a.d * fp16_to_fp32(w.d));
  }
  return sum;
}

}  // namespace hetmoe::quant::ref_detail
