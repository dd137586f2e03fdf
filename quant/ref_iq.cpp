// The IQ formats' scalar reference: each format's block decoded to the common IqBlock (quant/iq.h), and dequantize
// and dot product written once over that. The decoders follow ggml's bit layouts (quant/blocks.h); the values are
// checked against llama.cpp's block vectors bit for bit.

#include <cstring>
#include <iterator>
#include <vector>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/iq.h"
#include "quant/iq_decode.h"
#include "quant/iq_grids.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant {
namespace {

template <GgmlType kType>
void dequantize_iq(const void* src, float* dst, int64_t n) {
  const float unit = IqDecoder<kType>::kUnit;
  const size_t size = IqDecoder<kType>::kBytes;
  IqChunk c;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = static_cast<const uint8_t*>(src) + i * size;
    const float d = IqDecoder<kType>::scale(b);
    for (int k = 0; k < 8; ++k) {
      IqDecoder<kType>::chunk(b, k, c);
      float* y = dst + i * kQK_K + 32 * k;
      for (int h = 0; h < 2; ++h) {
        const float dl = d * (static_cast<float>(c.ls[h]) * unit);
        for (int l = 2 * h; l < 2 * h + 2; ++l)
          for (int j = 0; j < 8; ++j) y[8 * l + j] = dl * static_cast<float>(iq_value(c, l, j));
      }
    }
  }
}

template <GgmlType kType>
float vec_dot_iq(int64_t n, const void* weight, const void* activation) {
  const size_t size = IqDecoder<kType>::kBytes;
  IqChunk c;
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* b = static_cast<const uint8_t*>(weight) + i * size;
    const auto a = load_block<BlockQ8_K>(activation, i);
    int32_t isum = 0;
    for (int k = 0; k < 8; ++k) {
      IqDecoder<kType>::chunk(b, k, c);
      for (int h = 0; h < 2; ++h) {
        int32_t s = 0;
        for (int l = 2 * h; l < 2 * h + 2; ++l)
          for (int j = 0; j < 8; ++j) s += iq_value(c, l, j) * a.qs[32 * k + 8 * l + j];
        isum += c.ls[h] * s;
      }
    }
    sum += IqDecoder<kType>::scale(b) * a.d * static_cast<float>(isum);
  }
  return sum * IqDecoder<kType>::kUnit;
}

}  // namespace

const Iq1Group* iq1_groups() {
  static const std::vector<Iq1Group> table = [] {
    std::vector<Iq1Group> t(2 * std::size(iq1s_grid));
    for (size_t e = 0; e < std::size(iq1s_grid); ++e)
      for (int negative = 0; negative < 2; ++negative) {
        Iq1Group& out = t[2 * e + static_cast<size_t>(negative)];
        out = {};
        for (int j = 0; j < 8; ++j) {
          const int q = 8 * static_cast<int8_t>(iq1s_grid[e] >> (8 * j) & 0xff) + (negative ? -1 : 1);
          out.mag |= static_cast<uint64_t>(q < 0 ? -q : q) << (8 * j);
          if (q < 0) out.neg |= uint64_t{0xff} << (8 * j);
        }
      }
    return t;
  }();
  return table.data();
}

float iq_half_to_float(uint16_t h) { return fp16_to_fp32(h); }

bool is_iq_grid_type(GgmlType type) {
  switch (type) {
    case GgmlType::IQ1_S:
    case GgmlType::IQ1_M:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
      return true;
    default:
      return false;
  }
}

namespace ref_detail {

void dequantize_iq1_s(const void* src, float* dst, int64_t n) { dequantize_iq<GgmlType::IQ1_S>(src, dst, n); }
float vec_dot_iq1_s(int64_t n, const void* w, const void* a) { return vec_dot_iq<GgmlType::IQ1_S>(n, w, a); }
void dequantize_iq1_m(const void* src, float* dst, int64_t n) { dequantize_iq<GgmlType::IQ1_M>(src, dst, n); }
float vec_dot_iq1_m(int64_t n, const void* w, const void* a) { return vec_dot_iq<GgmlType::IQ1_M>(n, w, a); }
void dequantize_iq2_xxs(const void* src, float* dst, int64_t n) { dequantize_iq<GgmlType::IQ2_XXS>(src, dst, n); }
float vec_dot_iq2_xxs(int64_t n, const void* w, const void* a) { return vec_dot_iq<GgmlType::IQ2_XXS>(n, w, a); }
void dequantize_iq2_xs(const void* src, float* dst, int64_t n) { dequantize_iq<GgmlType::IQ2_XS>(src, dst, n); }
float vec_dot_iq2_xs(int64_t n, const void* w, const void* a) { return vec_dot_iq<GgmlType::IQ2_XS>(n, w, a); }
void dequantize_iq2_s(const void* src, float* dst, int64_t n) { dequantize_iq<GgmlType::IQ2_S>(src, dst, n); }
float vec_dot_iq2_s(int64_t n, const void* w, const void* a) { return vec_dot_iq<GgmlType::IQ2_S>(n, w, a); }
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) { dequantize_iq<GgmlType::IQ3_XXS>(src, dst, n); }
float vec_dot_iq3_xxs(int64_t n, const void* w, const void* a) { return vec_dot_iq<GgmlType::IQ3_XXS>(n, w, a); }
void dequantize_iq3_s(const void* src, float* dst, int64_t n) { dequantize_iq<GgmlType::IQ3_S>(src, dst, n); }
float vec_dot_iq3_s(int64_t n, const void* w, const void* a) { return vec_dot_iq<GgmlType::IQ3_S>(n, w, a); }

}  // namespace ref_detail
}  // namespace hetmoe::quant
