#pragma once

// Internal to the scalar reference (ref*.cpp): one entry point per format and operation, all with the same
// signatures so ref.cpp can dispatch through a table, plus the numeric helpers ggml's quantizers share.
// n is always a whole number of blocks; ref.cpp checks that before calling in.

#include <bit>
#include <cstdint>

#include "quant/le_bytes.h"

namespace hetmoe::quant::ref_detail {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);
using VecDotFn = float (*)(int64_t n, const void* weight, const void* activation);

// Round to nearest, ties to even, exactly as ggml's nearest_int: adding 1.5 * 2^23 pushes the rounded integer
// into the low mantissa bits. Only valid for |v| < 2^22; every caller's value is bounded far below that.
// Written this way (not lrintf) so the result does not depend on the floating-point environment.
inline int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(shifted) & 0x007fffffu) - 0x00400000;
}

// The fifth bits of a Q5_0 / Q5_1 block are a little-endian uint32.
using quant::load_u32_le;
using quant::store_u32_le;

// ref_float.cpp (F32, F16, BF16: the activation quantizers of these are the weight quantizers)
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void quantize_f32(const float* src, void* dst, int64_t n);
void quantize_f16(const float* src, void* dst, int64_t n);
void quantize_bf16(const float* src, void* dst, int64_t n);
float vec_dot_f32(int64_t n, const void* weight, const void* activation);
float vec_dot_f16(int64_t n, const void* weight, const void* activation);
float vec_dot_bf16(int64_t n, const void* weight, const void* activation);

// ref_legacy.cpp
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q8_1(const void* src, float* dst, int64_t n);
void quantize_q4_0(const float* src, void* dst, int64_t n);
void quantize_q4_1(const float* src, void* dst, int64_t n);
void quantize_q5_0(const float* src, void* dst, int64_t n);
void quantize_q5_1(const float* src, void* dst, int64_t n);
void quantize_q8_0(const float* src, void* dst, int64_t n);
float vec_dot_q4_0(int64_t n, const void* weight, const void* activation);
float vec_dot_q4_1(int64_t n, const void* weight, const void* activation);
float vec_dot_q5_0(int64_t n, const void* weight, const void* activation);
float vec_dot_q5_1(int64_t n, const void* weight, const void* activation);
float vec_dot_q8_0(int64_t n, const void* weight, const void* activation);

// ref_kquants.cpp
void dequantize_q2_k(const void* src, float* dst, int64_t n);
void dequantize_q3_k(const void* src, float* dst, int64_t n);
void dequantize_q4_k(const void* src, float* dst, int64_t n);
void dequantize_q5_k(const void* src, float* dst, int64_t n);
void dequantize_q6_k(const void* src, float* dst, int64_t n);
void dequantize_q8_k(const void* src, float* dst, int64_t n);
void quantize_q2_k(const float* src, void* dst, int64_t n);
void quantize_q3_k(const float* src, void* dst, int64_t n);
void quantize_q4_k(const float* src, void* dst, int64_t n);
void quantize_q5_k(const float* src, void* dst, int64_t n);
void quantize_q6_k(const float* src, void* dst, int64_t n);
float vec_dot_q2_k(int64_t n, const void* weight, const void* activation);
float vec_dot_q3_k(int64_t n, const void* weight, const void* activation);
float vec_dot_q4_k(int64_t n, const void* weight, const void* activation);
float vec_dot_q5_k(int64_t n, const void* weight, const void* activation);
float vec_dot_q6_k(int64_t n, const void* weight, const void* activation);

// ref_iq4.cpp
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);
void quantize_iq4_nl(const float* src, void* dst, int64_t n);
void quantize_iq4_xs(const float* src, void* dst, int64_t n);
float vec_dot_iq4_nl(int64_t n, const void* weight, const void* activation);
float vec_dot_iq4_xs(int64_t n, const void* weight, const void* activation);

// ref_iq.cpp, ref_iq_quantize.cpp (the grid formats, through quant/iq.h's common block)
void dequantize_iq1_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_iq2_s(const void* src, float* dst, int64_t n);
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void quantize_iq1_s(const float* src, void* dst, int64_t n);
void quantize_iq1_m(const float* src, void* dst, int64_t n);
void quantize_iq2_xxs(const float* src, void* dst, int64_t n);
void quantize_iq2_xs(const float* src, void* dst, int64_t n);
void quantize_iq2_s(const float* src, void* dst, int64_t n);
void quantize_iq3_xxs(const float* src, void* dst, int64_t n);
void quantize_iq3_s(const float* src, void* dst, int64_t n);
float vec_dot_iq1_s(int64_t n, const void* weight, const void* activation);
float vec_dot_iq1_m(int64_t n, const void* weight, const void* activation);
float vec_dot_iq2_xxs(int64_t n, const void* weight, const void* activation);
float vec_dot_iq2_xs(int64_t n, const void* weight, const void* activation);
float vec_dot_iq2_s(int64_t n, const void* weight, const void* activation);
float vec_dot_iq3_xxs(int64_t n, const void* weight, const void* activation);
float vec_dot_iq3_s(int64_t n, const void* weight, const void* activation);

// ref_fp4.cpp
void dequantize_mxfp4(const void* src, float* dst, int64_t n);
void quantize_mxfp4(const float* src, void* dst, int64_t n);
float vec_dot_mxfp4(int64_t n, const void* weight, const void* activation);

// ref_ternary.cpp
void dequantize_tq1_0(const void* src, float* dst, int64_t n);
void dequantize_tq2_0(const void* src, float* dst, int64_t n);
void quantize_tq1_0(const float* src, void* dst, int64_t n);
void quantize_tq2_0(const float* src, void* dst, int64_t n);
float vec_dot_tq1_0(int64_t n, const void* weight, const void* activation);
float vec_dot_tq2_0(int64_t n, const void* weight, const void* activation);

// ref_activation.cpp: the 8-bit activation formats as ggml-cpu's x86 (AVX2) from_float writes them.
void quantize_activation_q8_0(const float* src, void* dst, int64_t n);
void quantize_activation_q8_1(const float* src, void* dst, int64_t n);
void quantize_activation_q8_k(const float* src, void* dst, int64_t n);

// ref_lowbit.cpp (hetmoe's HQ split formats; vec_dot against F32 activations)
void dequantize_hq2_g64(const void* src, float* dst, int64_t n);
void dequantize_hq2_g128(const void* src, float* dst, int64_t n);
void dequantize_hq3_g64(const void* src, float* dst, int64_t n);
void dequantize_hq3_g128(const void* src, float* dst, int64_t n);
void dequantize_hq4_g64(const void* src, float* dst, int64_t n);
void dequantize_hq4_g128(const void* src, float* dst, int64_t n);
void quantize_hq2_g64(const float* src, void* dst, int64_t n);
void quantize_hq2_g128(const float* src, void* dst, int64_t n);
void quantize_hq3_g64(const float* src, void* dst, int64_t n);
void quantize_hq3_g128(const float* src, void* dst, int64_t n);
void quantize_hq4_g64(const float* src, void* dst, int64_t n);
void quantize_hq4_g128(const float* src, void* dst, int64_t n);
float vec_dot_hq2_g64(int64_t n, const void* weight, const void* activation);
float vec_dot_hq2_g128(int64_t n, const void* weight, const void* activation);
float vec_dot_hq3_g64(int64_t n, const void* weight, const void* activation);
float vec_dot_hq3_g128(int64_t n, const void* weight, const void* activation);
float vec_dot_hq4_g64(int64_t n, const void* weight, const void* activation);
float vec_dot_hq4_g128(int64_t n, const void* weight, const void* activation);

}  // namespace hetmoe::quant::ref_detail
