// The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (and Q8_1's values, for tests and dumps).
// Quantizers follow ggml's quantize_row_*_ref, which is what ggml_quantize_chunk runs without an importance
// matrix; every expression keeps ggml's operand order so the float roundings, and hence the bytes, agree.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

constexpr int kHalf = 16;  // the two halves of a 32-block share a byte: element j low nibble, j + 16 high

// ggml writes (int8_t)(v) for these: truncation toward zero. v is in [0, 32] for finite input; a block of
// subnormals makes 1/d infinite and v infinite or NaN, which x86's conversion (and so ggml) turns into INT_MIN. The
// same here, without the cast that would be undefined.
int truncate(float v) {
  return v > -2147483648.0f && v < 2147483648.0f ? static_cast<int>(v) : std::numeric_limits<int>::min();
}

// The signed value with the largest magnitude, the first one on ties (ggml's scan with a strict '<').
float signed_absmax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

struct MinMax {
  float min;
  float max;
};

MinMax min_max(const float* x, int n) {
  MinMax r{FLT_MAX, -FLT_MAX};
  for (int j = 0; j < n; ++j) {
    if (x[j] < r.min) r.min = x[j];
    if (x[j] > r.max) r.max = x[j];
  }
  return r;
}

// Element j of a Q5 block as its unsigned 5-bit code.
int q5_code(const uint8_t* qs, uint32_t qh, int j) {
  const int low = j < kHalf ? qs[j] & 0x0f : qs[j - kHalf] >> 4;
  return low | static_cast<int>((qh >> j) & 1) << 4;
}

void pack_q5(const int* codes, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < kHalf; ++j) {
    qs[j] = static_cast<uint8_t>((codes[j] & 0x0f) | (codes[j + kHalf] & 0x0f) << 4);
    qh |= static_cast<uint32_t>((codes[j] & 0x10) >> 4) << j;
    qh |= static_cast<uint32_t>((codes[j + kHalf] & 0x10) >> 4) << (j + kHalf);
  }
  store_u32_le(qh_bytes, qh);
}

}  // namespace

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    float* y = dst + i * kQK4_0;
    for (int j = 0; j < kHalf; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0f) - 8) * d;
      y[j + kHalf] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_1; ++i) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    float* y = dst + i * kQK4_1;
    for (int j = 0; j < kHalf; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0f) * d + m;
      y[j + kHalf] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_0; ++i) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    const uint32_t qh = load_u32_le(b.qh);
    float* y = dst + i * kQK5_0;
    for (int j = 0; j < kQK5_0; ++j) y[j] = static_cast<float>(q5_code(b.qs, qh, j) - 16) * d;
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_1; ++i) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    const uint32_t qh = load_u32_le(b.qh);
    float* y = dst + i * kQK5_1;
    for (int j = 0; j < kQK5_1; ++j) y[j] = static_cast<float>(q5_code(b.qs, qh, j)) * d + m;
  }
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = static_cast<float>(b.qs[j]) * d;
  }
}

// ggml has no to_float for Q8_1 (it is only ever an activation); its values are d * q, as for Q8_0.
void dequantize_q8_1(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_1; ++i) {
    const auto b = load_block<BlockQ8_1>(src, i);
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < kQK8_1; ++j) dst[i * kQK8_1 + j] = static_cast<float>(b.qs[j]) * d;
  }
}

// Symmetric 4-bit: the largest-magnitude element maps to -8 exactly, so its sign sets the sign of d.
void quantize_q4_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float* x = src + i * kQK4_0;
    const float d = signed_absmax(x, kQK4_0) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 b{};
    b.d = fp32_to_fp16(d);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = std::min(15, truncate(x[j] * id + 8.5f));
      const int hi = std::min(15, truncate(x[j + kHalf] * id + 8.5f));
      b.qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
    store_block(dst, i, b);
  }
}

void quantize_q4_1(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_1; ++i) {
    const float* x = src + i * kQK4_1;
    const MinMax r = min_max(x, kQK4_1);
    const float d = (r.max - r.min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_1 b{};
    b.d = fp32_to_fp16(d);
    b.m = fp32_to_fp16(r.min);
    for (int j = 0; j < kHalf; ++j) {
      const int lo = std::min(15, truncate((x[j] - r.min) * id + 0.5f));
      const int hi = std::min(15, truncate((x[j + kHalf] - r.min) * id + 0.5f));
      b.qs[j] = static_cast<uint8_t>(lo | hi << 4);
    }
    store_block(dst, i, b);
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_0; ++i) {
    const float* x = src + i * kQK5_0;
    const float d = signed_absmax(x, kQK5_0) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int codes[kQK5_0];
    for (int j = 0; j < kQK5_0; ++j) codes[j] = std::min(31, truncate(x[j] * id + 16.5f));
    BlockQ5_0 b{};
    b.d = fp32_to_fp16(d);
    pack_q5(codes, b.qs, b.qh);
    store_block(dst, i, b);
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_1; ++i) {
    const float* x = src + i * kQK5_1;
    const MinMax r = min_max(x, kQK5_1);
    const float d = (r.max - r.min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int codes[kQK5_1];
    // No clamp, as in ggml: (max - min) * id + 0.5 comes to at most 31.5 and truncates to 31.
    for (int j = 0; j < kQK5_1; ++j) codes[j] = truncate((x[j] - r.min) * id + 0.5f);
    BlockQ5_1 b{};
    b.d = fp32_to_fp16(d);
    b.m = fp32_to_fp16(r.min);
    pack_q5(codes, b.qs, b.qh);
    store_block(dst, i, b);
  }
}

// Weight Q8_0 rounds half away from zero (roundf) with 1/d as the multiplier; the activation flavour in
// ref_activation.cpp rounds half to even with 127/amax. Both are ggml's, for different callers.
void quantize_q8_0(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* x = src + i * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b{};
    b.d = fp32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    store_block(dst, i, b);
  }
}

// The dot products below take integer sums inside a block and scale them in float, in ggml's order
// (ggml-cpu's generic quants.c), accumulating the blocks in one float.

float vec_dot_q4_0(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const auto w = load_block<BlockQ4_0>(weight, i);
    const auto a = load_block<BlockQ8_0>(activation, i);
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      sumi += ((w.qs[j] & 0x0f) - 8) * a.qs[j];
      sumi += ((w.qs[j] >> 4) - 8) * a.qs[j + kHalf];
    }
    sum += static_cast<float>(sumi) * fp16_to_fp32(w.d) * fp16_to_fp32(a.d);
  }
  return sum;
}

// With a min: sum_j (d_w q_w + m_w) d_a q_a = d_w d_a sum q_w q_a + m_w * s_a, where s_a = d_a sum q_a was
// stored with the activation.
float vec_dot_q4_1(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK4_1; ++i) {
    const auto w = load_block<BlockQ4_1>(weight, i);
    const auto a = load_block<BlockQ8_1>(activation, i);
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      sumi += (w.qs[j] & 0x0f) * a.qs[j];
      sumi += (w.qs[j] >> 4) * a.qs[j + kHalf];
    }
    sum += fp16_to_fp32(w.d) * fp16_to_fp32(a.d) * static_cast<float>(sumi) + fp16_to_fp32(w.m) * fp16_to_fp32(a.s);
  }
  return sum;
}

float vec_dot_q5_0(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK5_0; ++i) {
    const auto w = load_block<BlockQ5_0>(weight, i);
    const auto a = load_block<BlockQ8_0>(activation, i);
    const uint32_t qh = load_u32_le(w.qh);
    int sumi = 0;
    for (int j = 0; j < kQK5_0; ++j) sumi += (q5_code(w.qs, qh, j) - 16) * a.qs[j];
    sum += fp16_to_fp32(w.d) * fp16_to_fp32(a.d) * static_cast<float>(sumi);
  }
  return sum;
}

float vec_dot_q5_1(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK5_1; ++i) {
    const auto w = load_block<BlockQ5_1>(weight, i);
    const auto a = load_block<BlockQ8_1>(activation, i);
    const uint32_t qh = load_u32_le(w.qh);
    int sumi = 0;
    for (int j = 0; j < kQK5_1; ++j) sumi += q5_code(w.qs, qh, j) * a.qs[j];
    sum += fp16_to_fp32(w.d) * fp16_to_fp32(a.d) * static_cast<float>(sumi) + fp16_to_fp32(w.m) * fp16_to_fp32(a.s);
  }
  return sum;
}

float vec_dot_q8_0(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const auto w = load_block<BlockQ8_0>(weight, i);
    const auto a = load_block<BlockQ8_0>(activation, i);
    int sumi = 0;
    for (int j = 0; j < kQK8_0; ++j) sumi += w.qs[j] * a.qs[j];
    sum += static_cast<float>(sumi) * (fp16_to_fp32(w.d) * fp16_to_fp32(a.d));
  }
  return sum;
}

}  // namespace hetmoe::quant::ref_detail
