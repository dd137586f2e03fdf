// Quantizers for the IQ grid formats (quant/iq.h). hetmoe's own search, not a port of ggml's: the block vectors
// only pin the decoding, and the test holds these to llama.cpp's error instead (no more than its RMS error on any
// reference row; measured 0.68-0.98 of it).
//
// In every format a group of 8 (IQ3: 4) elements is one grid entry g under a scale c of its sub-block, plus signs
// (IQ2, IQ3) or a shift delta of +-1/8 (IQ1): element = c * (g_j + delta), with t the target it approximates (IQ2,
// IQ3: |x| under the stored sign; IQ1: x itself). For one sub-block the search tries a range of scales; for each it
// rounds t / c - delta element by element to the nearest grid level, looks the rounded pattern up in a table of the
// grid entries nearest to it (built once per format), keeps the entry with the least squared error, then refits c
// by least squares and scores the result. The block's fp16 scale d then follows from the largest sub-block scale,
// the sub-block multipliers 2s + 1 are rounded, and every group is assigned again under the scale it will have.
// Formats whose sign byte holds 7 bits (the eighth is the parity) flip the sign of the group's least costly
// element when the count of negatives is odd, as ggml does.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/iq.h"
#include "quant/iq_grids.h"
#include "quant/ref_formats.h"

namespace hetmoe::quant::ref_detail {
namespace {

constexpr int kNeighbours = 8;        // grid entries kept per rounded pattern (and tried in the final assignment)
constexpr int kSearchNeighbours = 4;  // the nearest of them, tried while searching the scale

enum class Signs { kParity, kExplicit, kShift };

struct GridFormat {
  int group;      // elements per grid entry
  int n_entries;  // grid size
  int sub;        // elements per scale
  int max_ls;     // largest multiplier 2s + 1
  float unit;     // element = d * ls * unit * (g_j + delta)
  Signs signs;
  int shift_span;  // IQ1: elements sharing one shift sign
  int8_t (*element)(int entry, int j);
  std::vector<float> levels;  // the distinct values of g_j, ascending
};

int8_t iq2xxs_element(int e, int j) { return static_cast<int8_t>(iq2xxs_grid[e] >> (8 * j) & 0xff); }
int8_t iq2xs_element(int e, int j) { return static_cast<int8_t>(iq2xs_grid[e] >> (8 * j) & 0xff); }
int8_t iq2s_element(int e, int j) { return static_cast<int8_t>(iq2s_grid[e] >> (8 * j) & 0xff); }
int8_t iq3xxs_element(int e, int j) { return static_cast<int8_t>(iq3xxs_grid[e] >> (8 * j) & 0xff); }
int8_t iq3s_element(int e, int j) { return static_cast<int8_t>(iq3s_grid[e] >> (8 * j) & 0xff); }
int8_t iq1s_element(int e, int j) { return static_cast<int8_t>(iq1s_grid[e] >> (8 * j) & 0xff); }

// The grid entries as floats and, for every pattern of per-element level indices, the entries nearest to it.
struct GridIndex {
  std::vector<float> values;      // [entry][j]
  std::vector<int> powers;        // levels^j
  std::vector<uint16_t> nearest;  // [pattern][kNeighbours]
};

GridIndex build_index(const GridFormat& f) {
  GridIndex ix;
  ix.values.resize(static_cast<size_t>(f.n_entries * f.group));
  for (int e = 0; e < f.n_entries; ++e)
    for (int j = 0; j < f.group; ++j) ix.values[static_cast<size_t>(e * f.group + j)] = f.element(e, j);
  const int nl = static_cast<int>(f.levels.size());
  int patterns = 1;
  for (int j = 0; j < f.group; ++j) {
    ix.powers.push_back(patterns);
    patterns *= nl;
  }
  ix.nearest.resize(static_cast<size_t>(patterns) * kNeighbours);
  std::vector<std::pair<float, int>> dist(static_cast<size_t>(f.n_entries));
  std::vector<float> point(static_cast<size_t>(f.group));
  for (int p = 0; p < patterns; ++p) {
    for (int j = 0; j < f.group; ++j)
      point[static_cast<size_t>(j)] = f.levels[static_cast<size_t>(p / ix.powers[j] % nl)];
    for (int e = 0; e < f.n_entries; ++e) {
      float d2 = 0;
      for (int j = 0; j < f.group; ++j) {
        const float diff = point[static_cast<size_t>(j)] - ix.values[static_cast<size_t>(e * f.group + j)];
        d2 += diff * diff;
      }
      dist[static_cast<size_t>(e)] = {d2, e};
    }
    std::partial_sort(dist.begin(), dist.begin() + kNeighbours, dist.end());
    for (int k = 0; k < kNeighbours; ++k)
      ix.nearest[static_cast<size_t>(p * kNeighbours + k)] = static_cast<uint16_t>(dist[static_cast<size_t>(k)].second);
  }
  return ix;
}

struct Format {
  GridFormat f;
  std::once_flag once;
  GridIndex index;
  const GridIndex& grid() {
    std::call_once(once, [this] { index = build_index(f); });
    return index;
  }
};

Format& format_of(GgmlType type) {
  static Format iq2xxs{{8, 256, 32, 31, 0.125f, Signs::kParity, 0, iq2xxs_element, {8, 25, 43}}, {}, {}};
  static Format iq2xs{{8, 512, 16, 31, 0.125f, Signs::kParity, 0, iq2xs_element, {8, 25, 43}}, {}, {}};
  static Format iq2s{{8, 1024, 16, 31, 0.125f, Signs::kExplicit, 0, iq2s_element, {8, 25, 43}}, {}, {}};
  static Format iq3xxs{
      {4, 256, 32, 31, 0.25f, Signs::kParity, 0, iq3xxs_element, {4, 12, 20, 28, 36, 44, 52, 62}}, {}, {}};
  static Format iq3s{{4, 512, 32, 31, 1.0f, Signs::kExplicit, 0, iq3s_element, {1, 3, 5, 7, 9, 11, 13, 15}}, {}, {}};
  // IQ1: element = d * ls / 8 * (8 g + shift) = (d * ls) * (g + shift / 8), so unit 1 over g in -1, 0, 1.
  static Format iq1s{{8, 2048, 32, 15, 1.0f, Signs::kShift, 32, iq1s_element, {-1, 0, 1}}, {}, {}};
  static Format iq1m{{8, 2048, 16, 15, 1.0f, Signs::kShift, 8, iq1s_element, {-1, 0, 1}}, {}, {}};
  switch (type) {
    case GgmlType::IQ2_XXS:
      return iq2xxs;
    case GgmlType::IQ2_XS:
      return iq2xs;
    case GgmlType::IQ2_S:
      return iq2s;
    case GgmlType::IQ3_XXS:
      return iq3xxs;
    case GgmlType::IQ3_S:
      return iq3s;
    case GgmlType::IQ1_S:
      return iq1s;
    default:
      return iq1m;
  }
}

// The codes of one 256-block, before packing.
struct Codes {
  uint16_t d = 0;
  int s[16] = {};                // per sub-block: the stored scale s (ls = 2 s + 1)
  int entry[64] = {};            // per group
  uint8_t sign[32] = {};         // per 8 elements: bit j set when element j is negative
  bool shift_negative[64] = {};  // IQ1: per group (sized for every format's group count)
};

class BlockQuantizer {
 public:
  explicit BlockQuantizer(Format& fmt) : f_(fmt.f), ix_(fmt.grid()) {}

  Codes quantize(const float* x) {
    Codes c;
    prepare_targets(x, c);
    const int n_sub = kQK_K / f_.sub;
    float scale[16] = {};
    for (int b = 0; b < n_sub; ++b) scale[b] = best_scale(b * f_.sub);
    const float max_scale = *std::max_element(scale, scale + n_sub);
    if (max_scale <= 0) {
      assign_all_zero(c);
      return c;
    }
    // The block scale d: every sub-block's multiplier is then the odd integer nearest its scale / (d unit), and a
    // sub-block whose scale moves by e loses e^2 sum v^2. Candidates put the largest scale on the top multiplier or
    // up to a few below it (an outlier sub-block then gives up a little so that the others get finer steps).
    const int max_s = (f_.max_ls - 1) / 2;
    auto multiplier = [&](float scale, float d) {
      const float ls = d > 0 ? scale / (d * f_.unit) : 0.0f;
      return std::clamp(static_cast<int>(std::lround((ls - 1) / 2)), 0, max_s);
    };
    double best_cost = std::numeric_limits<double>::max();
    for (int k = 0; k < 8; ++k) {
      const uint16_t d16 = fp32_to_fp16(max_scale / (static_cast<float>(f_.max_ls - k) * f_.unit));
      const float d = fp16_to_fp32(d16);
      double cost = 0;
      for (int b = 0; b < n_sub; ++b) {
        const float e = d * (static_cast<float>(2 * multiplier(scale[b], d) + 1) * f_.unit) - scale[b];
        cost += weight_[b] * e * e;
      }
      if (cost < best_cost) {
        best_cost = cost;
        c.d = d16;
      }
    }
    const float d = fp16_to_fp32(c.d);
    for (int b = 0; b < n_sub; ++b) {
      c.s[b] = multiplier(scale[b], d);
      assign(b * f_.sub, d * (static_cast<float>(2 * c.s[b] + 1) * f_.unit), c);
    }
    return c;
  }

 private:
  // t (and the signs for the formats with sign bits).
  void prepare_targets(const float* x, Codes& c) {
    for (int i = 0; i < kQK_K; ++i) t_[i] = f_.signs == Signs::kShift ? x[i] : std::fabs(x[i]);
    if (f_.signs == Signs::kShift) return;
    for (int k = 0; k < kQK_K / 8; ++k) {
      uint8_t s = 0;
      for (int j = 0; j < 8; ++j)
        if (x[8 * k + j] < 0) s = static_cast<uint8_t>(s | 1u << j);
      if (f_.signs == Signs::kParity && std::popcount(s) % 2 == 1) {
        // The cheapest element to get wrong: its magnitude now counts against it.
        int j_min = 0;
        for (int j = 1; j < 8; ++j)
          if (t_[8 * k + j] < t_[8 * k + j_min]) j_min = j;
        s = static_cast<uint8_t>(s ^ 1u << j_min);
        t_[8 * k + j_min] = -t_[8 * k + j_min];
      }
      c.sign[k] = s;
    }
  }

  // The best grid entry for the group at `i0` under scale c and shift delta; returns its squared error.
  float best_entry(int i0, float c, float delta, int neighbours, int& entry) const {
    const int nl = static_cast<int>(f_.levels.size());
    int pattern = 0;
    const float inv = 1.0f / c;
    for (int j = 0; j < f_.group; ++j) {
      const float u = t_[i0 + j] * inv - delta;
      int l = 0;
      while (l + 1 < nl &&
             std::fabs(f_.levels[static_cast<size_t>(l + 1)] - u) < std::fabs(f_.levels[static_cast<size_t>(l)] - u))
        ++l;
      pattern += l * ix_.powers[static_cast<size_t>(j)];
    }
    float best = std::numeric_limits<float>::max();
    for (int k = 0; k < neighbours; ++k) {
      const int e = ix_.nearest[static_cast<size_t>(pattern * kNeighbours + k)];
      const float* g = &ix_.values[static_cast<size_t>(e * f_.group)];
      float err = 0;
      for (int j = 0; j < f_.group; ++j) {
        const float diff = t_[i0 + j] - c * (g[j] + delta);
        err += diff * diff;
      }
      if (err < best) {
        best = err;
        entry = e;
      }
    }
    return best;
  }

  // Assigns the sub-block at `i0` under scale c (and picks the IQ1 shifts); returns the squared error.
  float assign(int i0, float c, Codes& codes, int neighbours = kNeighbours) const {
    float total = 0;
    const bool shifted = f_.signs == Signs::kShift;
    const int span = shifted ? f_.shift_span : f_.sub;
    for (int s0 = i0; s0 < i0 + f_.sub; s0 += span) {
      float best = std::numeric_limits<float>::max();
      bool best_negative = false;
      int entries[8] = {};
      for (const bool negative : {false, true}) {
        if (negative && !shifted) break;
        const float delta = shifted ? (negative ? -0.125f : 0.125f) : 0.0f;
        float err = 0;
        int picked[8] = {};
        for (int g = 0; g < span / f_.group; ++g) err += best_entry(s0 + g * f_.group, c, delta, neighbours, picked[g]);
        if (err < best) {
          best = err;
          best_negative = negative;
          std::copy(picked, picked + 8, entries);
        }
      }
      for (int g = 0; g < span / f_.group; ++g) {
        const int group = (s0 + g * f_.group) / f_.group;
        codes.entry[group] = entries[g];
        codes.shift_negative[group] = best_negative;
      }
      total += best;
    }
    return total;
  }

  // The least-squares scale of the sub-block at `i0`: starting scales around amax / top level, coarse to fine; each
  // assignment is scored at its own least-squares scale c = sum t v / sum v^2, where the squared error is
  // sum t^2 - (sum t v)^2 / sum v^2 in closed form.
  float best_scale(int i0) {
    float amax = 0;
    double tt = 0;
    for (int i = i0; i < i0 + f_.sub; ++i) {
      amax = std::max(amax, std::fabs(t_[i]));
      tt += static_cast<double>(t_[i]) * t_[i];
    }
    if (amax == 0) return 0;
    const float top = f_.levels.back() + (f_.signs == Signs::kShift ? 0.125f : 0.0f);
    float best_c = amax / top;
    double best_err = std::numeric_limits<double>::max();
    float best_factor = 1.0f;
    Codes scratch;
    auto try_scale = [&](float c0, int neighbours) {
      assign(i0, c0, scratch, neighbours);
      double tv = 0, vv = 0;
      for (int i = i0; i < i0 + f_.sub; ++i) {
        const int group = i / f_.group;
        const float delta = f_.signs == Signs::kShift ? (scratch.shift_negative[group] ? -0.125f : 0.125f) : 0.0f;
        const float v = ix_.values[static_cast<size_t>(scratch.entry[group] * f_.group + i % f_.group)] + delta;
        tv += static_cast<double>(t_[i]) * v;
        vv += static_cast<double>(v) * v;
      }
      if (tv <= 0 || vv <= 0) return false;
      const double err = tt - tv * tv / vv;
      if (err >= best_err) return false;
      best_err = err;
      best_c = static_cast<float>(tv / vv);
      weight_[i0 / f_.sub] = vv;
      return true;
    };
    auto try_factor = [&](float factor) {
      if (try_scale(amax / top * factor, kSearchNeighbours)) best_factor = factor;
    };
    for (int step = -3; step <= 3; ++step) try_factor(1.0f + 0.08f * static_cast<float>(step));
    for (const float fine : {0.04f, 0.02f}) {
      const float centre = best_factor;
      try_factor(centre - fine);
      try_factor(centre + fine);
    }
    return best_c;
  }

  void assign_all_zero(Codes& c) const {
    // d = 0 makes every value 0 whatever the codes; entry 0 of every grid is a valid pattern.
    c.d = 0;
    std::fill(std::begin(c.entry), std::end(c.entry), 0);
  }

  const GridFormat& f_;
  const GridIndex& ix_;
  float t_[kQK_K] = {};
  double weight_[16] = {};  // per sub-block: sum v^2 of its best assignment, what a scale error costs per unit^2
};

void pack(GgmlType type, const Codes& c, uint8_t* out) {
  switch (type) {
    case GgmlType::IQ2_XXS: {
      BlockIQ2_XXS b{};
      b.d = c.d;
      auto* bytes = reinterpret_cast<uint8_t*>(b.qs);
      for (int ib = 0; ib < 8; ++ib) {
        uint32_t aux = static_cast<uint32_t>(c.s[ib]) << 28;
        for (int l = 0; l < 4; ++l) {
          bytes[8 * ib + l] = static_cast<uint8_t>(c.entry[4 * ib + l]);
          aux |= static_cast<uint32_t>(c.sign[4 * ib + l] & 127) << (7 * l);
        }
        std::memcpy(bytes + 8 * ib + 4, &aux, 4);
      }
      std::memcpy(out, &b, sizeof b);
      return;
    }
    case GgmlType::IQ2_XS: {
      BlockIQ2_XS b{};
      b.d = c.d;
      for (int g = 0; g < 32; ++g) b.qs[g] = static_cast<uint16_t>(c.entry[g] | (c.sign[g] & 127) << 9);
      for (int ib = 0; ib < 8; ++ib) b.scales[ib] = static_cast<uint8_t>(c.s[2 * ib] | c.s[2 * ib + 1] << 4);
      std::memcpy(out, &b, sizeof b);
      return;
    }
    case GgmlType::IQ2_S: {
      BlockIQ2_S b{};
      b.d = c.d;
      for (int g = 0; g < 32; ++g) {
        b.qs[g] = static_cast<uint8_t>(c.entry[g] & 0xff);
        b.qs[32 + g] = c.sign[g];
        b.qh[g / 4] = static_cast<uint8_t>(b.qh[g / 4] | (c.entry[g] >> 8) << (2 * (g % 4)));
      }
      for (int ib = 0; ib < 8; ++ib) b.scales[ib] = static_cast<uint8_t>(c.s[2 * ib] | c.s[2 * ib + 1] << 4);
      std::memcpy(out, &b, sizeof b);
      return;
    }
    case GgmlType::IQ3_XXS: {
      BlockIQ3_XXS b{};
      b.d = c.d;
      for (int g = 0; g < 64; ++g) b.qs[g] = static_cast<uint8_t>(c.entry[g]);
      for (int ib = 0; ib < 8; ++ib) {
        uint32_t aux = static_cast<uint32_t>(c.s[ib]) << 28;
        for (int l = 0; l < 4; ++l) aux |= static_cast<uint32_t>(c.sign[4 * ib + l] & 127) << (7 * l);
        std::memcpy(b.qs + kQK_K / 4 + 4 * ib, &aux, 4);
      }
      std::memcpy(out, &b, sizeof b);
      return;
    }
    case GgmlType::IQ3_S: {
      BlockIQ3_S b{};
      b.d = c.d;
      for (int g = 0; g < 64; ++g) {
        b.qs[g] = static_cast<uint8_t>(c.entry[g] & 0xff);
        b.qh[g / 8] = static_cast<uint8_t>(b.qh[g / 8] | (c.entry[g] >> 8) << (g % 8));
      }
      std::memcpy(b.signs, c.sign, sizeof b.signs);
      for (int i = 0; i < 4; ++i) b.scales[i] = static_cast<uint8_t>(c.s[2 * i] | c.s[2 * i + 1] << 4);
      std::memcpy(out, &b, sizeof b);
      return;
    }
    case GgmlType::IQ1_S: {
      BlockIQ1_S b{};
      b.d = c.d;
      for (int ib = 0; ib < 8; ++ib) {
        uint16_t qh = static_cast<uint16_t>(c.s[ib] << 12 | (c.shift_negative[4 * ib] ? 0x8000 : 0));
        for (int l = 0; l < 4; ++l) {
          b.qs[4 * ib + l] = static_cast<uint8_t>(c.entry[4 * ib + l] & 0xff);
          qh = static_cast<uint16_t>(qh | (c.entry[4 * ib + l] >> 8) << (3 * l));
        }
        b.qh[ib] = qh;
      }
      std::memcpy(out, &b, sizeof b);
      return;
    }
    default: {  // IQ1_M
      BlockIQ1_M b{};
      uint16_t sc[4] = {};
      for (int ib = 0; ib < 8; ++ib)
        sc[ib / 2] = static_cast<uint16_t>(sc[ib / 2] | (c.s[2 * ib] | c.s[2 * ib + 1] << 3) << (6 * (ib % 2)));
      sc[0] = static_cast<uint16_t>(sc[0] | (c.d & 0x000f) << 12);
      sc[1] = static_cast<uint16_t>(sc[1] | (c.d & 0x00f0) << 8);
      sc[2] = static_cast<uint16_t>(sc[2] | (c.d & 0x0f00) << 4);
      sc[3] = static_cast<uint16_t>(sc[3] | (c.d & 0xf000));
      std::memcpy(b.scales, sc, sizeof sc);
      for (int g = 0; g < 32; ++g) {
        b.qs[g] = static_cast<uint8_t>(c.entry[g] & 0xff);
        const int nibble = (c.entry[g] >> 8) | (c.shift_negative[g] ? 0x8 : 0);
        b.qh[g / 2] = static_cast<uint8_t>(b.qh[g / 2] | nibble << (4 * (g % 2)));
      }
      std::memcpy(out, &b, sizeof b);
      return;
    }
  }
}

void quantize_iq(GgmlType type, const float* src, void* dst, int64_t n) {
  BlockQuantizer q(format_of(type));
  const size_t size = type_info(type).type_size;
  for (int64_t i = 0; i < n / kQK_K; ++i)
    pack(type, q.quantize(src + i * kQK_K), static_cast<uint8_t*>(dst) + i * size);
}

}  // namespace

void quantize_iq1_s(const float* src, void* dst, int64_t n) { quantize_iq(GgmlType::IQ1_S, src, dst, n); }
void quantize_iq1_m(const float* src, void* dst, int64_t n) { quantize_iq(GgmlType::IQ1_M, src, dst, n); }
void quantize_iq2_xxs(const float* src, void* dst, int64_t n) { quantize_iq(GgmlType::IQ2_XXS, src, dst, n); }
void quantize_iq2_xs(const float* src, void* dst, int64_t n) { quantize_iq(GgmlType::IQ2_XS, src, dst, n); }
void quantize_iq2_s(const float* src, void* dst, int64_t n) { quantize_iq(GgmlType::IQ2_S, src, dst, n); }
void quantize_iq3_xxs(const float* src, void* dst, int64_t n) { quantize_iq(GgmlType::IQ3_XXS, src, dst, n); }
void quantize_iq3_s(const float* src, void* dst, int64_t n) { quantize_iq(GgmlType::IQ3_S, src, dst, n); }

}  // namespace hetmoe::quant::ref_detail
