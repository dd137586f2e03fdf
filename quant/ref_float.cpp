// F32, F16 and BF16 rows. Their activation formats are themselves, so quantize_* doubles as the activation
// conversion (ggml-cpu's F16C cvtps_ph and its BF16 rounding are both round-to-nearest-even, as half.h is).

#include <cstddef>
#include <cstring>

#include "quant/half.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

// Halves are read and written byte-wise: rows can sit at odd addresses inside a file.
uint16_t load_u16(const void* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const std::byte*>(row) + 2 * i, 2);
  return h;
}

void store_u16(void* row, int64_t i, uint16_t h) { std::memcpy(static_cast<std::byte*>(row) + 2 * i, &h, 2); }

float load_f32(const void* row, int64_t i) {
  float f;
  std::memcpy(&f, static_cast<const std::byte*>(row) + 4 * i, 4);
  return f;
}

}  // namespace

void dequantize_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * 4); }

void dequantize_f16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(src, i));
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(src, i));
}

void quantize_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * 4); }

void quantize_f16(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_u16(dst, i, fp32_to_fp16(src[i]));
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store_u16(dst, i, fp32_to_bf16(src[i]));
}

// The three float dot products accumulate in double, as ggml's scalar ggml_vec_dot_{f32,f16,bf16} do. The
// products of two halves (or two bf16s) are exact in float, so the result is the exact sum rounded once;
// ggml's AVX2 kernels (eight float lanes) stay within 1e-7 of the sum relative to sum |x_i y_i|.
float vec_dot_f32(int64_t n, const void* weight, const void* activation) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(load_f32(weight, i)) * static_cast<double>(load_f32(activation, i));
  return static_cast<float>(sum);
}

float vec_dot_f16(int64_t n, const void* weight, const void* activation) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(fp16_to_fp32(load_u16(weight, i)) * fp16_to_fp32(load_u16(activation, i)));
  return static_cast<float>(sum);
}

float vec_dot_bf16(int64_t n, const void* weight, const void* activation) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(bf16_to_fp32(load_u16(weight, i)) * bf16_to_fp32(load_u16(activation, i)));
  return static_cast<float>(sum);
}

}  // namespace hetmoe::quant::ref_detail
