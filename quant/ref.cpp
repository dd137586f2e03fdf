// Entry points of the scalar reference: argument checks and dispatch to the per-format code in ref_*.cpp.

#include "quant/ref.h"

#include <array>
#include <stdexcept>
#include <string>

#include "quant/ref_formats.h"

namespace hetmoe::quant {
namespace {

namespace rd = ref_detail;
using T = GgmlType;

struct FormatRef {
  GgmlType type;
  rd::DequantizeFn dequantize;
  rd::QuantizeFn quantize;             // nullptr for the activation-only formats Q8_1 and Q8_K
  rd::VecDotFn vec_dot;                // nullptr for the activation-only formats
  rd::QuantizeFn quantize_activation;  // nullptr for the formats that are never a vec_dot type
};

// clang-format off
constexpr std::array kFormats = {
    FormatRef{T::F32,    rd::dequantize_f32,    rd::quantize_f32,    rd::vec_dot_f32,    rd::quantize_f32},
    FormatRef{T::F16,    rd::dequantize_f16,    rd::quantize_f16,    rd::vec_dot_f16,    rd::quantize_f16},
    FormatRef{T::BF16,   rd::dequantize_bf16,   rd::quantize_bf16,   rd::vec_dot_bf16,   rd::quantize_bf16},
    FormatRef{T::Q4_0,   rd::dequantize_q4_0,   rd::quantize_q4_0,   rd::vec_dot_q4_0,   nullptr},
    FormatRef{T::Q4_1,   rd::dequantize_q4_1,   rd::quantize_q4_1,   rd::vec_dot_q4_1,   nullptr},
    FormatRef{T::Q5_0,   rd::dequantize_q5_0,   rd::quantize_q5_0,   rd::vec_dot_q5_0,   nullptr},
    FormatRef{T::Q5_1,   rd::dequantize_q5_1,   rd::quantize_q5_1,   rd::vec_dot_q5_1,   nullptr},
    FormatRef{T::Q8_0,   rd::dequantize_q8_0,   rd::quantize_q8_0,   rd::vec_dot_q8_0,   rd::quantize_activation_q8_0},
    FormatRef{T::Q8_1,   rd::dequantize_q8_1,   nullptr,             nullptr,            rd::quantize_activation_q8_1},
    FormatRef{T::Q2_K,   rd::dequantize_q2_k,   rd::quantize_q2_k,   rd::vec_dot_q2_k,   nullptr},
    FormatRef{T::Q3_K,   rd::dequantize_q3_k,   rd::quantize_q3_k,   rd::vec_dot_q3_k,   nullptr},
    FormatRef{T::Q4_K,   rd::dequantize_q4_k,   rd::quantize_q4_k,   rd::vec_dot_q4_k,   nullptr},
    FormatRef{T::Q5_K,   rd::dequantize_q5_k,   rd::quantize_q5_k,   rd::vec_dot_q5_k,   nullptr},
    FormatRef{T::Q6_K,   rd::dequantize_q6_k,   rd::quantize_q6_k,   rd::vec_dot_q6_k,   nullptr},
    FormatRef{T::Q8_K,   rd::dequantize_q8_k,   nullptr,             nullptr,            rd::quantize_activation_q8_k},
    FormatRef{T::IQ4_NL, rd::dequantize_iq4_nl, rd::quantize_iq4_nl, rd::vec_dot_iq4_nl, nullptr},
    FormatRef{T::IQ4_XS, rd::dequantize_iq4_xs, rd::quantize_iq4_xs, rd::vec_dot_iq4_xs, nullptr},
    FormatRef{T::IQ1_S, rd::dequantize_iq1_s, rd::quantize_iq1_s, rd::vec_dot_iq1_s, nullptr},
    FormatRef{T::IQ1_M, rd::dequantize_iq1_m, rd::quantize_iq1_m, rd::vec_dot_iq1_m, nullptr},
    FormatRef{T::IQ2_XXS, rd::dequantize_iq2_xxs, rd::quantize_iq2_xxs, rd::vec_dot_iq2_xxs, nullptr},
    FormatRef{T::IQ2_XS, rd::dequantize_iq2_xs, rd::quantize_iq2_xs, rd::vec_dot_iq2_xs, nullptr},
    FormatRef{T::IQ2_S, rd::dequantize_iq2_s, rd::quantize_iq2_s, rd::vec_dot_iq2_s, nullptr},
    FormatRef{T::IQ3_XXS, rd::dequantize_iq3_xxs, rd::quantize_iq3_xxs, rd::vec_dot_iq3_xxs, nullptr},
    FormatRef{T::IQ3_S, rd::dequantize_iq3_s, rd::quantize_iq3_s, rd::vec_dot_iq3_s, nullptr},
    FormatRef{T::TQ1_0,  rd::dequantize_tq1_0,  rd::quantize_tq1_0,  rd::vec_dot_tq1_0,  nullptr},
    FormatRef{T::TQ2_0,  rd::dequantize_tq2_0,  rd::quantize_tq2_0,  rd::vec_dot_tq2_0,  nullptr},
    FormatRef{T::MXFP4,  rd::dequantize_mxfp4,  rd::quantize_mxfp4,  rd::vec_dot_mxfp4,  nullptr},
    FormatRef{T::HQ2_G64,  rd::dequantize_hq2_g64,  rd::quantize_hq2_g64,  rd::vec_dot_hq2_g64,  nullptr},
    FormatRef{T::HQ2_G128, rd::dequantize_hq2_g128, rd::quantize_hq2_g128, rd::vec_dot_hq2_g128, nullptr},
    FormatRef{T::HQ3_G64,  rd::dequantize_hq3_g64,  rd::quantize_hq3_g64,  rd::vec_dot_hq3_g64,  nullptr},
    FormatRef{T::HQ3_G128, rd::dequantize_hq3_g128, rd::quantize_hq3_g128, rd::vec_dot_hq3_g128, nullptr},
    FormatRef{T::HQ4_G64,  rd::dequantize_hq4_g64,  rd::quantize_hq4_g64,  rd::vec_dot_hq4_g64,  nullptr},
    FormatRef{T::HQ4_G128, rd::dequantize_hq4_g128, rd::quantize_hq4_g128, rd::vec_dot_hq4_g128, nullptr},
};
// clang-format on

std::string type_name(GgmlType type) {
  const TypeInfo* info = type_info(static_cast<uint32_t>(type));
  return info ? std::string(info->name) : "ggml type id " + std::to_string(static_cast<uint32_t>(type));
}

[[noreturn]] void unsupported(const char* function, GgmlType type, const char* why) {
  throw std::invalid_argument(std::string("hetmoe::quant::") + function + ": " + type_name(type) + " " + why);
}

const FormatRef& format(const char* function, GgmlType type) {
  for (const FormatRef& f : kFormats)
    if (f.type == type) return f;
  unsupported(function, type, "is not a format hetmoe knows");
}

}  // namespace

void check_row_length(const char* function, GgmlType type, int64_t n) {
  const int64_t block = type_info(type).block_size;
  if (n < 0 || n % block != 0)
    throw std::invalid_argument(std::string("hetmoe::quant::") + function + ": " + std::to_string(n) +
                                " elements is not a whole number of " + type_name(type) + " blocks of " +
                                std::to_string(block));
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const FormatRef& f = format("dequantize_row", type);
  check_row_length("dequantize_row", type, n);
  f.dequantize(src, dst, n);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const FormatRef& f = format("quantize_row", type);
  if (!f.quantize) unsupported("quantize_row", type, "is an activation format; it has no weight quantizer");
  check_row_length("quantize_row", type, n);
  f.quantize(src, dst, n);
}

void quantize_activation(GgmlType vec_dot_type, const float* src, void* dst, int64_t n) {
  const FormatRef& f = format("quantize_activation", vec_dot_type);
  if (!f.quantize_activation) unsupported("quantize_activation", vec_dot_type, "is not an activation (vec_dot) format");
  check_row_length("quantize_activation", vec_dot_type, n);
  f.quantize_activation(src, dst, n);
}

size_t activation_row_bytes(GgmlType weight_type, int64_t n) {
  format("activation_row_bytes", weight_type);  // throws for ids hetmoe does not know
  return row_bytes(type_info(weight_type).vec_dot_type, n);
}

float vec_dot(GgmlType weight_type, int64_t n, const void* weight_row, const void* activation) {
  const FormatRef& f = format("vec_dot", weight_type);
  if (!f.vec_dot) unsupported("vec_dot", weight_type, "is an activation format, not a weight format");
  check_row_length("vec_dot", weight_type, n);  // every vec_dot type has its weight type's block size
  return f.vec_dot(n, weight_row, activation);
}

}  // namespace hetmoe::quant
