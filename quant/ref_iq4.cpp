// The non-linear 4-bit formats: IQ4_NL (blocks of 32, fp16 scale) and IQ4_XS (super-blocks of 256, eight
// 6-bit block scales under one fp16 scale). Both index the same 16-entry table, kIq4NlValues.
//
// ggml_quantize_chunk runs quantize_iq4_nl / quantize_iq4_xs, i.e. quantize_row_iq4_nl_impl with ntry = 7 even
// without an importance matrix; the weights of the fit are then x^2. (Recent ggml's quantize_row_iq4_nl_ref
// passes ntry = -1 instead and writes other bytes; llama-quantize does not use it.)

#include <algorithm>
#include <cmath>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

constexpr int kBlock = 32;
constexpr int kNtry = 7;
constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS

// Index of the table level nearest to x (ties to the upper level), found by bisection as ggml's
// best_index_int8 does: the distances are compared after rounding, and that decides near-ties.
int best_index(float x) {
  constexpr int kLevels = 16;
  const int8_t* val = kIq4NlValues;
  if (x <= val[0]) return 0;
  if (x >= val[kLevels - 1]) return kLevels - 1;
  int ml = 0;
  int mu = kLevels - 1;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) {
      mu = mav;
    } else {
      ml = mav;
    }
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// Scale of one block of 32 (a signed float, unrounded), with its codes in levels: the x^2-weighted
// least-squares scale for the best of 2 * ntry + 1 trial grids around max / values[0].
float block_scale(const float* xb, uint8_t* levels) {
  float weight[kBlock];
  for (int j = 0; j < kBlock; ++j) weight[j] = xb[j] * xb[j];
  float amax = 0;
  float max = 0;
  for (int j = 0; j < kBlock; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + kBlock, uint8_t{0});
    return 0.0f;
  }
  const float v0 = static_cast<float>(kIq4NlValues[0]);
  float d = -max / v0;  // ntry > 0 flips the sign so the largest element lands near +127
  float id = 1 / d;
  float sumqx = 0;
  float sumq2 = 0;
  for (int j = 0; j < kBlock; ++j) {
    const int l = best_index(id * xb[j]);
    levels[j] = static_cast<uint8_t>(l);
    const float q = kIq4NlValues[l];
    sumqx += weight[j] * q * xb[j];
    sumq2 += weight[j] * q * q;
  }
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int itry = -kNtry; itry <= kNtry; ++itry) {
    id = static_cast<float>(itry + kIq4NlValues[0]) / max;
    sumqx = 0;
    sumq2 = 0;
    for (int j = 0; j < kBlock; ++j) {
      const float q = kIq4NlValues[best_index(id * xb[j])];
      sumqx += weight[j] * q * xb[j];
      sumq2 += weight[j] * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

// Codes of 32 elements against scale d (all the middle level when d is zero, as ggml's 1/0 -> 0 gives).
void requantize(const float* xb, float d, uint8_t* levels) {
  const float id = d != 0.0f ? 1 / d : 0.0f;
  for (int j = 0; j < kBlock; ++j) levels[j] = static_cast<uint8_t>(best_index(id * xb[j]));
}

void pack_nibbles(const uint8_t* levels, uint8_t* qs) {
  for (int j = 0; j < kBlock / 2; ++j) qs[j] = static_cast<uint8_t>(levels[j] | levels[j + kBlock / 2] << 4);
}

// The 6-bit scale code of block ib of an IQ4_XS super-block (the scale is code - 32).
int xs_scale_code(const BlockIQ4_XS& b, int ib) {
  return ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | ((b.scales_h >> (2 * ib)) & 3) << 4;
}

}  // namespace

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_NL; ++i) {
    const auto b = load_block<BlockIQ4_NL>(src, i);
    const float d = fp16_to_fp32(b.d);
    float* y = dst + i * kQK4_NL;
    for (int j = 0; j < kBlock / 2; ++j) {
      y[j] = d * static_cast<float>(kIq4NlValues[b.qs[j] & 0x0f]);
      y[j + kBlock / 2] = d * static_cast<float>(kIq4NlValues[b.qs[j] >> 4]);
    }
  }
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockIQ4_XS>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (int ib = 0; ib < kQK_K / kBlock; ++ib) {
      const float dl = d * static_cast<float>(xs_scale_code(b, ib) - 32);
      const uint8_t* qs = b.qs + ib * kBlock / 2;
      float* y = dst + i * kQK_K + ib * kBlock;
      for (int j = 0; j < kBlock / 2; ++j) {
        y[j] = dl * static_cast<float>(kIq4NlValues[qs[j] & 0x0f]);
        y[j + kBlock / 2] = dl * static_cast<float>(kIq4NlValues[qs[j] >> 4]);
      }
    }
  }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_NL; ++i) {
    const float* x = src + i * kQK4_NL;
    uint8_t levels[kBlock];
    const float d = block_scale(x, levels);
    // The codes are redone against the unrounded d, not the stored half.
    requantize(x, d, levels);
    BlockIQ4_NL b{};
    b.d = fp32_to_fp16(d);
    pack_nibbles(levels, b.qs);
    store_block(dst, i, b);
  }
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
  constexpr int kBlocks = kQK_K / kBlock;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    uint8_t levels[kQK_K];
    float scales[kBlocks];
    float max_scale = 0;
    float amax_scale = 0;
    for (int ib = 0; ib < kBlocks; ++ib) {
      scales[ib] = block_scale(x + ib * kBlock, levels + ib * kBlock);
      if (std::fabs(scales[ib]) > amax_scale) {
        amax_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    // The block scales become 6-bit multiples of d = -max_scale / 32 (so the largest one is exactly -32 d),
    // and each block is requantized against its rounded scale d * l.
    BlockIQ4_XS b{};
    const float d = -max_scale / 32;
    b.d = fp32_to_fp16(d);
    const float id = d != 0.0f ? 1 / d : 0.0f;
    for (int ib = 0; ib < kBlocks; ++ib) {
      const int l = std::max(-32, std::min(31, nearest_int(id * scales[ib])));
      requantize(x + ib * kBlock, d * static_cast<float>(l), levels + ib * kBlock);
      const int code = l + 32;
      b.scales_l[ib / 2] = static_cast<uint8_t>(b.scales_l[ib / 2] | (code & 0x0f) << (4 * (ib % 2)));
      b.scales_h = static_cast<uint16_t>(b.scales_h | (code >> 4) << (2 * ib));
    }
    for (int ib = 0; ib < kBlocks; ++ib) pack_nibbles(levels + ib * kBlock, b.qs + ib * kBlock / 2);
    store_block(dst, i, b);
  }
}

float vec_dot_iq4_nl(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK4_NL; ++i) {
    const auto w = load_block<BlockIQ4_NL>(weight, i);
    const auto a = load_block<BlockQ8_0>(activation, i);
    int sumi = 0;
    for (int j = 0; j < kBlock / 2; ++j) {
      sumi += a.qs[j] * kIq4NlValues[w.qs[j] & 0x0f];
      sumi += a.qs[j + kBlock / 2] * kIq4NlValues[w.qs[j] >> 4];
    }
    sum += fp16_to_fp32(w.d) * fp16_to_fp32(a.d) * static_cast<float>(sumi);
  }
  return sum;
}

float vec_dot_iq4_xs(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto w = load_block<BlockIQ4_XS>(weight, i);
    const auto a = load_block<BlockQ8_K>(activation, i);
    int isum = 0;
    for (int ib = 0; ib < kQK_K / kBlock; ++ib) {
      const uint8_t* qs = w.qs + ib * kBlock / 2;
      const int8_t* q8 = a.qs + ib * kBlock;
      int block_sum = 0;
      for (int j = 0; j < kBlock / 2; ++j) {
        block_sum += q8[j] * kIq4NlValues[qs[j] & 0x0f];
        block_sum += q8[j + kBlock / 2] * kIq4NlValues[qs[j] >> 4];
      }
      isum += (xs_scale_code(w, ib) - 32) * block_sum;
    }
    sum += fp16_to_fp32(w.d) * a.d * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace hetmoe::quant::ref_detail
