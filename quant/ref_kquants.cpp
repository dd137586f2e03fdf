// The K-quants (Q2_K ... Q6_K) and their activation format Q8_K, in super-blocks of 256.
//
// Reading: each format is first unpacked to integer codes and integer per-group scales (KCodes); dequantize and
// the dot product then share one body per shape. The float expressions keep ggml's operand order, so the
// dequantized values are bit-exact.
//
// Writing: ggml_quantize_chunk without an importance matrix runs quantize_row_q{2..6}_K_ref, whose scale
// searches (make_qkx2_quants, make_q3_quants, make_qx_quants) are reproduced here expression by expression: the
// searches compare float errors, so one reordered sum can pick another scale and change the bytes.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/kquant_search.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

// ggml's GROUP_MAX_EPS: a group whose largest magnitude is below this quantizes to all zeros.
constexpr float kGroupMaxEps = 1e-15f;

// ------------------------------------------------------------------------------------------------ reading

// One super-block as integers: element k stands for d * scale[k / group] * q[k] - dmin * min[k / group].
struct KCodes {
  int q[kQK_K];
  int scale[kQK_K / 16];
  int min[kQK_K / 16];  // zero for the formats without mins (Q3_K, Q6_K)
  int group;            // elements per scale: 16 or 32
  float d;
  float dmin;
  bool has_min;
};

// Q2_K, Q3_K and Q6_K spread each 128 elements over 32 bytes, element 32 * s + l of the half in bits 2s..2s+1
// of byte l.
int two_bits(const uint8_t* qs, int k) {
  const int half = k / 128;
  const int sub = (k % 128) / 32;
  return (qs[half * 32 + k % 32] >> (2 * sub)) & 3;
}

// The 6-bit scale (before the -32 offset) of group j of Q3_K: low nibble in bytes 0-7, top two bits in 8-11.
int q3_scale_code(const uint8_t* scales, int j) {
  const int low = j < 8 ? scales[j] & 0x0f : scales[j - 8] >> 4;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return low | high << 4;
}

KCodes unpack(const BlockQ2_K& b) {
  KCodes c{};
  c.group = 16;
  c.d = fp16_to_fp32(b.d);
  c.dmin = fp16_to_fp32(b.dmin);
  c.has_min = true;
  for (int g = 0; g < 16; ++g) {
    c.scale[g] = b.scales[g] & 0x0f;
    c.min[g] = b.scales[g] >> 4;
  }
  for (int k = 0; k < kQK_K; ++k) c.q[k] = two_bits(b.qs, k);
  return c;
}

KCodes unpack(const BlockQ3_K& b) {
  KCodes c{};
  c.group = 16;
  c.d = fp16_to_fp32(b.d);
  for (int g = 0; g < 16; ++g) c.scale[g] = q3_scale_code(b.scales, g) - 32;
  for (int k = 0; k < kQK_K; ++k) {
    const bool high = (b.hmask[k % 32] >> (k / 32)) & 1;
    c.q[k] = two_bits(b.qs, k) - (high ? 0 : 4);
  }
  return c;
}

KCodes unpack(const BlockQ4_K& b) {
  KCodes c{};
  c.group = 32;
  c.d = fp16_to_fp32(b.d);
  c.dmin = fp16_to_fp32(b.dmin);
  c.has_min = true;
  for (int g = 0; g < 8; ++g) k4_scale_min(b.scales, g, c.scale[g], c.min[g]);
  // Each 64 elements use 32 bytes: the first 32 the low nibbles, the next 32 the high nibbles.
  for (int k = 0; k < kQK_K; ++k) {
    const uint8_t byte = b.qs[(k / 64) * 32 + k % 32];
    c.q[k] = (k % 64) < 32 ? byte & 0x0f : byte >> 4;
  }
  return c;
}

KCodes unpack(const BlockQ5_K& b) {
  KCodes c{};
  c.group = 32;
  c.d = fp16_to_fp32(b.d);
  c.dmin = fp16_to_fp32(b.dmin);
  c.has_min = true;
  for (int g = 0; g < 8; ++g) k4_scale_min(b.scales, g, c.scale[g], c.min[g]);
  for (int k = 0; k < kQK_K; ++k) {
    const uint8_t byte = b.qs[(k / 64) * 32 + k % 32];
    const int low = (k % 64) < 32 ? byte & 0x0f : byte >> 4;
    const int high = (b.qh[k % 32] >> (k / 32)) & 1;  // group k / 32 owns bit k / 32 of qh
    c.q[k] = low + (high ? 16 : 0);
  }
  return c;
}

KCodes unpack(const BlockQ6_K& b) {
  KCodes c{};
  c.group = 16;
  c.d = fp16_to_fp32(b.d);
  for (int g = 0; g < 16; ++g) c.scale[g] = b.scales[g];
  // Per 128 elements: 64 bytes of low nibbles (elements l and l + 64 share byte l, l + 32 and l + 96 byte
  // l + 32) and 32 bytes holding the top two bits of l, l + 32, l + 64, l + 96 in bit pairs 0, 1, 2, 3.
  for (int k = 0; k < kQK_K; ++k) {
    const int half = k / 128;
    const int r = k % 128;
    const int quarter = r / 32;
    const int l = r % 32;
    const uint8_t low_byte = b.ql[half * 64 + l + (quarter % 2) * 32];
    const int low = quarter < 2 ? low_byte & 0x0f : low_byte >> 4;
    const int high = (b.qh[half * 32 + l] >> (2 * quarter)) & 3;
    c.q[k] = (low | high << 4) - 32;
  }
  return c;
}

template <typename Block>
void dequantize_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const KCodes c = unpack(load_block<Block>(src, i));
    // Group by group, the group's scale and min taken once (the same expressions per element).
    for (int g = 0; g < kQK_K / c.group; ++g) {
      const float dl = c.d * static_cast<float>(c.scale[g]);
      const int* q = c.q + g * c.group;
      float* y = dst + i * kQK_K + g * c.group;
      if (c.has_min) {
        const float ml = c.dmin * static_cast<float>(c.min[g]);
        for (int k = 0; k < c.group; ++k) y[k] = dl * static_cast<float>(q[k]) - ml;
      } else {
        for (int k = 0; k < c.group; ++k) y[k] = dl * static_cast<float>(q[k]);
      }
    }
  }
}

// sum_k value_k * d_a * q_a,k = d d_a sum_g scale_g sum q q_a - dmin d_a sum_g min_g sum q_a, all inner sums in
// integers; the sums of q_a over each 16 come precomputed in bsums.
template <typename Block>
float vec_dot_k(int64_t n, const void* weight, const void* activation) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const KCodes c = unpack(load_block<Block>(weight, i));
    const auto a = load_block<BlockQ8_K>(activation, i);
    int isum = 0;
    int isum_min = 0;
    for (int g = 0; g < kQK_K / c.group; ++g) {
      int group_sum = 0;
      for (int k = g * c.group; k < (g + 1) * c.group; ++k) group_sum += c.q[k] * a.qs[k];
      isum += c.scale[g] * group_sum;
      int bsum = 0;
      for (int b = g * c.group / 16; b < (g + 1) * c.group / 16; ++b) bsum += a.bsums[b];
      isum_min += c.min[g] * bsum;
    }
    const float scaled = a.d * c.d * static_cast<float>(isum);
    sum += c.has_min ? scaled - a.d * c.dmin * static_cast<float>(isum_min) : scaled;
  }
  return sum;
}

// ------------------------------------------------------------------------------------------------ scale search

// Best scale and min for codes in [0, nmax] of n values, minimising the weighted (absolute if use_mad, else
// squared) error over nstep + 1 trial scales around nmax / (max - min) (ggml's make_qkx2_quants). Writes the
// codes to levels and the min (as a positive offset) to *the_min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* levels, float* the_min,
                       uint8_t* levels_aux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(levels, levels + n, uint8_t{0});
    *the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    levels[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * levels[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0;
    float sum_l2 = 0;
    float sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      levels_aux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float lf = static_cast<float>(l);
      sum_l += w * lf;
      sum_l2 += w * lf * lf;
      sum_xl += w * lf * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * levels_aux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::copy(levels_aux, levels_aux + n, levels);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Signed scale for codes in [-nmax, nmax - 1], refined by coordinate descent on the x^2-weighted error
// (ggml's make_q3_quants with do_rmse). Codes are written offset by +nmax.
float make_q3_quants(int n, int nmax, const float* x, int8_t* levels) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + n, int8_t{0});
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    levels[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(levels[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0) {
        float sl2 = suml2 - w * li * li;
        const int new_l = std::max(-nmax, std::min(nmax - 1, nearest_int(x[i] * sl2 / slx)));
        if (new_l != levels[i]) {
          const float nl = static_cast<float>(new_l);
          slx += w * x[i] * nl;
          sl2 += w * nl * nl;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            levels[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) levels[i] = static_cast<int8_t>(levels[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Signed scale for codes in [-nmax, nmax - 1] maximising the x^2-weighted fit over 19 trial scales (ggml's
// make_qx_quants with rmse_type 1 and no importance weights). Codes are written offset by +nmax.
float make_qx_quants(int n, int nmax, const float* x, int8_t* levels) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + n, int8_t{0});
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = 0;
    *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float l = static_cast<float>(std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  auto write_levels = [&](float iscale) {
    for (int i = 0; i < n; ++i)
      levels[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
  };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx;
  float suml2;
  fit(iscale, &sumlx, &suml2);
  write_levels(iscale);
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      write_levels(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Packs 256 two-bit codes as Q2_K / Q3_K store them (the inverse of two_bits).
void pack_two_bits(const uint8_t* codes, uint8_t* qs) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* c = codes + 128 * half;
    for (int l = 0; l < 32; ++l)
      qs[32 * half + l] = static_cast<uint8_t>(c[l] | c[l + 32] << 2 | c[l + 64] << 4 | c[l + 96] << 6);
  }
}

// Q4_K / Q5_K pack eight 6-bit scales and mins into 12 bytes (the inverse of k4_scale_min).
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* scales) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = ls[j];
      scales[j + 4] = lm[j];
    } else {
      scales[j + 4] = static_cast<uint8_t>((ls[j] & 0x0f) | (lm[j] & 0x0f) << 4);
      scales[j - 4] = static_cast<uint8_t>(scales[j - 4] | (ls[j] >> 4) << 6);
      scales[j] = static_cast<uint8_t>(scales[j] | (lm[j] >> 4) << 6);
    }
  }
}

// Shared by Q4_K and Q5_K (ggml's quantize_row_q{4,5}_K_ref), after the search (quant/kquant_search.h) gave a
// scale, min and codes per 32: scales and mins quantized to 6 bits against the super-block's largest, then every
// element requantized against the rounded scale and min (a sub-block whose scale rounds to zero keeps the search's
// codes). Returns the codes in levels.
template <typename Block>
void finish_k_with_min(const float* x, Block& b, int nmax, const float* scales, const float* mins, uint8_t* levels,
                       KCodesFn codes) {
  float max_scale = 0;
  float max_min = 0;
  for (int j = 0; j < 8; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8];
  uint8_t lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
  }
  pack_scale_min_k4(ls, lm, b.scales);
  b.d = fp32_to_fp16(max_scale / 63.f);
  b.dmin = fp32_to_fp16(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    int sc;
    int m;
    k4_scale_min(b.scales, j, sc, m);
    const float d = fp16_to_fp32(b.d) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = fp16_to_fp32(b.dmin) * static_cast<float>(m);
    codes(x + 32 * j, d, dm, nmax, levels + 32 * j);
  }
}

// Codes 64 c + l (low nibble) and 64 c + 32 + l (high nibble) share byte 32 c + l.
void pack_q4_k(const uint8_t* levels, BlockQ4_K& b) {
  for (int c = 0; c < kQK_K / 64; ++c)
    for (int l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<uint8_t>(levels[64 * c + l] | levels[64 * c + 32 + l] << 4);
}

void pack_q5_k(const uint8_t* levels, BlockQ5_K& b) {
  for (int k = 0; k < kQK_K; ++k) {
    const int low = levels[k] & 0x0f;
    if (levels[k] > 15) b.qh[k % 32] = static_cast<uint8_t>(b.qh[k % 32] | 1 << (k / 32));
    uint8_t& byte = b.qs[(k / 64) * 32 + k % 32];
    byte = static_cast<uint8_t>(byte | ((k % 64) < 32 ? low : low << 4));
  }
}

// Rows of Q4_K or Q5_K: the search for up to kChunk super-blocks at a time, then each one finished and packed.
template <typename Block>
void quantize_k_rows(const float* src, void* dst, int64_t n, const KSearchParams& p, KSubblockSearchFn search,
                     KCodesFn codes) {
  constexpr int64_t kChunk = 8;
  float scales[8 * kChunk], mins[8 * kChunk];
  uint8_t levels[kQK_K * kChunk];
  for (int64_t i0 = 0; i0 < n / kQK_K; i0 += kChunk) {
    const int64_t nb = std::min(kChunk, n / kQK_K - i0);
    search(src + i0 * kQK_K, nb, p, scales, mins, levels);
    for (int64_t c = 0; c < nb; ++c) {
      Block b{};
      uint8_t* lv = levels + c * kQK_K;
      finish_k_with_min(src + (i0 + c) * kQK_K, b, p.nmax, scales + 8 * c, mins + 8 * c, lv, codes);
      if constexpr (std::is_same_v<Block, BlockQ4_K>)
        pack_q4_k(lv, b);
      else
        pack_q5_k(lv, b);
      store_block(dst, i0 + c, b);
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------ dequantize

void dequantize_q2_k(const void* src, float* dst, int64_t n) { dequantize_k<BlockQ2_K>(src, dst, n); }
void dequantize_q3_k(const void* src, float* dst, int64_t n) { dequantize_k<BlockQ3_K>(src, dst, n); }
void dequantize_q4_k(const void* src, float* dst, int64_t n) { dequantize_k<BlockQ4_K>(src, dst, n); }
void dequantize_q5_k(const void* src, float* dst, int64_t n) { dequantize_k<BlockQ5_K>(src, dst, n); }
void dequantize_q6_k(const void* src, float* dst, int64_t n) { dequantize_k<BlockQ6_K>(src, dst, n); }

void dequantize_q8_k(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const auto b = load_block<BlockQ8_K>(src, i);
    for (int k = 0; k < kQK_K; ++k) dst[i * kQK_K + k] = b.d * static_cast<float>(b.qs[k]);
  }
}

// ------------------------------------------------------------------------------------------------ quantize

void quantize_q2_k(const float* src, void* dst, int64_t n) {
  constexpr float kQ4Scale = 15.f;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    uint8_t levels[kQK_K];
    uint8_t levels_aux[16];
    float weights[16];
    float scales[16];
    float mins[16];
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] =
          make_qkx2_quants(16, 3, x + 16 * j, weights, levels + 16 * j, &mins[j], levels_aux, -0.5f, 0.1f, 15, true);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    BlockQ2_K b{};
    if (max_scale > 0) {
      const float iscale = kQ4Scale / max_scale;
      for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      b.d = fp32_to_fp16(max_scale / kQ4Scale);
    } else {
      b.d = fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = kQ4Scale / max_min;
      for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(b.scales[j] | nearest_int(iscale * mins[j]) << 4);
      b.dmin = fp32_to_fp16(max_min / kQ4Scale);
    } else {
      b.dmin = fp32_to_fp16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j] & 0x0f);
      if (d == 0.0f) continue;
      const float dm = fp16_to_fp32(b.dmin) * static_cast<float>(b.scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int((x[16 * j + ii] + dm) / d);
        levels[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    pack_two_bits(levels, b.qs);
    store_block(dst, i, b);
  }
}

void quantize_q3_k(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    int8_t levels[kQK_K];
    float scales[16];
    float max_scale = 0;
    float amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, levels + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    BlockQ3_K b{};
    if (max_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        const int l = std::max(-32, std::min(31, nearest_int(iscale * scales[j]))) + 32;
        if (j < 8) {
          b.scales[j] = static_cast<uint8_t>(l & 0x0f);
        } else {
          b.scales[j - 8] = static_cast<uint8_t>(b.scales[j - 8] | (l & 0x0f) << 4);
        }
        b.scales[j % 4 + 8] = static_cast<uint8_t>(b.scales[j % 4 + 8] | (l >> 4) << (2 * (j / 4)));
      }
      b.d = fp32_to_fp16(1 / iscale);
    } else {
      b.d = fp32_to_fp16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const int sc = q3_scale_code(b.scales, j) - 32;
      const float d = fp16_to_fp32(b.d) * static_cast<float>(sc);
      if (d == 0.0f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        levels[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }
    // Codes are 0..7 now: the third bit goes to hmask (element k: byte k % 32, bit k / 32), the rest to qs.
    uint8_t low[kQK_K];
    for (int k = 0; k < kQK_K; ++k) {
      int l = levels[k];
      if (l > 3) {
        b.hmask[k % 32] = static_cast<uint8_t>(b.hmask[k % 32] | 1 << (k / 32));
        l -= 4;
      }
      low[k] = static_cast<uint8_t>(l);
    }
    pack_two_bits(low, b.qs);
    store_block(dst, i, b);
  }
}

void quantize_q4_k(const float* src, void* dst, int64_t n) {
  quantize_k_rows<BlockQ4_K>(src, dst, n, k_search_params(GgmlType::Q4_K), &k_search_reference, &k_codes_reference);
}

void quantize_q5_k(const float* src, void* dst, int64_t n) {
  quantize_k_rows<BlockQ5_K>(src, dst, n, k_search_params(GgmlType::Q5_K), &k_search_reference, &k_codes_reference);
}

void quantize_q6_k(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    int8_t levels[kQK_K];
    float scales[16];
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, levels + 16 * ib);
      const float abs_scale = std::fabs(scales[ib]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scales[ib];
      }
    }
    BlockQ6_K b{};  // an all-zero super-block (every scale below kGroupMaxEps) stays all zero bytes
    if (max_abs_scale >= kGroupMaxEps) {
      const float iscale = -128.f / max_scale;
      b.d = fp32_to_fp16(1 / iscale);
      for (int ib = 0; ib < 16; ++ib)
        b.scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
      for (int j = 0; j < 16; ++j) {
        const float d = fp16_to_fp32(b.d) * static_cast<float>(b.scales[j]);
        if (d == 0.0f) continue;
        for (int ii = 0; ii < 16; ++ii) {
          const int l = nearest_int(x[16 * j + ii] / d);
          levels[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
        }
      }
      for (int k = 0; k < kQK_K; ++k) {
        const int half = k / 128;
        const int quarter = (k % 128) / 32;
        const int l = k % 32;
        uint8_t& low_byte = b.ql[half * 64 + l + (quarter % 2) * 32];
        const int low = levels[k] & 0x0f;
        low_byte = static_cast<uint8_t>(low_byte | (quarter < 2 ? low : low << 4));
        uint8_t& high_byte = b.qh[half * 32 + l];
        high_byte = static_cast<uint8_t>(high_byte | (levels[k] >> 4) << (2 * quarter));
      }
    }
    store_block(dst, i, b);
  }
}

// ------------------------------------------------------------------------------------------------ dot products

float vec_dot_q2_k(int64_t n, const void* w, const void* a) { return vec_dot_k<BlockQ2_K>(n, w, a); }
float vec_dot_q3_k(int64_t n, const void* w, const void* a) { return vec_dot_k<BlockQ3_K>(n, w, a); }
float vec_dot_q4_k(int64_t n, const void* w, const void* a) { return vec_dot_k<BlockQ4_K>(n, w, a); }
float vec_dot_q5_k(int64_t n, const void* w, const void* a) { return vec_dot_k<BlockQ5_K>(n, w, a); }
float vec_dot_q6_k(int64_t n, const void* w, const void* a) { return vec_dot_k<BlockQ6_K>(n, w, a); }

}  // namespace hetmoe::quant::ref_detail

namespace hetmoe::quant {

KSearchParams k_search_params(GgmlType type) {
  if (type == GgmlType::Q5_K) return {.nmax = 31, .rmin = -0.5f, .rdelta = 0.1f, .nstep = 15};
  return {.nmax = 15, .rmin = -1.0f, .rdelta = 0.1f, .nstep = 20};
}

void k_search_reference(const float* x, int64_t n_blocks, const KSearchParams& p, float* scales, float* mins,
                        uint8_t* levels) {
  float weights[32];
  uint8_t levels_aux[32];
  for (int64_t j = 0; j < 8 * n_blocks; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
    scales[j] = ref_detail::make_qkx2_quants(32, p.nmax, xj, weights, levels + 32 * j, &mins[j], levels_aux, p.rmin,
                                             p.rdelta, p.nstep, false);
  }
}

void k_codes_reference(const float* x, float d, float dm, int nmax, uint8_t* levels) {
  for (int i = 0; i < 32; ++i)
    levels[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, ref_detail::nearest_int((x[i] + dm) / d))));
}

void quantize_k_rows_with(GgmlType type, const float* src, void* dst, int64_t n, KSubblockSearchFn search,
                          KCodesFn codes) {
  if (type != GgmlType::Q4_K && type != GgmlType::Q5_K)
    throw std::invalid_argument("quantize_k_rows_with: only Q4_K and Q5_K have this search");
  if (n % kQK_K != 0) throw std::invalid_argument("quantize_k_rows_with: rows are whole super-blocks of 256");
  if (type == GgmlType::Q4_K)
    ref_detail::quantize_k_rows<BlockQ4_K>(src, dst, n, k_search_params(type), search, codes);
  else
    ref_detail::quantize_k_rows<BlockQ5_K>(src, dst, n, k_search_params(type), search, codes);
}

}  // namespace hetmoe::quant
