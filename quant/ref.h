#pragma once

// Scalar reference implementations of the ggml weight formats: the fallback of every fast kernel and the oracle
// its tests compare against. They follow ggml's formulas in ggml's operation order, so dequantized values are
// bit-exact and quantized bytes equal what llama.cpp's quantizer writes (without an importance matrix).

#include <cstddef>
#include <cstdint>

#include "quant/ggml_type.h"

namespace hetmoe::quant {

// n elements of a row of `type` (n a multiple of the block size) to float.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Throws std::invalid_argument naming `function` unless n is a whole number of `type`'s blocks: every entry point
// takes whole blocks only (a partial block has no defined layout). For kernels that stand in for these.
void check_row_length(const char* function, GgmlType type, int64_t n);

// n floats to a row of `type`, as ggml_quantize_chunk(type, ..., imatrix = NULL) does. Every weight type is
// supported except Q8_1 and Q8_K, which exist only as activation formats.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// n activation floats to `vec_dot_type` (F32, F16, BF16, Q8_0, Q8_1, Q8_K) exactly as ggml-cpu's x86 from_float
// writes it before a mat-mul (section 7 of the reference README: 127/amax multiplier, round half even...).
void quantize_activation(GgmlType vec_dot_type, const float* src, void* dst, int64_t n);

// Bytes that quantize_activation writes for a row of n elements meant for a weight of `weight_type`.
size_t activation_row_bytes(GgmlType weight_type, int64_t n);

// Dot product of one weight row (n elements of `weight_type`) with an activation already converted to that
// type's vec_dot_type, with ggml's integer block arithmetic and F32 accumulation.
float vec_dot(GgmlType weight_type, int64_t n, const void* weight_row, const void* activation);

}  // namespace hetmoe::quant
