// IQ2_XXS and IQ3_XXS dots with AVX-512 VBMI and BITALG (Ice Lake and later Xeons, Zen 4): a whole 256-value block
// decoded in vector registers. The tier's kernel (dots256.inc's IqGrid) builds each group of 8 values from a grid
// entry loaded into a general register and inserted into a vector, about 40 instructions per 32 values; here:
//   - the grid becomes a table of 16-bit codes (2 bits a value for IQ2_XXS's three levels, 3 bits for IQ3_XXS's
//     eight), 256 entries in eight registers, looked up 32 indices at a time by four vpermt2w and two blends;
//   - vpmultishiftqb cuts the codes into one byte per value and vpermb turns each into its level;
//   - the seven stored sign bits of each group become its eight (the parity bit) by one vpermi2b over a 128-entry
//     table, and vpshufbitqmb makes them a mask that negates the activation bytes (vpsubb under the mask);
//   - maddubs and vpdpwssd with the odd multipliers give the block's integer total, the reference's integer.
// The float steps are IqGrid's, so the results equal the tier's bit for bit (the kernel tests check it).
// bench_dot (rows of 2048 in L2, one thread, Zen 4), the tier's kernel -> these: IQ2_XXS 3.3 -> 7.5 GB/s, IQ3_XXS
// 3.8 -> 9.2 (docs/kernels.md).
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
  alignas(64) uint16_t codes[256];        // grid entry -> its values' level numbers, code_bits each, first lowest
  alignas(64) uint8_t levels[64];         // vpermb: level number (the low code_bits of the byte) -> magnitude
  alignas(64) int64_t code_qwords[4][8];  // vpermq: the codes of output vector p's qword q
  alignas(64) uint8_t code_shifts[64];    // vpmultishiftqb: each value's code to the bottom of its byte
  alignas(64) uint8_t index_bytes[64];    // vpermb: where a format's index bytes lie in its first 64 bytes
};

// The tables of a grid with `n_levels` magnitudes (`levels`), coded in `code_bits` bits, `values_per_word` values
// to a 16-bit code.
template <typename Entry>
GridTables make_tables(const Entry* grid, const uint8_t* levels, int n_levels, int code_bits, int values_per_word) {
  GridTables t{};
  for (int e = 0; e < 256; ++e) {
    unsigned code = 0;
    for (int j = 0; j < values_per_word; ++j) {
      const auto byte = static_cast<uint8_t>(static_cast<uint64_t>(grid[e]) >> (8 * j));
      const auto level = static_cast<unsigned>(std::find(levels, levels + n_levels, byte) - levels);
      code |= level << (code_bits * j);
    }
    t.codes[e] = static_cast<uint16_t>(code);
  }
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

// What IQ2_XXS and IQ3_XXS share: 32-value sub-blocks with a uint32 of four 7-bit sign fields and a 4-bit scale.
struct SignTables {
  alignas(64) uint8_t parity[128];          // 7 stored sign bits -> the 8 (quant::kIqParitySigns)
  alignas(64) uint8_t sign_fields[64];      // vpmultishiftqb: qword k's high dword's 4 fields to its bytes 0-3
  alignas(64) int64_t sub_blocks[4][8];     // vpermq: output vector p's two sub-blocks, four qwords each
  alignas(64) uint8_t sign_bits[64];        // vpshufbitqmb: qword q's 8 bits, byte q mod 4 of its sub-block's
  alignas(64) uint16_t scale_words[4][32];  // vpermw: sub-block 2p's multiplier to words 0-15, 2p+1's to 16-31
  SignTables() {
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

const SignTables& sign_tables() {
  static const SignTables t;
  return t;
}

inline __m512i load(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 32 grid indices (words, at most 255) -> their 16-bit codes.
struct CodeLookup {
  __m512i t[8];
  explicit CodeLookup(const uint16_t* codes) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) t[i] = load(codes + 32 * i);
  }
  __m512i operator()(__m512i idx) const {
    const __m512i r0 = _mm512_permutex2var_epi16(t[0], idx, t[1]);
    const __m512i r1 = _mm512_permutex2var_epi16(t[2], idx, t[3]);
    const __m512i r2 = _mm512_permutex2var_epi16(t[4], idx, t[5]);
    const __m512i r3 = _mm512_permutex2var_epi16(t[6], idx, t[7]);
    const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x40));
    const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(0x80));
    return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
  }
};

// One block's 256 values as four vectors of magnitude bytes, four masks of the negative ones and four vectors of
// multipliers (one word per pair of maddubs' words).
struct DecodedBlock {
  __m512i mag[4];
  __mmask64 neg[4];
  __m512i scale[4];
};

// The signs and multipliers of 8 sub-blocks whose uint32 (4 x 7 sign bits, the scale in the top 4) is the high
// dword of qword k of `aux`.
inline void decode_signs(__m512i aux, const SignTables& s, DecodedBlock& out) {
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

// d, then per 32 values 4 index bytes and the uint32 of signs and scale.
struct Iq2XxsFormat {
  static constexpr size_t kBytes = sizeof(quant::BlockIQ2_XXS);
  static constexpr float kUnit = 0.125f;
  static const GridTables& tables() {
    static const GridTables t = [] {
      const uint8_t levels[3] = {8, 25, 43};
      GridTables g = make_tables(quant::iq2xxs_grid, levels, 3, 2, 8);
      for (int i = 0; i < 32; ++i) g.index_bytes[2 * i] = static_cast<uint8_t>(8 * (i / 4) + i % 4);
      return g;
    }();
    return t;
  }
  static void decode(const uint8_t* b, const CodeLookup& lookup, const GridTables& t, const SignTables& s,
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
  static constexpr size_t kBytes = sizeof(quant::BlockIQ3_XXS);
  static constexpr float kUnit = 0.25f;
  static const GridTables& tables() {
    static const GridTables t = [] {
      const uint8_t levels[8] = {4, 12, 20, 28, 36, 44, 52, 62};
      return make_tables(quant::iq3xxs_grid, levels, 8, 3, 4);
    }();
    return t;
  }
  static void decode(const uint8_t* b, const CodeLookup& lookup, const GridTables& t, const SignTables& s,
                     DecodedBlock& out) {
    const __m512i low = lookup(_mm512_cvtepu8_epi16(load256(b + 2)));
    const __m512i high = lookup(_mm512_cvtepu8_epi16(load256(b + 34)));
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) out.mag[p] = magnitudes(p < 2 ? low : high, t, p);
    decode_signs(_mm512_slli_epi64(_mm512_cvtepu32_epi64(load256(b + 66)), 32), s, out);
  }
};

// One weight row against N activation rows: each block decoded once, then per activation its 256 bytes negated
// under the masks, maddubs with the magnitudes (at most 62 x 128: no saturation), vpdpwssd with the multipliers.
template <typename Format>
struct IqVbmi {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const GridTables& t = Format::tables();
    const SignTables& s = sign_tables();
    const CodeLookup lookup(t.codes);
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
}

}  // namespace hetmoe::cpu::avx512
