// Weight quantizers for model conversion (hetmoe split) with AVX-512, each giving the reference's bytes (tested):
// - the low-bit split formats (quant/lowbit_fit.h): a group of 64 or 128 values lives in 4 or 8 vectors for its
//   whole fit, and one pass (levels at a candidate scale and offset, their three sums) is a few instructions a
//   vector where the scalar pass spends a division and three adds a value; the sums and the extremes are lane-tree
//   sums in the scalar pass's order;
// - Q4_K and Q5_K (W^R): the scale search (quant/kquant_search.h) of 16 sub-blocks at once, one per lane, and the
//   final codes 16 values a vector;
// - Q5_0 (W^R of rows that 256 does not divide) and its dequantizer.
#include <immintrin.h>

#include <bit>
#include <cstddef>
#include <cstring>

#include "cpu_kernels/avx512/kernels_avx512.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/kquant_search.h"
#include "quant/le_bytes.h"
#include "quant/lowbit.h"
#include "quant/lowbit_fit.h"
#include "quant/ref.h"

namespace hetmoe::cpu::avx512 {
namespace {

namespace fit = quant::lowbit_fit;

// Lane l = op(lane l, lane l + k) for k = 8, 4, 2, 1, as fit::lane_tree does (op(low half, high half) each step).
template <typename Op256, typename Op128>
float tree(__m512 v, Op256 op256, Op128 op128) {
  const __m256 a = op256(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = op128(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = op128(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(op128(b, _mm_movehdup_ps(b)));
}
float tree_sum(__m512 v) {
  return tree(
      v, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); }, [](__m128 a, __m128 b) { return _mm_add_ps(a, b); });
}

template <int kVectors>
struct Group {
  __m512 x[kVectors];

  Group() = default;
  explicit Group(const float* src) {
    for (int v = 0; v < kVectors; ++v) x[v] = _mm512_loadu_ps(src + 16 * v);
  }

  fit::GroupStats stats() const {
    __m512 lo = x[0], hi = x[0], sx = _mm512_setzero_ps(), sxx = _mm512_setzero_ps();
    for (int v = 0; v < kVectors; ++v) {
      lo = _mm512_min_ps(x[v], lo);
      hi = _mm512_max_ps(x[v], hi);
      sx = _mm512_add_ps(sx, x[v]);
      sxx = _mm512_add_ps(sxx, _mm512_mul_ps(x[v], x[v]));
    }
    return {tree(
                lo, [](__m256 a, __m256 b) { return _mm256_min_ps(a, b); },
                [](__m128 a, __m128 b) { return _mm_min_ps(a, b); }),
            tree(
                hi, [](__m256 a, __m256 b) { return _mm256_max_ps(a, b); },
                [](__m128 a, __m128 b) { return _mm_max_ps(a, b); }),
            tree_sum(sx), tree_sum(sxx)};
  }

  // fit::scalar_pass: the levels at (d, m) into q (when not null) and their sums.
  fit::LevelSums pass(float d, float m, float levels, uint8_t* q) const {
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m), top = _mm512_set1_ps(levels);
    const __m512 magic = _mm512_set1_ps(fit::kRoundMagic), zero = _mm512_setzero_ps();
    __m512 sq = zero, sqq = zero, sqx = zero;
#pragma GCC unroll 8
    for (int v = 0; v < kVectors; ++v) {
      __m512 l = _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(_mm512_sub_ps(x[v], mv), dv), magic), magic);
      l = _mm512_min_ps(_mm512_max_ps(l, zero), top);
      if (q) _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * v), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(l)));
      sq = _mm512_add_ps(sq, l);
      sqq = _mm512_add_ps(sqq, _mm512_mul_ps(l, l));
      sqx = _mm512_add_ps(sqx, _mm512_mul_ps(l, x[v]));
    }
    return {tree_sum(sq), tree_sum(sqq), tree_sum(sqx)};
  }
};

// fit::pack_unit's words with BMI2: each word's bits extracted from eight codes' bytes at once.
template <int kBits>
void pack_unit_pext(const uint8_t* q, uint32_t* words) {
  uint64_t b[4];
  std::memcpy(b, q, sizeof(b));  // code j in bits 8 (j % 8) of b[j / 8]
  if constexpr (kBits == 4) {
    for (int k = 0; k < 4; ++k) words[k] = static_cast<uint32_t>(_pext_u64(b[k], 0x0f0f0f0f0f0f0f0full));
  } else {
    constexpr uint64_t kLow = 0x0303030303030303ull, kThird = 0x0404040404040404ull;
    for (int k = 0; k < 2; ++k)
      words[k] = static_cast<uint32_t>(_pext_u64(b[2 * k], kLow) | _pext_u64(b[2 * k + 1], kLow) << 16);
    if constexpr (kBits == 3) {
      words[2] = 0;
      for (int k = 0; k < 4; ++k) words[2] |= static_cast<uint32_t>(_pext_u64(b[k], kThird) << (8 * k));
    }
  }
}

// kCount groups from x on fitted in lockstep (fit::fit_scale_offsets): each group's bytes are those it gets alone.
template <int kBits, int kGroup, int kCount, int kGroups>
void fit_groups(const float* x, uint8_t (&q)[kGroups][kGroup], uint16_t (&d16)[kGroups], uint16_t (&m16)[kGroups],
                int first) {
  constexpr int kLevels = (1 << kBits) - 1;
  Group<kGroup / 16> g[kCount] = {};
  fit::GroupStats stats[kCount];
  for (int k = 0; k < kCount; ++k) {
    g[k] = Group<kGroup / 16>(x + (first + k) * kGroup);
    stats[k] = g[k].stats();
  }
  uint16_t d[kCount], m[kCount];
  fit::fit_scale_offsets<kCount>(
      kGroup, kLevels, stats, [&](int k, float ds, float ms) { return g[k].pass(ds, ms, kLevels, nullptr); }, d, m);
  for (int k = 0; k < kCount; ++k) {
    d16[first + k] = d[k];
    m16[first + k] = m[k];
    const float ds = quant::fp16_to_fp32(d[k]);
    if (ds > 0)
      g[k].pass(ds, quant::fp16_to_fp32(m[k]), kLevels, q[first + k]);
    else
      std::memset(q[first + k], 0, kGroup);
  }
}

// Four groups at a time: one group's fit is a chain of dependent passes and solves, four chains keep the core busy.
template <int kBits, int kGroup>
void quantize_hq(const float* src, void* dst, int64_t n) {
  constexpr int kGroups = 4;
  fit::quantize_row<kBits, kGroup, kGroups>(
      src, dst, n,
      [](const float* x, int count, uint8_t(&q)[kGroups][kGroup], uint16_t(&d16)[kGroups], uint16_t(&m16)[kGroups]) {
        if (count == kGroups) {
          fit_groups<kBits, kGroup, kGroups>(x, q, d16, m16, 0);
        } else {
          for (int k = 0; k < count; ++k) fit_groups<kBits, kGroup, 1>(x, q, d16, m16, k);
        }
      },
      pack_unit_pext<kBits>);
}

// ggml's make_qkx2_quants for 16 sub-blocks of 32 at once, sub-block j in lane j: every expression of the
// reference (quant/ref_kquants.cpp) in the same order, lane by lane, so the same floats come out. `two`: x holds
// two super-blocks (16 sub-blocks), else one, whose 8 sub-blocks lanes 8-15 repeat.
void search16(const float* x, bool two, const quant::KSearchParams& p, float* scales, float* mins, uint8_t* levels) {
  constexpr int kN = 32;
  const __m512i first =
      two ? _mm512_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448, 480)
          : _mm512_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224, 0, 32, 64, 96, 128, 160, 192, 224);
  const __m512 zero = _mm512_setzero_ps(), magic = _mm512_set1_ps(fit::kRoundMagic);
  const __m512 top = _mm512_set1_ps(static_cast<float>(p.nmax));
  // nearest_int(v) clamped to [0, nmax], as a float.
  const auto level = [&](__m512 v) {
    return _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_add_ps(v, magic), magic), zero), top);
  };
  __m512 xt[kN], w[kN], best_levels[kN], trial[kN];
  __m512 sum_x2 = zero;
  for (int i = 0; i < kN; ++i) {
    xt[i] = _mm512_i32gather_ps(_mm512_add_epi32(first, _mm512_set1_epi32(i)), x, 4);
    sum_x2 = _mm512_add_ps(sum_x2, _mm512_mul_ps(xt[i], xt[i]));
  }
  const __m512 av_x = _mm512_sqrt_ps(_mm512_div_ps(sum_x2, _mm512_set1_ps(32.0f)));
  for (int i = 0; i < kN; ++i) w[i] = _mm512_add_ps(av_x, _mm512_abs_ps(xt[i]));
  __m512 min = xt[0], max = xt[0], sum_w = w[0], sum_x = _mm512_mul_ps(w[0], xt[0]);
  for (int i = 1; i < kN; ++i) {
    min = _mm512_min_ps(xt[i], min);
    max = _mm512_max_ps(xt[i], max);
    sum_w = _mm512_add_ps(sum_w, w[i]);
    sum_x = _mm512_add_ps(sum_x, _mm512_mul_ps(w[i], xt[i]));
  }
  min = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(min, zero, _CMP_GT_OQ), min, zero);
  const __mmask16 flat = _mm512_cmp_ps_mask(max, min, _CMP_EQ_OQ);
  // A range so narrow (subnormal values) that nmax / range overflows, or NaN: the reference's integer rounding of
  // an infinite level wraps to code 0 where this float rounding would clamp to nmax. Rare: the reference does those.
  const __mmask16 narrow =
      static_cast<__mmask16>(~flat & _mm512_cmp_ps_mask(_mm512_sub_ps(max, min), _mm512_set1_ps(1e-36f), _CMP_NGE_UQ));
  if (narrow) {
    quant::k_search_reference(x, two ? 2 : 1, p, scales, mins, levels);
    return;
  }
  __m512 iscale = _mm512_div_ps(top, _mm512_sub_ps(max, min));
  __m512 scale = _mm512_div_ps(_mm512_set1_ps(1.0f), iscale);
  __m512 best_error = zero;
  for (int i = 0; i < kN; ++i) {
    best_levels[i] = level(_mm512_mul_ps(iscale, _mm512_sub_ps(xt[i], min)));
    __m512 diff = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(scale, best_levels[i]), min), xt[i]);
    diff = _mm512_mul_ps(diff, diff);
    best_error = _mm512_add_ps(best_error, _mm512_mul_ps(w[i], diff));
  }
  for (int is = 0; is <= p.nstep; ++is) {
    const float numerator = p.rmin + p.rdelta * static_cast<float>(is) + static_cast<float>(p.nmax);
    iscale = _mm512_div_ps(_mm512_set1_ps(numerator), _mm512_sub_ps(max, min));
    __m512 sum_l = zero, sum_l2 = zero, sum_xl = zero;
    for (int i = 0; i < kN; ++i) {
      trial[i] = level(_mm512_mul_ps(iscale, _mm512_sub_ps(xt[i], min)));
      const __m512 wl = _mm512_mul_ps(w[i], trial[i]);
      sum_l = _mm512_add_ps(sum_l, wl);
      sum_l2 = _mm512_add_ps(sum_l2, _mm512_mul_ps(wl, trial[i]));
      sum_xl = _mm512_add_ps(sum_xl, _mm512_mul_ps(wl, xt[i]));
    }
    const __m512 det = _mm512_sub_ps(_mm512_mul_ps(sum_w, sum_l2), _mm512_mul_ps(sum_l, sum_l));
    const __mmask16 solvable = _mm512_cmp_ps_mask(det, zero, _CMP_GT_OQ);
    if (!solvable) continue;
    __m512 this_scale = _mm512_div_ps(_mm512_sub_ps(_mm512_mul_ps(sum_w, sum_xl), _mm512_mul_ps(sum_x, sum_l)), det);
    __m512 this_min = _mm512_div_ps(_mm512_sub_ps(_mm512_mul_ps(sum_l2, sum_x), _mm512_mul_ps(sum_l, sum_xl)), det);
    const __mmask16 positive = _mm512_cmp_ps_mask(this_min, zero, _CMP_GT_OQ);
    this_min = _mm512_mask_blend_ps(positive, this_min, zero);
    this_scale = _mm512_mask_blend_ps(positive, this_scale, _mm512_div_ps(sum_xl, sum_l2));
    __m512 cur_error = zero;
    for (int i = 0; i < kN; ++i) {
      __m512 diff = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(this_scale, trial[i]), this_min), xt[i]);
      diff = _mm512_mul_ps(diff, diff);
      cur_error = _mm512_add_ps(cur_error, _mm512_mul_ps(w[i], diff));
    }
    const __mmask16 better = solvable & _mm512_cmp_ps_mask(cur_error, best_error, _CMP_LT_OQ);
    if (!better) continue;
    for (int i = 0; i < kN; ++i) best_levels[i] = _mm512_mask_blend_ps(better, best_levels[i], trial[i]);
    best_error = _mm512_mask_blend_ps(better, best_error, cur_error);
    scale = _mm512_mask_blend_ps(better, scale, this_scale);
    min = _mm512_mask_blend_ps(better, min, this_min);
  }
  // A flat sub-block (max == min after the min was clipped at 0): codes 0, scale 0.
  scale = _mm512_mask_blend_ps(flat, scale, zero);
  const int lanes = two ? 16 : 8;
  alignas(64) float scale_out[16], min_out[16];
  _mm512_store_ps(scale_out, scale);
  _mm512_store_ps(min_out, _mm512_sub_ps(zero, min));
  alignas(16) uint8_t codes[kN][16];
  for (int i = 0; i < kN; ++i) {
    const __m512 l = _mm512_mask_blend_ps(flat, best_levels[i], zero);
    _mm_store_si128(reinterpret_cast<__m128i*>(codes[i]), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(l)));
  }
  for (int j = 0; j < lanes; ++j) {
    scales[j] = scale_out[j];
    mins[j] = min_out[j];
    for (int i = 0; i < kN; ++i) levels[32 * j + i] = codes[i][j];
  }
}

void k_search(const float* x, int64_t n_blocks, const quant::KSearchParams& p, float* scales, float* mins,
              uint8_t* levels) {
  for (int64_t b = 0; b < n_blocks; b += 2)
    search16(x + b * quant::kQK_K, n_blocks - b >= 2, p, scales + 8 * b, mins + 8 * b, levels + quant::kQK_K * b);
}

// The reference's final codes (quant::k_codes_reference), 16 values a vector: the same division and rounding.
void k_codes(const float* x, float d, float dm, int nmax, uint8_t* levels) {
  const __m512 vd = _mm512_set1_ps(d), vdm = _mm512_set1_ps(dm), magic = _mm512_set1_ps(fit::kRoundMagic);
  const __m512i mantissa = _mm512_set1_epi32(0x007fffff), bias = _mm512_set1_epi32(0x00400000);
  for (int h = 0; h < 2; ++h) {
    const __m512 v = _mm512_div_ps(_mm512_add_ps(_mm512_loadu_ps(x + 16 * h), vdm), vd);
    // nearest_int: the rounded integer sits in the low mantissa bits of v + 1.5 * 2^23.
    __m512i l = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(_mm512_add_ps(v, magic)), mantissa), bias);
    l = _mm512_max_epi32(_mm512_min_epi32(l, _mm512_set1_epi32(nmax)), _mm512_setzero_si512());
    _mm_storeu_si128(reinterpret_cast<__m128i*>(levels + 16 * h), _mm512_cvtepi32_epi8(l));
  }
}

template <quant::GgmlType kType>
void quantize_k(const float* src, void* dst, int64_t n) {
  quant::quantize_k_rows_with(kType, src, dst, n, &k_search, &k_codes);
}

// Q5_0 as the reference (ggml's quantize_row_q5_0_ref): d = the signed value of largest magnitude (the first on
// ties) / -16, codes min(31, trunc(x / d + 16.5)) with x * (1 / d) + 16.5 rounded twice, never fused. A block whose
// d is zero, or one holding a NaN, goes to the reference (its sign of zero and its skipping of NaNs).
void quantize_q5_0(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / quant::kQK5_0; ++i) {
    const float* x = src + i * quant::kQK5_0;
    uint8_t* block = out + i * sizeof(quant::BlockQ5_0);
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const __m512 alo = _mm512_abs_ps(lo), ahi = _mm512_abs_ps(hi);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(alo, ahi));
    const bool nan = (_mm512_cmp_ps_mask(lo, lo, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(hi, hi, _CMP_UNORD_Q)) != 0;
    const __m512 vmax = _mm512_set1_ps(amax);
    const uint32_t at = static_cast<uint32_t>(_mm512_cmp_ps_mask(alo, vmax, _CMP_EQ_OQ)) |
                        static_cast<uint32_t>(_mm512_cmp_ps_mask(ahi, vmax, _CMP_EQ_OQ)) << 16;
    const float d = at != 0 ? x[std::countr_zero(at)] / -16 : 0.0f;
    if (nan || d == 0.0f) {  // also a magnitude so small that d underflows: the reference's 1 / d is then 0
      quant::quantize_row(quant::GgmlType::Q5_0, x, block, quant::kQK5_0);
      continue;
    }
    const __m512 id = _mm512_set1_ps(1.0f / d), half = _mm512_set1_ps(16.5f);
    const __m512i top = _mm512_set1_epi32(31);
    const __m512i c0 = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(lo, id), half)), top);
    const __m512i c1 = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(hi, id), half)), top);
    const __m512i nibble = _mm512_set1_epi32(15), fifth = _mm512_set1_epi32(16);
    const __m128i qs = _mm512_cvtepi32_epi8(
        _mm512_or_si512(_mm512_and_si512(c0, nibble), _mm512_slli_epi32(_mm512_and_si512(c1, nibble), 4)));
    const uint32_t qh = static_cast<uint32_t>(_mm512_test_epi32_mask(c0, fifth)) |
                        static_cast<uint32_t>(_mm512_test_epi32_mask(c1, fifth)) << 16;
    quant::store_u16_le(block + offsetof(quant::BlockQ5_0, d), quant::fp32_to_fp16(d));
    quant::store_u32_le(block + offsetof(quant::BlockQ5_0, qh), qh);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(block + offsetof(quant::BlockQ5_0, qs)), qs);
  }
}

}  // namespace

// Q4_K rows to floats as the reference does it: per group of 32, dl = d * scale and ml = dmin * min, then
// dl * q - ml (a product and a difference, never fused).
void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const __m256i nibble = _mm256_set1_epi8(15);
  for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
    const quant::BlockQ4_K b = quant::load_block<quant::BlockQ4_K>(src, i);
    const float d = quant::fp16_to_fp32(b.d), dmin = quant::fp16_to_fp32(b.dmin);
    float* y = dst + i * quant::kQK_K;
    for (int j = 0; j < 4; ++j) {  // groups 2j (low nibbles) and 2j + 1 (high nibbles) of bytes qs[32j ...]
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * j));
      const __m256i codes[2] = {_mm256_and_si256(bytes, nibble), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble)};
      for (int h = 0; h < 2; ++h) {
        int scale, min;
        quant::k4_scale_min(b.scales, 2 * j + h, scale, min);
        const __m512 dl = _mm512_set1_ps(d * static_cast<float>(scale)),
                     ml = _mm512_set1_ps(dmin * static_cast<float>(min));
        const __m128i halves[2] = {_mm256_castsi256_si128(codes[h]), _mm256_extracti128_si256(codes[h], 1)};
        for (int k = 0; k < 2; ++k) {
          const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(halves[k]));
          _mm512_storeu_ps(y + (2 * j + h) * 32 + 16 * k, _mm512_sub_ps(_mm512_mul_ps(dl, q), ml));
        }
      }
    }
  }
}

// Q5_0 rows to floats as the reference: (code - 16) * d per value.
void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint8_t*>(src);
  const __m512i nibble = _mm512_set1_epi32(15), fifth = _mm512_set1_epi32(16), offset = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n / quant::kQK5_0; ++i) {
    const uint8_t* block = in + i * sizeof(quant::BlockQ5_0);
    const __m512 d = _mm512_set1_ps(quant::fp16_to_fp32(quant::load_u16_le(block + offsetof(quant::BlockQ5_0, d))));
    const uint32_t qh = quant::load_u32_le(block + offsetof(quant::BlockQ5_0, qh));
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(quant::BlockQ5_0, qs))));
    const __m512i low[2] = {_mm512_and_si512(bytes, nibble), _mm512_srli_epi32(bytes, 4)};
    for (int h = 0; h < 2; ++h) {
      const __m512i code = _mm512_mask_or_epi32(low[h], static_cast<__mmask16>(qh >> (16 * h)), low[h], fifth);
      _mm512_storeu_ps(dst + i * quant::kQK5_0 + 16 * h,
                       _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(code, offset)), d));
    }
  }
}

// Codes 16 h .. 16 h + 15 (h = 0, 1) of one 32-value unit of an HQ row, from its kBits words (quant/lowbit.h).
template <int kBits>
__m512i unit_codes16(const uint32_t* words, int h) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  if constexpr (kBits == 4) {  // words 2h (lanes 0-7) and 2h + 1 (lanes 8-15), 4 bits apart
    const __m512i w = _mm512_mask_set1_epi32(_mm512_set1_epi32(static_cast<int>(words[2 * h])), 0xff00,
                                             static_cast<int>(words[2 * h + 1]));
    return _mm512_and_si512(_mm512_srlv_epi32(w, _mm512_slli_epi32(_mm512_and_si512(lane, _mm512_set1_epi32(7)), 2)),
                            _mm512_set1_epi32(15));
  } else {
    __m512i q =
        _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(words[h])), _mm512_slli_epi32(lane, 1)),
                         _mm512_set1_epi32(3));
    if constexpr (kBits == 3) {  // the third bit of value 16 h + lane: bit 16 h + lane of word 2
      const __m512i high = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(words[2])),
                                                              _mm512_add_epi32(lane, _mm512_set1_epi32(16 * h))),
                                            _mm512_set1_epi32(1));
      q = _mm512_or_si512(q, _mm512_slli_epi32(high, 2));
    }
    return q;
  }
}

// An HQ row to floats as the reference: d * q + m per value (a product and a sum, never fused).
template <int kBits, int kGroup>
void dequantize_hq(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint8_t*>(src);
  const quant::LowBitRowParts parts = quant::lowbit_row_parts(kBits, kGroup, n);
  for (int64_t g = 0; g < n / kGroup; ++g) {
    const __m512 d = _mm512_set1_ps(quant::fp16_to_fp32(quant::load_u16_le(in + parts.scales + 2 * g)));
    const __m512 m = _mm512_set1_ps(quant::fp16_to_fp32(quant::load_u16_le(in + parts.offsets + 2 * g)));
    for (int u = 0; u < kGroup / quant::kLowBitUnit; ++u) {
      uint32_t words[kBits];
      const int64_t unit = g * (kGroup / quant::kLowBitUnit) + u;
      std::memcpy(words, in + parts.codes + unit * kBits * 4, sizeof(words));  // little-endian, as stored
      for (int h = 0; h < 2; ++h) {
        const __m512 q = _mm512_cvtepi32_ps(unit_codes16<kBits>(words, h));
        _mm512_storeu_ps(dst + unit * quant::kLowBitUnit + 16 * h, _mm512_add_ps(_mm512_mul_ps(d, q), m));
      }
    }
  }
}

void install_quantize(KernelTable& table) {
  using quant::GgmlType;
  table.quantize_weights[kernel_slot(GgmlType::HQ2_G64)] = &quantize_hq<2, 64>;
  table.quantize_weights[kernel_slot(GgmlType::HQ2_G128)] = &quantize_hq<2, 128>;
  table.quantize_weights[kernel_slot(GgmlType::HQ3_G64)] = &quantize_hq<3, 64>;
  table.quantize_weights[kernel_slot(GgmlType::HQ3_G128)] = &quantize_hq<3, 128>;
  table.quantize_weights[kernel_slot(GgmlType::HQ4_G64)] = &quantize_hq<4, 64>;
  table.quantize_weights[kernel_slot(GgmlType::HQ4_G128)] = &quantize_hq<4, 128>;
  table.quantize_weights[kernel_slot(GgmlType::Q4_K)] = &quantize_k<GgmlType::Q4_K>;
  table.quantize_weights[kernel_slot(GgmlType::Q5_K)] = &quantize_k<GgmlType::Q5_K>;
  table.quantize_weights[kernel_slot(GgmlType::Q5_0)] = &quantize_q5_0;
  table.dequantize_weights[kernel_slot(GgmlType::Q4_K)] = &dequantize_q4_k;
  table.dequantize_weights[kernel_slot(GgmlType::Q5_0)] = &dequantize_q5_0;
  table.dequantize_weights[kernel_slot(GgmlType::HQ2_G64)] = &dequantize_hq<2, 64>;
  table.dequantize_weights[kernel_slot(GgmlType::HQ2_G128)] = &dequantize_hq<2, 128>;
  table.dequantize_weights[kernel_slot(GgmlType::HQ3_G64)] = &dequantize_hq<3, 64>;
  table.dequantize_weights[kernel_slot(GgmlType::HQ3_G128)] = &dequantize_hq<3, 128>;
  table.dequantize_weights[kernel_slot(GgmlType::HQ4_G64)] = &dequantize_hq<4, 64>;
  table.dequantize_weights[kernel_slot(GgmlType::HQ4_G128)] = &dequantize_hq<4, 128>;
}

}  // namespace hetmoe::cpu::avx512
