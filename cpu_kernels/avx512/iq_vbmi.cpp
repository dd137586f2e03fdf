// The IQ grid formats' dots with AVX-512 VBMI and BITALG (Ice Lake and later Xeons, Zen 4): a whole 256-value block
// decoded in vector registers. The tier's kernel (dots256.inc's IqGrid) builds each group of 8 values from a grid
// entry loaded into a general register and inserted into a vector, about 40 instructions per 32 values; here:
//   - a grid becomes a table of 16-bit codes (2 bits a value for the IQ2 and IQ1 grids' three levels, 3 bits for the
//     IQ3 grids' eight); 256 or 512 entries (IQ2_XXS, IQ3_XXS; IQ2_XS, IQ3_S) are loaded into 8 or 16 vectors once a
//     call (kept in registers for one activation row) and looked up 32 indices at a time by vpermt2w and blends on the
//     index's high bits; the 1024 of IQ2_S and the 2048 of IQ1_S and IQ1_M are gathered, 16 indices at a time;
//   - vpmultishiftqb cuts the codes into one byte per value and vpermb turns each into its magnitude;
//   - seven stored sign bits per group become eight (the parity bit) by one vpermi2b over a 128-entry table and a
//     mask by vpshufbitqmb; whole sign bytes are masks as they are; the mask negates the activation bytes (vpsubb
//     under it); maddubs and vpdpwssd with the odd multipliers give the block's integer;
//   - IQ1's values 8g + t (g in {-1, 0, 1}, the shift t = +-1) go unsigned: 8(g + 1)(2x + 1) <= 240 by vpdpbusd,
//     less (8 - t)(2x + 1) times the activation's sums (IQ1_S: Q8_K's sums per 16; IQ1_M, whose t is per 8 values:
//     a second vpdpbusd).
// Every block's integer is the reference's and the float steps are IqGrid's, so the results equal the tier's bit for
// bit (tests/unit/cpu_kernels: Kernels.VbmiIqDotsEqualTheTiersOwnBitForBit). Speeds: docs/kernels.md.
// Compiled with the AVX-512 tier's flags plus -mavx512vbmi -mavx512bitalg; installed only where the CPU has both
// (has_avx512_vbmi_bitalg()).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_kernels/avx512/kernels_avx512.h"
#include "quant/blocks.h"
#include "quant/iq_grids.h"

namespace hetmoe::cpu::avx512 {
namespace {

#include "cpu_kernels/x86/row_drivers.inc"

// The constant vectors of one format, built once (on first use, so only on a CPU that runs this file).
struct GridTables {
  alignas(64) uint16_t codes[512];        // grid entry -> its values' level numbers, code_bits each, first lowest
  alignas(64) uint8_t levels[64];         // vpermb: level number (the low code_bits of the byte) -> magnitude
  alignas(64) int64_t code_qwords[4][8];  // vpermq: the codes of output vector p's qword q
  alignas(64) uint8_t code_shifts[64];    // vpmultishiftqb: each value's code to the bottom of its byte
  alignas(64) uint8_t index_bytes[64];    // vpermb: where a format's index bytes lie in its first 64 bytes
};

// The 16-bit codes of `entries` grid entries with `n_levels` magnitudes (`levels`): the level numbers of an entry's
// `values_per_word` values, `code_bits` each, first lowest.
template <typename Entry>
void fill_codes(const Entry* grid, int entries, const uint8_t* levels, int n_levels, int code_bits, int values_per_word,
                uint16_t* codes) {
  for (int e = 0; e < entries; ++e) {
    unsigned code = 0;
    for (int j = 0; j < values_per_word; ++j) {
      const auto byte = static_cast<uint8_t>(static_cast<uint64_t>(grid[e]) >> (8 * j));
      const auto level = static_cast<unsigned>(std::find(levels, levels + n_levels, byte) - levels);
      code |= level << (code_bits * j);
    }
    codes[e] = static_cast<uint16_t>(code);
  }
}

// The tables of such a grid (at most 512 entries).
template <typename Entry>
GridTables make_tables(const Entry* grid, int entries, const uint8_t* levels, int n_levels, int code_bits,
                       int values_per_word) {
  GridTables t{};
  fill_codes(grid, entries, levels, n_levels, code_bits, values_per_word, t.codes);
  const int code_mask = (1 << code_bits) - 1;
  for (int i = 0; i < 64; ++i) t.levels[i] = (i & code_mask) < n_levels ? levels[i & code_mask] : 0;
  // Output vector p holds values 64p..64p+63, its qword q values 64p+8q..+7; a qword of codes holds four words.
  const int per_qword = 4 * values_per_word;
  for (int p = 0; p < 4; ++p)
    for (int q = 0; q < 8; ++q) t.code_qwords[p][q] = (64 * p + 8 * q) / per_qword % 8;
  for (int q = 0; q < 8; ++q)
    for (int j = 0; j < 8; ++j) {
      const int value = (8 * q + j) % per_qword;
      t.code_shifts[8 * q + j] =
          static_cast<uint8_t>(16 * (value / values_per_word) + code_bits * (value % values_per_word));
    }
  return t;
}

// The tables the formats share: the signs and scales of IQ2_XXS and IQ3_XXS (32-value sub-blocks with a uint32 of
// four 7-bit sign fields and a 4-bit scale), the parity table (IQ2_XS too), the unpacking of nibble scales.
struct CommonTables {
  alignas(64) uint8_t parity[128];              // 7 stored sign bits -> the 8 (quant::kIqParitySigns)
  alignas(64) uint8_t sign_fields[64];          // vpmultishiftqb: qword k's high dword's 4 fields to its bytes 0-3
  alignas(64) int64_t sub_blocks[4][8];         // vpermq: output vector p's two sub-blocks, four qwords each
  alignas(64) uint8_t sign_bits[64];            // vpshufbitqmb: qword q's 8 bits, byte q mod 4 of its sub-block's
  alignas(64) uint16_t scale_words[4][32];      // vpermw: sub-block 2p's multiplier to words 0-15, 2p+1's to 16-31
  alignas(64) uint8_t nibbles[64];              // vpmultishiftqb: byte u (< 16) <- nibble u of the qword
  alignas(64) uint16_t nibble_words[2][4][32];  // vpermw: output vector p's words <- their group's multiplier
  CommonTables() {
    for (int i = 0; i < 64; ++i) nibbles[i] = static_cast<uint8_t>(4 * i % 64);
    for (int p = 0; p < 4; ++p)
      for (int w = 0; w < 32; ++w) {
        nibble_words[0][p][w] = static_cast<uint16_t>(4 * p + w / 8);   // groups of 16 values
        nibble_words[1][p][w] = static_cast<uint16_t>(2 * p + w / 16);  // groups of 32
      }
    for (int i = 0; i < 128; ++i) parity[i] = quant::kIqParitySigns[i];
    for (int q = 0; q < 8; ++q)
      for (int j = 0; j < 8; ++j) {
        sign_fields[8 * q + j] = static_cast<uint8_t>(j < 4 ? 32 + 7 * j : 0);
        sign_bits[8 * q + j] = static_cast<uint8_t>(8 * (q % 4) + j);
      }
    for (int p = 0; p < 4; ++p) {
      for (int q = 0; q < 8; ++q) sub_blocks[p][q] = 2 * p + q / 4;
      for (int w = 0; w < 32; ++w) scale_words[p][w] = static_cast<uint16_t>(4 * (2 * p + w / 16));
    }
  }
};

const CommonTables& common_tables() {
  static const CommonTables t;
  return t;
}

inline __m512i load(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 32 grid indices (words below kEntries, 256 or 512) -> their 16-bit codes: a vpermt2w per 64 entries, then blends by
// the index's bits 6, 7 (and 8).
template <int kEntries>
struct CodeLookup {
  static constexpr int kPairs = kEntries / 64;
  __m512i t[2 * kPairs];
  explicit CodeLookup(const uint16_t* codes) {
#pragma GCC unroll 16
    for (int i = 0; i < 2 * kPairs; ++i) t[i] = load(codes + 32 * i);
  }
  __m512i operator()(__m512i idx) const {
    __m512i r[kPairs];
#pragma GCC unroll 8
    for (int i = 0; i < kPairs; ++i) r[i] = _mm512_permutex2var_epi16(t[2 * i], idx, t[2 * i + 1]);
    // Halve the candidates by one index bit at a time.
    int bit = 0x40;
#pragma GCC unroll 3
    for (int n = kPairs; n > 1; n /= 2, bit *= 2) {
      const __mmask32 set = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(static_cast<int16_t>(bit)));
#pragma GCC unroll 4
      for (int i = 0; i < n / 2; ++i) r[i] = _mm512_mask_blend_epi16(set, r[2 * i], r[2 * i + 1]);
    }
    return r[0];
  }
};

// For the formats whose grid is gathered instead.
struct NoLookup {
  explicit NoLookup(const uint16_t* /*codes*/) {}
};

// One block's 256 values as four vectors of magnitude bytes, four masks of the negative ones and four vectors of
// multipliers (one word per maddubs word: vpdpwssd multiplies them word by word).
struct DecodedBlock {
  __m512i mag[4];
  __mmask64 neg[4];
  __m512i scale[4];
};

// The signs and multipliers of 8 sub-blocks whose uint32 (4 x 7 sign bits, the scale in the top 4) is the high
// dword of qword k of `aux`.
inline void decode_signs(__m512i aux, const CommonTables& s, DecodedBlock& out) {
  const __m512i fields = _mm512_multishift_epi64_epi8(load(s.sign_fields), aux);
  const __m512i signs = _mm512_permutex2var_epi8(load(s.parity), fields, load(s.parity + 64));
  const __m512i top = _mm512_srli_epi64(aux, 60);
  const __m512i odd = _mm512_or_si512(_mm512_add_epi64(top, top), _mm512_set1_epi64(1));
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m512i mine = _mm512_permutexvar_epi64(load(s.sub_blocks[p]), signs);
    out.neg[p] = _mm512_bitshuffle_epi64_mask(mine, load(s.sign_bits));
    out.scale[p] = _mm512_permutexvar_epi16(load(s.scale_words[p]), odd);
  }
}

// Output vector p's magnitudes from the looked-up codes.
inline __m512i magnitudes(__m512i codes, const GridTables& t, int p) {
  const __m512i words = _mm512_permutexvar_epi64(load(t.code_qwords[p]), codes);
  return _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(load(t.code_shifts), words), load(t.levels));
}

// The multipliers 2x + 1 of 4-bit scales x packed in nibbles (nibble u: the u-th group of kPer values, 16 or 32),
// as the words of output vectors 0-3.
template <int kPer>
inline void nibble_multipliers(uint64_t packed, const CommonTables& t, DecodedBlock& out) {
  const __m512i nibbles =
      _mm512_multishift_epi64_epi8(load(t.nibbles), _mm512_set1_epi64(static_cast<int64_t>(packed)));
  const __m128i x = _mm512_castsi512_si128(_mm512_and_si512(nibbles, _mm512_set1_epi8(0xf)));
  const __m512i odd =
      _mm512_castsi256_si512(_mm256_or_si256(_mm256_slli_epi16(_mm256_cvtepu8_epi16(x), 1), _mm256_set1_epi16(1)));
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) out.scale[p] = _mm512_permutexvar_epi16(load(t.nibble_words[kPer == 16 ? 0 : 1][p]), odd);
}

inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// d, then per 32 values 4 index bytes and the uint32 of signs and scale.
struct Iq2XxsFormat {
  using Lookup = CodeLookup<256>;
  static constexpr size_t kBytes = sizeof(quant::BlockIQ2_XXS);
  static constexpr float kUnit = 0.125f;
  static const GridTables& tables() {
    static const GridTables t = [] {
      const uint8_t levels[3] = {8, 25, 43};
      GridTables g = make_tables(quant::iq2xxs_grid, 256, levels, 3, 2, 8);
      for (int i = 0; i < 32; ++i) g.index_bytes[2 * i] = static_cast<uint8_t>(8 * (i / 4) + i % 4);
      return g;
    }();
    return t;
  }
  static void decode(const uint8_t* b, const Lookup& lookup, const GridTables& t, const CommonTables& s,
                     DecodedBlock& out) {
    const __m512i q = load(b + 2);
    // Index byte l of sub-block k (byte 8k + l) to word 4k + l.
    const __m512i codes = lookup(_mm512_maskz_permutexvar_epi8(0x5555555555555555ULL, load(t.index_bytes), q));
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) out.mag[p] = magnitudes(codes, t, p);
    decode_signs(q, s, out);
  }
};

// d, 64 index bytes (one per 4 values), then per 32 values the uint32 of signs and scale.
struct Iq3XxsFormat {
  using Lookup = CodeLookup<256>;
  static constexpr size_t kBytes = sizeof(quant::BlockIQ3_XXS);
  static constexpr float kUnit = 0.25f;
  static const GridTables& tables() {
    static const GridTables t = [] {
      const uint8_t levels[8] = {4, 12, 20, 28, 36, 44, 52, 62};
      return make_tables(quant::iq3xxs_grid, 256, levels, 8, 3, 4);
    }();
    return t;
  }
  static void decode(const uint8_t* b, const Lookup& lookup, const GridTables& t, const CommonTables& s,
                     DecodedBlock& out) {
    const __m512i low = lookup(_mm512_cvtepu8_epi16(load256(b + 2)));
    const __m512i high = lookup(_mm512_cvtepu8_epi16(load256(b + 34)));
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) out.mag[p] = magnitudes(p < 2 ? low : high, t, p);
    decode_signs(_mm512_slli_epi64(_mm512_cvtepu32_epi64(load256(b + 66)), 32), s, out);
  }
};

// d, 32 uint16 (a 9-bit grid index, 7 sign bits above it), 8 scale bytes (4 bits per 16 values).
struct Iq2XsFormat {
  using Lookup = CodeLookup<512>;
  static constexpr size_t kBytes = sizeof(quant::BlockIQ2_XS);
  static constexpr float kUnit = 0.125f;
  struct Tables : GridTables {
    alignas(64) uint8_t sign_bits[64];  // vpshufbitqmb: group 8p + q's sign byte is byte 2(q mod 4) of its qword
  };
  static const Tables& tables() {
    static const Tables t = [] {
      const uint8_t levels[3] = {8, 25, 43};
      Tables x{};
      static_cast<GridTables&>(x) = make_tables(quant::iq2xs_grid, 512, levels, 3, 2, 8);
      for (int q = 0; q < 8; ++q)
        for (int j = 0; j < 8; ++j) x.sign_bits[8 * q + j] = static_cast<uint8_t>(16 * (q % 4) + j);
      return x;
    }();
    return t;
  }
  static void decode(const uint8_t* b, const Lookup& lookup, const Tables& t, const CommonTables& s,
                     DecodedBlock& out) {
    const __m512i q = load(b + 2);
    const __m512i codes = lookup(_mm512_and_si512(q, _mm512_set1_epi16(0x1ff)));
    const __m512i signs = _mm512_permutex2var_epi8(load(s.parity), _mm512_srli_epi16(q, 9), load(s.parity + 64));
    nibble_multipliers<16>(load_u64(b + 66), s, out);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      out.mag[p] = magnitudes(codes, t, p);
      out.neg[p] =
          _mm512_bitshuffle_epi64_mask(_mm512_permutexvar_epi64(load(s.sub_blocks[p]), signs), load(t.sign_bits));
    }
  }
};

// d, 64 index low bytes, 8 qh bytes (bit i of the 64: index i's ninth bit), 32 sign bytes (bit j of byte g: value
// 8g + j negative), 4 scale bytes (a nibble per 32 values).
struct Iq3sFormat {
  using Lookup = CodeLookup<512>;
  static constexpr size_t kBytes = sizeof(quant::BlockIQ3_S);
  static constexpr float kUnit = 1.0f;
  static const GridTables& tables() {
    static const GridTables t = [] {
      const uint8_t levels[8] = {1, 3, 5, 7, 9, 11, 13, 15};
      return make_tables(quant::iq3s_grid, 512, levels, 8, 3, 4);
    }();
    return t;
  }
  static void decode(const uint8_t* b, const Lookup& lookup, const GridTables& t, const CommonTables& s,
                     DecodedBlock& out) {
    const uint64_t ninth = load_u64(b + 66);
    const __m512i nine = _mm512_set1_epi16(0x100);
    const __m512i first = _mm512_cvtepu8_epi16(load256(b + 2)), second = _mm512_cvtepu8_epi16(load256(b + 34));
    const __m512i low = lookup(_mm512_mask_add_epi16(first, static_cast<__mmask32>(ninth), first, nine));
    const __m512i high = lookup(_mm512_mask_add_epi16(second, static_cast<__mmask32>(ninth >> 32), second, nine));
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      out.mag[p] = magnitudes(p < 2 ? low : high, t, p);
      out.neg[p] = _cvtu64_mask64(load_u64(b + 74 + 8 * p));
    }
    uint32_t packed;
    std::memcpy(&packed, b + 106, 4);
    nibble_multipliers<32>(packed, s, out);
  }
};

// 16 grid indices, low_bytes[i] | (lane i of high & high_mask), and their 16-bit codes gathered: 4 bytes at codes +
// 2 x index each (the tables keep two spare entries for the last), the code in the low half.
inline __m512i gather_codes(const uint8_t* low_bytes, __m512i high, int32_t high_mask, const uint16_t* codes) {
  const __m512i low = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low_bytes)));
  const __m512i index = _mm512_ternarylogic_epi32(low, high, _mm512_set1_epi32(high_mask), 0xF8);  // low | high & mask
  return _mm512_i32gather_epi32(index, codes, 2);
}

// d, 32 index low bytes, 32 sign bytes (bit j of byte g: value 8g + j negative), 8 qh bytes (bits 2i, 2i + 1 of the
// 64: index i's bits 8 and 9), 8 scale bytes (a nibble per 16 values). The 1024-entry grid's codes are gathered.
struct Iq2sFormat {
  using Lookup = NoLookup;
  static constexpr size_t kBytes = sizeof(quant::BlockIQ2_S);
  static constexpr float kUnit = 0.125f;
  struct Tables {
    alignas(64) uint16_t codes[1024 + 2];  // 2 bits a value; 2 spare for the 4-byte gather of the last
    alignas(64) uint8_t levels[64];        // vpermb: level number -> magnitude
    alignas(64) uint8_t code_shifts[64];   // vpmultishiftqb: value j's code to the bottom of byte j
    alignas(64) uint32_t qh_shifts[16];    // dword i's two high index bits to the bottom
  };
  static const Tables& tables() {
    static const Tables t = [] {
      const uint8_t levels[3] = {8, 25, 43};
      Tables x{};
      fill_codes(quant::iq2s_grid, 1024, levels, 3, 2, 8, x.codes);
      for (int i = 0; i < 64; ++i) x.levels[i] = (i & 3) < 3 ? levels[i & 3] : 0;
      for (int i = 0; i < 64; ++i) x.code_shifts[i] = static_cast<uint8_t>(2 * (i % 8));
      for (int i = 0; i < 16; ++i) x.qh_shifts[i] = static_cast<uint32_t>(2 * i);
      return x;
    }();
    return t;
  }
  static void decode(const uint8_t* b, const Lookup& /*lookup*/, const Tables& t, const CommonTables& s,
                     DecodedBlock& out) {
    const uint64_t qh = load_u64(b + 66);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i bits =
          _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int32_t>(qh >> (32 * h))), load(t.qh_shifts));
      const __m512i codes = gather_codes(b + 2 + 16 * h, _mm512_slli_epi32(bits, 8), 0x300, t.codes);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const __m512i qwords =
            _mm512_cvtepu32_epi64(half == 0 ? _mm512_castsi512_si256(codes) : _mm512_extracti64x4_epi64(codes, 1));
        out.mag[2 * h + half] =
            _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(load(t.code_shifts), qwords), load(t.levels));
      }
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) out.neg[p] = _cvtu64_mask64(load_u64(b + 34 + 8 * p));
    nibble_multipliers<16>(load_u64(b + 74), s, out);
  }
};

// One weight row against N activation rows: each block decoded once, then per activation its 256 bytes negated
// under the masks, maddubs with the magnitudes (at most 62 x 128: no saturation), vpdpwssd with the multipliers.
template <typename Format>
struct IqVbmi {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const auto& t = Format::tables();
    const CommonTables& s = common_tables();
    const typename Format::Lookup lookup(t.codes);
    const ActRows<quant::BlockQ8_K, N> y(act, stride);
    const __m512i zero = _mm512_setzero_si512();
    float sum[N] = {};
    DecodedBlock block;
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      const uint8_t* b = static_cast<const uint8_t*>(w) + static_cast<size_t>(i) * Format::kBytes;
      Format::decode(b, lookup, t, s, block);
      __m512i acc[N];
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) acc[j] = zero;
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p)
#pragma GCC unroll 8
        for (int j = 0; j < N; ++j) {
          const __m512i qy = load(y[j][i].qs + 64 * p);
          const __m512i signed_qy = _mm512_mask_sub_epi8(qy, block.neg[p], zero, qy);
          acc[j] = _mm512_dpwssd_epi32(acc[j], _mm512_maddubs_epi16(block.mag[p], signed_qy), block.scale[p]);
        }
      uint16_t half;
      std::memcpy(&half, b, 2);
      const float d = _cvtsh_ss(half);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) sum[j] += d * y[j][i].d * static_cast<float>(_mm512_reduce_add_epi32(acc[j]));
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) out[j] = sum[j] * Format::kUnit;
  }
};

// The grid of IQ1_S and IQ1_M: c = g + 1 of each value, 2 bits each, first lowest (2 spare entries for the 4-byte
// gather of the last), and the byte weights of both formats' vpdpbusd.
struct Iq1Grid {
  alignas(64) uint16_t codes[2048 + 2];
  alignas(64) uint8_t weights[64];        // vpermb: c | x << 2 -> 8c(2x + 1)
  alignas(64) uint8_t shift_weights[64];  // vpermb: x | (t negative) << 3 -> (8 - t)(2x + 1)
  alignas(64) uint8_t code_shifts[64];    // vpmultishiftqb: value j's c to the bottom of byte j
  Iq1Grid() {
    const uint8_t levels[3] = {0xff, 0, 1};
    fill_codes(quant::iq1s_grid, 2048, levels, 3, 2, 8, codes);
    codes[2048] = codes[2049] = 0;
    for (int i = 0; i < 64; ++i) {
      weights[i] = static_cast<uint8_t>(8 * (i & 3) * (2 * (i >> 2 & 7) + 1));
      shift_weights[i] = static_cast<uint8_t>((i & 8 ? 9 : 7) * (2 * (i & 7) + 1));
      code_shifts[i] = static_cast<uint8_t>(2 * (i % 8));
    }
  }
};

const Iq1Grid& iq1_grid() {
  static const Iq1Grid t;
  return t;
}

// The unsigned bytes c of output vector p's 64 values, from the gathered codes of its half: lanes 8(p mod 2).. of g.
inline __m512i iq1_code_bytes(__m512i g, int p, const Iq1Grid& t) {
  const __m512i qwords =
      _mm512_cvtepu32_epi64(p % 2 == 0 ? _mm512_castsi512_si256(g) : _mm512_extracti64x4_epi64(g, 1));
  return _mm512_and_si512(_mm512_multishift_epi64_epi8(load(t.code_shifts), qwords), _mm512_set1_epi8(3));
}

struct Iq1sTables {
  alignas(64) uint16_t qh_words[2][32];        // vpermw (odd words zeroed): dword i of half h <- qh[(16h + i) / 4]
  alignas(64) uint32_t qh_shifts[16];          // (qh << 8) >> 3(i mod 4): dword i's 3 index bits to bits 8-10
  alignas(64) uint8_t sub_block_bytes[4][64];  // vpermb: each byte of output vector p <- its sub-block's x << 2
  alignas(32) uint16_t bias_words[16];         // vpermw: bsum m's factor <- sub-block m / 2's
  Iq1sTables() {
    for (int h = 0; h < 2; ++h)
      for (int w = 0; w < 32; ++w) qh_words[h][w] = static_cast<uint16_t>((16 * h + w / 2) / 4);
    for (int i = 0; i < 16; ++i) qh_shifts[i] = static_cast<uint32_t>(3 * (i % 4));
    for (int p = 0; p < 4; ++p)
      for (int i = 0; i < 64; ++i) sub_block_bytes[p][i] = static_cast<uint8_t>(2 * (2 * p + i / 32));
    for (int m = 0; m < 16; ++m) bias_words[m] = static_cast<uint16_t>(m / 2);
  }
};

const Iq1sTables& iq1s_tables() {
  static const Iq1sTables t;
  return t;
}

// IQ1_S: d, 32 index low bytes, 8 uint16 qh (per 32 values: 4 x 3 index bits, the 3-bit scale x, the sign of the
// shift in bit 15). A value is (8g + t) / 8, g in {-1, 0, 1} from the grid, t = -1 where the sign bit is set, else 1.
// With c = g + 1 in {0, 1, 2}, a sub-block's integer (2x + 1) sum(q8 (8g + t)) = sum(q8 8c(2x + 1)) - (8 - t)(2x + 1)
// sum(q8): the first by vpdpbusd with the unsigned bytes 8c(2x + 1) <= 240, the second from the activation's sums
// per 16 (Q8_K's bsums). The 2048-entry grid is too big for registers: its codes are gathered, 16 at a time.
struct Iq1sVbmi {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const Iq1sTables& t = iq1s_tables();
    const Iq1Grid& grid = iq1_grid();
    const ActRows<quant::BlockQ8_K, N> y(act, stride);
    float sum[N] = {};
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      const uint8_t* b = static_cast<const uint8_t*>(w) + static_cast<size_t>(i) * sizeof(quant::BlockIQ1_S);
      const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 34));
      __m512i group_codes[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i words =
            _mm512_maskz_permutexvar_epi16(0x55555555U, load(t.qh_words[h]), _mm512_castsi128_si512(qh));
        const __m512i high = _mm512_srlv_epi32(_mm512_slli_epi32(words, 8), load(t.qh_shifts));
        group_codes[h] = gather_codes(b + 2 + 16 * h, high, 0x700, grid.codes);
      }
      // Per sub-block k, word k: x << 2 in the low byte; the bsums' factor (8 - t)(2x + 1).
      const __m128i x4 = _mm_and_si128(_mm_srli_epi16(qh, 10), _mm_set1_epi16(0x1c));
      const __m128i odd = _mm_or_si128(_mm_srli_epi16(x4, 1), _mm_set1_epi16(1));
      const __m128i eight_minus_t = _mm_add_epi16(_mm_set1_epi16(7), _mm_slli_epi16(_mm_srli_epi16(qh, 15), 1));
      const __m256i factor =
          _mm256_permutexvar_epi16(load256(t.bias_words), _mm256_castsi128_si256(_mm_mullo_epi16(odd, eight_minus_t)));
      __m512i weights[4];
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m512i scale = _mm512_permutexvar_epi8(load(t.sub_block_bytes[p]), _mm512_castsi128_si512(x4));
        const __m512i index = _mm512_or_si512(iq1_code_bytes(group_codes[p / 2], p, grid), scale);  // c | x << 2
        weights[p] = _mm512_permutexvar_epi8(index, load(grid.weights));
      }
      uint16_t half;
      std::memcpy(&half, b, 2);
      const float d = _cvtsh_ss(half);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        const __m256i bias = _mm256_madd_epi16(load256(y[j][i].bsums), factor);
        __m512i acc = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(bias));
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) acc = _mm512_dpbusd_epi32(acc, weights[p], load(y[j][i].qs + 64 * p));
        sum[j] += d * y[j][i].d * static_cast<float>(_mm512_reduce_add_epi32(acc));
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) out[j] = sum[j] * 0.125f;
  }
};

// IQ1_M: 32 index low bytes, 16 qh bytes (a nibble per group of 8: 3 index bits, the shift's sign in the top bit),
// 4 uint16 scale words (four 3-bit scales x, one per 16 values, under a nibble of the fp16 d each). Values as IQ1_S's,
// the shift's sign per group of 8: (2x + 1) sum(q8 (8g + t)) = sum(q8 8c(2x + 1)) - sum(q8 (8 - t)(2x + 1)), both by
// vpdpbusd with unsigned byte weights.
struct Iq1mTables {
  alignas(64) uint8_t qh_bytes[64];        // vpermb (zeroing): dword i <- qh[i / 2] (groups 0-15; +8 for 16-31)
  alignas(64) uint32_t qh_shifts[16];      // dword i's 3 index bits to bits 8-10: << 8 - 4(i mod 2)
  alignas(64) uint8_t scale_fields[64];    // vpmultishiftqb: byte u (< 16) <- x of values 16u..16u+15
  alignas(64) int64_t qh_qwords[8];        // vpermq: the qh qword of output qword q's groups
  alignas(64) uint8_t shift_bits[64];      // vpmultishiftqb: byte g (< 32) <- group g's sign bit at the bottom
  alignas(64) uint8_t unit_of_group[64];   // vpermb: byte g <- x of group g's 16
  alignas(64) uint8_t group_bytes[4][64];  // vpermb: each byte of output vector p <- its group's
  Iq1mTables() {
    for (int i = 0; i < 64; ++i) {
      qh_bytes[i] = static_cast<uint8_t>(i % 4 == 0 ? i / 8 : 0);
      const int u = i % 16, g = i % 32;
      scale_fields[i] = static_cast<uint8_t>(16 * (u / 4) + 3 * (u % 4));
      shift_bits[i] = static_cast<uint8_t>(8 * (g / 2 % 8) + 3 + 4 * (g % 2));
      unit_of_group[i] = static_cast<uint8_t>(g / 2);
    }
    for (int i = 0; i < 16; ++i) qh_shifts[i] = static_cast<uint32_t>(8 - 4 * (i % 2));
    for (int q = 0; q < 8; ++q) qh_qwords[q] = q / 2;
    for (int p = 0; p < 4; ++p)
      for (int i = 0; i < 64; ++i) group_bytes[p][i] = static_cast<uint8_t>(8 * p + i / 8);
  }
};

const Iq1mTables& iq1m_tables() {
  static const Iq1mTables t;
  return t;
}

struct Iq1mVbmi {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const Iq1mTables& t = iq1m_tables();
    const Iq1Grid& grid = iq1_grid();
    const ActRows<quant::BlockQ8_K, N> y(act, stride);
    float sum[N] = {};
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      const uint8_t* b = static_cast<const uint8_t*>(w) + static_cast<size_t>(i) * sizeof(quant::BlockIQ1_M);
      const __m512i qh = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32)));
      __m512i group_codes[2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i bytes = _mm512_maskz_permutexvar_epi8(
            0x1111111111111111ULL, _mm512_add_epi8(load(t.qh_bytes), _mm512_set1_epi32(8 * h)), qh);
        group_codes[h] = gather_codes(b + 16 * h, _mm512_sllv_epi32(bytes, load(t.qh_shifts)), 0x700, grid.codes);
      }
      const uint64_t packed = load_u64(b + 48);
      const __m512i x = _mm512_and_si512(
          _mm512_multishift_epi64_epi8(load(t.scale_fields), _mm512_set1_epi64(static_cast<int64_t>(packed))),
          _mm512_set1_epi8(7));
      const __m512i negative = _mm512_and_si512(
          _mm512_multishift_epi64_epi8(load(t.shift_bits), _mm512_permutexvar_epi64(load(t.qh_qwords), qh)),
          _mm512_set1_epi8(1));
      const __m512i x_of_group = _mm512_permutexvar_epi8(load(t.unit_of_group), x);
      // Per group: x << 2 (for c | x << 2) and x | negative << 3; bytes below 32, so word shifts carry nothing over.
      const __m512i scale_bytes = _mm512_slli_epi16(x_of_group, 2);
      const __m512i shift_bytes = _mm512_or_si512(x_of_group, _mm512_slli_epi16(negative, 3));
      __m512i weights[4], shift_weights[4];
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m512i mine = load(t.group_bytes[p]);
        const __m512i index =
            _mm512_or_si512(iq1_code_bytes(group_codes[p / 2], p, grid), _mm512_permutexvar_epi8(mine, scale_bytes));
        weights[p] = _mm512_permutexvar_epi8(index, load(grid.weights));
        shift_weights[p] =
            _mm512_permutexvar_epi8(_mm512_permutexvar_epi8(mine, shift_bytes), load(grid.shift_weights));
      }
      uint16_t s[4];
      std::memcpy(s, b + 48, 8);
      const float d = _cvtsh_ss(
          static_cast<uint16_t>((s[0] >> 12) | (s[1] >> 8 & 0x00f0) | (s[2] >> 4 & 0x0f00) | (s[3] & 0xf000)));
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        __m512i acc = _mm512_setzero_si512(), shift = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
          const __m512i qy = load(y[j][i].qs + 64 * p);
          acc = _mm512_dpbusd_epi32(acc, weights[p], qy);
          shift = _mm512_dpbusd_epi32(shift, shift_weights[p], qy);
        }
        sum[j] += d * y[j][i].d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_sub_epi32(acc, shift)));
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) out[j] = sum[j] * 0.125f;
  }
};

template <typename Kernel>
void set_kernel(KernelTable& table, quant::GgmlType type) {
  table.vec_dot[kernel_slot(type)] = &dot_one<Kernel>;
  table.vec_dot_rows[kernel_slot(type)] = &dot_rows8<Kernel>;
  table.vec_dot_many[kernel_slot(type)] = &dot_many<Kernel>;
  table.vec_dot_few[kernel_slot(type)] = &dot_few<Kernel>;
}

}  // namespace

void install_iq_vbmi(KernelTable& table) {
  set_kernel<IqVbmi<Iq2XxsFormat>>(table, quant::GgmlType::IQ2_XXS);
  set_kernel<IqVbmi<Iq3XxsFormat>>(table, quant::GgmlType::IQ3_XXS);
  set_kernel<IqVbmi<Iq2XsFormat>>(table, quant::GgmlType::IQ2_XS);
  set_kernel<IqVbmi<Iq2sFormat>>(table, quant::GgmlType::IQ2_S);
  set_kernel<IqVbmi<Iq3sFormat>>(table, quant::GgmlType::IQ3_S);
  set_kernel<Iq1sVbmi>(table, quant::GgmlType::IQ1_S);
  set_kernel<Iq1mVbmi>(table, quant::GgmlType::IQ1_M);
}

}  // namespace hetmoe::cpu::avx512
