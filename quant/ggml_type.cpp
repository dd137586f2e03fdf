#include "quant/ggml_type.h"

#include <array>
#include <cctype>
#include <stdexcept>

namespace hetmoe::quant {
namespace {

using T = GgmlType;

constexpr std::array kTypes = {
    TypeInfo{T::F32, "F32", 1, 4, T::F32},
    TypeInfo{T::F16, "F16", 1, 2, T::F16},
    TypeInfo{T::BF16, "BF16", 1, 2, T::BF16},
    TypeInfo{T::I32, "I32", 1, 4, T::I32},
    TypeInfo{T::Q4_0, "Q4_0", 32, 18, T::Q8_0},
    TypeInfo{T::Q4_1, "Q4_1", 32, 20, T::Q8_1},
    TypeInfo{T::Q5_0, "Q5_0", 32, 22, T::Q8_0},
    TypeInfo{T::Q5_1, "Q5_1", 32, 24, T::Q8_1},
    TypeInfo{T::Q8_0, "Q8_0", 32, 34, T::Q8_0},
    TypeInfo{T::Q8_1, "Q8_1", 32, 36, T::Q8_1},
    TypeInfo{T::Q2_K, "Q2_K", 256, 84, T::Q8_K},
    TypeInfo{T::Q3_K, "Q3_K", 256, 110, T::Q8_K},
    TypeInfo{T::Q4_K, "Q4_K", 256, 144, T::Q8_K},
    TypeInfo{T::Q5_K, "Q5_K", 256, 176, T::Q8_K},
    TypeInfo{T::Q6_K, "Q6_K", 256, 210, T::Q8_K},
    TypeInfo{T::Q8_K, "Q8_K", 256, 292, T::Q8_K},
    TypeInfo{T::IQ1_S, "IQ1_S", 256, 50, T::Q8_K},
    TypeInfo{T::IQ1_M, "IQ1_M", 256, 56, T::Q8_K},
    TypeInfo{T::IQ2_XXS, "IQ2_XXS", 256, 66, T::Q8_K},
    TypeInfo{T::IQ2_XS, "IQ2_XS", 256, 74, T::Q8_K},
    TypeInfo{T::IQ2_S, "IQ2_S", 256, 82, T::Q8_K},
    TypeInfo{T::IQ3_XXS, "IQ3_XXS", 256, 98, T::Q8_K},
    TypeInfo{T::IQ3_S, "IQ3_S", 256, 110, T::Q8_K},
    TypeInfo{T::IQ4_NL, "IQ4_NL", 32, 18, T::Q8_0},
    TypeInfo{T::IQ4_XS, "IQ4_XS", 256, 136, T::Q8_K},
    TypeInfo{T::TQ1_0, "TQ1_0", 256, 54, T::Q8_K},
    TypeInfo{T::TQ2_0, "TQ2_0", 256, 66, T::Q8_K},
    TypeInfo{T::MXFP4, "MXFP4", 32, 17, T::Q8_0},
    TypeInfo{T::HQ2_G64, "HQ2_G64", 64, 64 * 2 / 8 + 4, T::F32},
    TypeInfo{T::HQ2_G128, "HQ2_G128", 128, 128 * 2 / 8 + 4, T::F32},
    TypeInfo{T::HQ3_G64, "HQ3_G64", 64, 64 * 3 / 8 + 4, T::F32},
    TypeInfo{T::HQ3_G128, "HQ3_G128", 128, 128 * 3 / 8 + 4, T::F32},
    TypeInfo{T::HQ4_G64, "HQ4_G64", 64, 64 * 4 / 8 + 4, T::F32},
    TypeInfo{T::HQ4_G128, "HQ4_G128", 128, 128 * 4 / 8 + 4, T::F32},
};

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != std::toupper(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

const TypeInfo* type_info(uint32_t id) {
  for (const TypeInfo& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

const TypeInfo& type_info(GgmlType type) {
  const TypeInfo* t = type_info(static_cast<uint32_t>(type));
  if (!t) throw std::logic_error("unknown GgmlType");
  return *t;
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const TypeInfo& t : kTypes)
    if (iequal(t.name, name)) return t.type;
  return std::nullopt;
}

size_t row_bytes(GgmlType type, int64_t n) {
  const TypeInfo& t = type_info(type);
  if (n < 0 || n % t.block_size != 0) return 0;
  return static_cast<size_t>(n / t.block_size) * t.type_size;
}

}  // namespace hetmoe::quant
