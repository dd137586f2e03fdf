#pragma once

// The quantizer of the low-bit split formats (quant/lowbit.h), written once for the scalar reference and the SIMD
// tiers. Each group's scale d and offset m are fitted by least squares: from the full range and from a range shrunk
// by 5% at both ends, levels are assigned at the candidate (d, m) as stored (rounded to fp16), the candidate's error
// follows from the sums of those levels, and the least-squares (d, m) for those levels is the next candidate (four
// times per start). The candidate with the smallest error is kept, so the fit is never worse than quantizing over
// the plain [min, max] range.
//
// A tier supplies one pass: the levels of a group at (d, m) and their sums. Every sum is taken in kFitLanes lanes
// (value i into lane i % kFitLanes, in order) and the lanes added as a tree (lane l += lane l + 8, then + 4, + 2,
// + 1), the order a 16-lane vector sums them; so a tier's pass gives the reference's sums bit for bit, and every
// tier writes the same bytes.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/half.h"
#include "quant/le_bytes.h"
#include "quant/lowbit.h"

namespace hetmoe::quant::lowbit_fit {

inline constexpr int kFitLanes = 16;
// Adding then subtracting 1.5 * 2^23 rounds a float to the nearest integer, ties to even (|v| < 2^22).
inline constexpr float kRoundMagic = 12582912.0f;

// The sums of a group under one assignment of levels q: sum q, sum q^2, sum q x.
struct LevelSums {
  float q = 0, qq = 0, qx = 0;
};

// Lane l = op(lane l, lane l + k) for k = 8, 4, 2, 1: lane 0 ends with the total (or the extreme).
template <typename Op>
float lane_tree(float (&lanes)[kFitLanes], Op op) {
  for (int k = kFitLanes / 2; k >= 1; k /= 2)
    for (int l = 0; l < k; ++l) lanes[l] = op(lanes[l], lanes[l + k]);
  return lanes[0];
}
inline float lane_tree(float (&lanes)[kFitLanes]) {
  return lane_tree(lanes, [](float a, float b) { return a + b; });
}
// Minimum and maximum as minps / maxps take them (a < b ? a : b): the same zero's sign whatever the tier.
inline float min_ps(float a, float b) { return a < b ? a : b; }
inline float max_ps(float a, float b) { return a > b ? a : b; }

// The level of x at scale d > 0 and offset m: (x - m) / d rounded to the nearest integer (ties to even) and clamped
// to [0, levels], each step as the vector instructions do it (max(v, 0) is v > 0 ? v : 0, as maxps).
inline float level_at(float x, float d, float m, float levels) {
  return min_ps(max_ps(((x - m) / d + kRoundMagic) - kRoundMagic, 0.0f), levels);
}

// The scalar pass: the levels at (d, m) into q (when not null) and their lane-tree sums.
inline LevelSums scalar_pass(const float* x, int n, float d, float m, float levels, uint8_t* q) {
  float sq[kFitLanes] = {}, sqq[kFitLanes] = {}, sqx[kFitLanes] = {};
  for (int i = 0; i < n; ++i) {
    const float l = level_at(x[i], d, m, levels);
    if (q) q[i] = static_cast<uint8_t>(l);
    sq[i % kFitLanes] += l;
    sqq[i % kFitLanes] += l * l;
    sqx[i % kFitLanes] += l * x[i];
  }
  return {lane_tree(sq), lane_tree(sqq), lane_tree(sqx)};
}

// A group's minimum and maximum, sum x and sum x^2 (lane-tree sums).
struct GroupStats {
  float lo = 0, hi = 0, sx = 0, sxx = 0;
};

// n is a multiple of kFitLanes; the extremes are taken per lane, then as a tree, as the sums are.
inline GroupStats scalar_stats(const float* x, int n) {
  float lo[kFitLanes], hi[kFitLanes], sx[kFitLanes] = {}, sxx[kFitLanes] = {};
  for (int l = 0; l < kFitLanes; ++l) lo[l] = hi[l] = x[l];
  for (int i = 0; i < n; ++i) {
    lo[i % kFitLanes] = min_ps(x[i], lo[i % kFitLanes]);
    hi[i % kFitLanes] = max_ps(x[i], hi[i % kFitLanes]);
    sx[i % kFitLanes] += x[i];
    sxx[i % kFitLanes] += x[i] * x[i];
  }
  return {lane_tree(lo, min_ps), lane_tree(hi, max_ps), lane_tree(sx), lane_tree(sxx)};
}

// The fitted fp16 scales and offsets of kGroups groups of n values each, fitted in lockstep: group k's candidates,
// passes and least squares are those it would get alone (the same floats and doubles in the same order), but the
// groups' independent chains of pass, sums and solve sit side by side, where the processor overlaps them.
// pass(k, d, m) returns group k's level sums at d > 0 and m (the levels are all 0 at d = 0: a constant group, or a
// scale that rounds to zero).
template <int kGroups, typename Pass>
void fit_scale_offsets(int n, int levels, const GroupStats (&s)[kGroups], Pass&& pass, uint16_t (&d16)[kGroups],
                       uint16_t (&m16)[kGroups]) {
  double best[kGroups];
  const double nd = n;
  for (int k = 0; k < kGroups; ++k) best[k] = INFINITY;
  for (const float shrink : {0.0f, 0.05f}) {
    float m[kGroups], d[kGroups];
    bool active[kGroups];
    for (int k = 0; k < kGroups; ++k) {
      m[k] = s[k].lo + shrink * (s[k].hi - s[k].lo);
      d[k] = (s[k].hi - s[k].lo) * (1 - 2 * shrink) / static_cast<float>(levels);
      active[k] = true;
    }
    for (int iter = 0; iter <= 4; ++iter) {
      uint16_t dh[kGroups], mh[kGroups];
      double ds[kGroups], ms[kGroups];
      LevelSums l[kGroups];
      for (int k = 0; k < kGroups; ++k) {
        if (!active[k]) continue;
        dh[k] = fp32_to_fp16(d[k] > 0 ? d[k] : 0.0f);
        mh[k] = fp32_to_fp16(m[k]);
        ds[k] = fp16_to_fp32(dh[k]);
        ms[k] = fp16_to_fp32(mh[k]);
        l[k] = ds[k] > 0 ? pass(k, static_cast<float>(ds[k]), static_cast<float>(ms[k])) : LevelSums{};
      }
      bool any = false;
      for (int k = 0; k < kGroups; ++k) {
        if (!active[k]) continue;
        const double sx = s[k].sx, sxx = s[k].sxx;
        // sum (ds q + ms - x)^2, expanded.
        const double e = sxx + ds[k] * ds[k] * l[k].qq + nd * ms[k] * ms[k] + 2 * ds[k] * ms[k] * l[k].q -
                         2 * ds[k] * l[k].qx - 2 * ms[k] * sx;
        if (e < best[k]) {
          best[k] = e;
          d16[k] = dh[k];
          m16[k] = mh[k];
        }
        // Least squares of x ~ d q + m for these levels; none after the last candidate, for a zero scale, or with
        // every value on one level.
        const double det = nd * l[k].qq - static_cast<double>(l[k].q) * l[k].q;
        if (iter == 4 || !(ds[k] > 0) || det <= 0) {
          active[k] = false;
          continue;
        }
        const double dn = (nd * l[k].qx - static_cast<double>(l[k].q) * sx) / det;
        d[k] = static_cast<float>(dn);
        m[k] = static_cast<float>((sx - dn * l[k].q) / nd);
        any = true;
      }
      if (!any) break;
    }
  }
}

// One group's fit: fit_scale_offsets of one.
template <typename Pass>
void fit_scale_offset(int n, int levels, const GroupStats& s, Pass&& pass, uint16_t& d16, uint16_t& m16) {
  const GroupStats stats[1] = {s};
  uint16_t d[1], m[1];
  fit_scale_offsets<1>(
      n, levels, stats, [&](int, float ds, float ms) { return pass(ds, ms); }, d, m);
  d16 = d[0];
  m16 = m[0];
}

// The codes of 32 values into their kBits words (the layout of quant/lowbit.h).
template <int kBits>
void pack_unit(const uint8_t* q, uint32_t* words) {
  std::memset(words, 0, kBits * sizeof(uint32_t));
  for (int j = 0; j < kLowBitUnit; ++j) {
    if constexpr (kBits == 4) {
      words[j / 8] |= static_cast<uint32_t>(q[j]) << (4 * (j % 8));
    } else {
      words[j / 16] |= static_cast<uint32_t>(q[j] & 3) << (2 * (j % 16));
      if constexpr (kBits == 3) words[2] |= static_cast<uint32_t>(q[j] >> 2) << j;
    }
  }
}

// A row of n values into the HQ<kBits>_G<kGroup> layout; fit(x, count, q, d16, m16) gives the codes, scales and
// offsets of the count <= kGroups groups from x on (q[k] the codes of group k), pack(q, words) a unit's words
// (pack_unit's; a SIMD tier passes its own, defined in its own file, so that no function of this header differs
// between files compiled for different instruction sets).
template <int kBits, int kGroup, int kGroups, typename Fit, typename Pack>
void quantize_row(const float* src, void* dst, int64_t n, Fit&& fit, Pack&& pack) {
  auto* out = static_cast<uint8_t*>(dst);
  const LowBitRowParts parts = lowbit_row_parts(kBits, kGroup, n);
  uint8_t q[kGroups][kGroup];
  uint16_t d[kGroups], m[kGroups];
  const int64_t n_groups = n / kGroup;
  for (int64_t g0 = 0; g0 < n_groups; g0 += kGroups) {
    const int count = static_cast<int>(std::min<int64_t>(kGroups, n_groups - g0));
    fit(src + g0 * kGroup, count, q, d, m);
    for (int k = 0; k < count; ++k) {
      const int64_t g = g0 + k;
      store_u16_le(out + parts.scales + 2 * g, d[k]);
      store_u16_le(out + parts.offsets + 2 * g, m[k]);
      for (int u = 0; u < kGroup / kLowBitUnit; ++u) {
        uint32_t words[kBits];
        pack(q[k] + u * kLowBitUnit, words);
        for (int b = 0; b < kBits; ++b)
          store_u32_le(out + ((g * (kGroup / kLowBitUnit) + u) * kBits + b) * 4, words[b]);
      }
    }
  }
}

// The reference fit of one group: the scalar pass throughout.
inline void fit_group(const float* x, int n, int levels, uint8_t* q, uint16_t& d16, uint16_t& m16) {
  const GroupStats s = scalar_stats(x, n);
  const float lv = static_cast<float>(levels);
  fit_scale_offset(
      n, levels, s, [&](float d, float m) { return scalar_pass(x, n, d, m, lv, nullptr); }, d16, m16);
  const float d = fp16_to_fp32(d16);
  if (d > 0)
    scalar_pass(x, n, d, fp16_to_fp32(m16), lv, q);
  else
    std::memset(q, 0, static_cast<size_t>(n));
}

}  // namespace hetmoe::quant::lowbit_fit
