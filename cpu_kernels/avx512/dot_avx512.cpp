// The AVX-512 tier: every 256-bit kernel of dots256.inc rebuilt with VNNI (vpdpbusd for maddubs + madd, vpdpwssd
// for madd + add; AVX-512VL also gives the compiler 32 vector registers), plus 512-bit tile kernels for batches.
// Integer results equal the AVX2 tier's, so both tiers give the same floats for one-row dots, except Q4_K's and
// Q6_K's (their 512-bit kernels sum the same integers in other float lanes).
//
// Measured with tests/bench/bench_dot (L2-resident rows of 2048, one thread, AMD EPYC Zen 4, GB/s of weights, best
// of 3 in a noisy VM): Q4_K 21, Q6_K 29 for the 256-bit kernels; in 512-bit steps (below, one sitting) Q4_K 28.6
// against the AVX2 tier's 21.0 and Q6_K 47.4 against 29.3. Other 512-bit single-row kernels were tried and dropped:
// a Q6_K with a vpmulld per group (21.5 best), a Q4_K with vpsrlvw + vpermw in 64-value steps (17.2 best), straight
// 512-bit Q5_0 and Q8_0 that kept the per-block totals: Zen 4 splits 512-bit work in two, so a wider kernel gains only
// where it saves instructions (the Q5_0 kernel below does, by never reducing a block to one total).
//
// The AMX tier's tile kernels live here too (AVX-512 does their packing and scaling); they have not run on AMX
// hardware: tests check them with the tile instructions emulated (install_amx_emulated).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "cpu_kernels/avx512/kernels_avx512.h"
#include "cpu_kernels/scratch.h"
#include "quant/blocks.h"
#include "quant/iq_decode.h"

namespace hetmoe::cpu::avx512 {
namespace {

// The 256-bit kernels of dots256.inc with VNNI: one vpdpbusd for maddubs + madd, one vpdpwssd for madd + add.
inline __m256i sum4_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i add_madd16(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }
constexpr bool kOneInstructionSum4 = true;  // vpdpbusd: formats with an offset take the unsigned form (dots256.inc)

}  // namespace

#include "cpu_kernels/x86/dots256.inc"

namespace {

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The exact total of 8 int32 lanes.
inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The sum of v's 16 float lanes in a fixed order: lane i + lane i + 8, then hsum's + 4, + 2, + 1 (the pairs GCC's
// _mm512_reduce_add_ps adds), so that a kernel's per-row and four-row paths, on any compiler, give the same floats.
inline float reduce_add(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// reduce_add of four vectors at once, [a, b, c, d]: the same pairs added (each bit for bit its reduce_add) in 14
// instructions where four reduce_adds take about 30.
inline __m128 reduce_add4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 128-bit lanes [a's t3 low, a's t3 high, b's ...]: lanes 0-1 plus lanes 2-3 of each.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // Lane k: the k-th vector's t6 (its t3's low half plus its high half).
  const __m512 t6 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 t8 = _mm512_add_ps(t6, _mm512_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 sums = _mm512_add_ps(t8, _mm512_shuffle_ps(t8, t8, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), sums));
}

// Four activation bytes as one int32, in all 16 lanes.
inline __m512i broadcast4x16(const int8_t* p) {
  int32_t four;
  std::memcpy(&four, p, 4);
  return _mm512_set1_epi32(four);
}

// A byte shuffle for the 512-bit K-quant kernels below: after a saturating pack of two vpdpbusd results, 128-bit
// lane `lane` holds four int16 sums of the first (half 0), then four of the second (half 1); each int16 pair takes
// the int16 scale of group(lane, half), bytes 2g and 2g + 1 of a scale vector broadcast to every lane.
template <typename Group>
constexpr std::array<int8_t, 64> scale_pattern(Group group) {
  std::array<int8_t, 64> b{};
  for (int lane = 0; lane < 4; ++lane)
    for (int half = 0; half < 2; ++half)
      for (int k = 0; k < 4; ++k) {
        const int g = group(lane, half), at = 16 * lane + 8 * half + 2 * k;
        b[at] = static_cast<int8_t>(2 * g);
        b[at + 1] = static_cast<int8_t>(2 * g + 1);
      }
  return b;
}

// The scales of eight consecutive Q5_0 blocks as floats: the halves at byte 0 of each 22-byte block (words 0, 11, ...,
// 77) gathered by word permutes from three loads of the blocks' bytes (the last masked to the words up to the eighth
// half), then one conversion. The same floats as block_scales8, in 6 instructions where its 8 loads and inserts take
// about 20: bench_dot many/avx512/Q5_0 (rows of 2048 in L2, one thread, alternating, one sitting) 23.8-24.3 ->
// 26.9-27.4 GB/s. Q8_0's many measured slower this way (41.1-41.5 -> 35.7-38.7; its eight blocks span 272 bytes, four
// loads) and keeps block_scales8.
inline __m256 eight_scales(const quant::BlockQ5_0* x) {
  constexpr int kWords = sizeof(quant::BlockQ5_0) / 2;  // 11
  constexpr int kTail = 7 * kWords + 1 - 64;            // the words read past the first 128 bytes
  static_assert(sizeof(quant::BlockQ5_0) % 2 == 0 && offsetof(quant::BlockQ5_0, d) == 0 && kTail > 0 && kTail <= 32);
  static constexpr auto kLow = [] {  // lanes whose half lies in words 0-63, from the first two loads
    std::array<int16_t, 32> w{};
    for (int b = 0; b < 8; ++b) w[b] = static_cast<int16_t>(b * kWords < 64 ? b * kWords : 0);
    return w;
  }();
  static constexpr auto kHigh = [] {  // the others, from the third
    std::array<int16_t, 32> w{};
    for (int b = 0; b < 8; ++b) w[b] = static_cast<int16_t>(b * kWords >= 64 ? b * kWords - 64 : 0);
    return w;
  }();
  constexpr __mmask32 kHighLanes = [] {
    __mmask32 m = 0;
    for (int b = 0; b < 8; ++b)
      if (b * kWords >= 64) m |= __mmask32{1} << b;
    return m;
  }();
  const auto* bytes = reinterpret_cast<const uint8_t*>(x);
  const __m512i w0 = load512(bytes), w1 = load512(bytes + 64);
  const __m512i w2 = _mm512_maskz_loadu_epi16(kTail == 32 ? ~__mmask32{0} : (__mmask32{1} << kTail) - 1, bytes + 128);
  const __m512i low = _mm512_permutex2var_epi16(w0, load512(kLow.data()), w1);
  const __m512i halves = _mm512_mask_permutexvar_epi16(low, kHighLanes, load512(kHigh.data()), w2);
  return _mm256_cvtph_ps(_mm512_castsi512_si128(halves));
}

// A scale_pattern as int16 lanes for vpermw: lane l takes word (its byte pair's index) + shift.
constexpr std::array<int16_t, 32> pattern_words(const std::array<int8_t, 64>& pattern, int shift) {
  std::array<int16_t, 32> w{};
  for (int l = 0; l < 32; ++l) w[l] = static_cast<int16_t>(pattern[2 * l] / 2 + shift);
  return w;
}

// q4k_scale_bytes of two super-blocks at once, block a's in the low 128-bit lane, b's in the high one: the same
// operations in 256-bit steps, for half the instructions of two calls.
inline __m256i q4k_scale_bytes_pair(const uint8_t* a, const uint8_t* b) {
  const __m256i u =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  const __m256i low = _mm256_srlv_epi32(_mm256_shuffle_epi32(u, 0x98), _mm256_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4));
  const __m256i top = _mm256_srlv_epi32(_mm256_shuffle_epi32(u, 0x50), _mm256_setr_epi32(0, 6, 0, 6, 0, 6, 0, 6));
  const __m256i keep =
      _mm256_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f);
  const __m256i high_bits = _mm256_setr_epi32(0, 0x03030303, 0, 0x03030303, 0, 0x03030303, 0, 0x03030303);
  return _mm256_or_si256(_mm256_and_si256(low, keep), _mm256_slli_epi32(_mm256_and_si256(top, high_bits), 4));
}

// Kernels whose activation side is worked out once per call (a Prepared with prepare(act, n_blocks)) and whose row<N>
// takes one weight row against N of them (out[j * ldo]): rows against one activation, its Prepared on the stack...
template <typename Kernel>
void prepared_many(int64_t n_blocks, const uint8_t* w, size_t row_bytes, int64_t n_rows, const void* act, float* out) {
  typename Kernel::Prepared prepared;
  prepared.prepare(act, n_blocks);
  const typename Kernel::Prepared* const one[1] = {&prepared};
  for (int64_t r = 0; r < n_rows; ++r)
    Kernel::template row<1>(reinterpret_cast<const typename Kernel::Block*>(w + static_cast<size_t>(r) * row_bytes),
                            n_blocks, one, out + r, 0);
}

// ... and against a few activations, each prepared once (per-thread buffers): row<2> per pair, row<1> for an odd one.
template <typename Kernel>
void prepared_few(int64_t n_blocks, const uint8_t* w, size_t row_bytes, int64_t n_rows, const uint8_t* act,
                  size_t stride, int64_t n_act, float* out, size_t ldo) {
  using Prepared = typename Kernel::Prepared;
  std::span<Prepared> prepared = scratch<Prepared, Kernel>(n_act);
  for (int64_t j = 0; j < n_act; ++j) prepared[j].prepare(act + j * stride, n_blocks);
  for (int64_t r = 0; r < n_rows; ++r) {
    const auto* x = reinterpret_cast<const typename Kernel::Block*>(w + static_cast<size_t>(r) * row_bytes);
    int64_t j = 0;
    for (; j + 2 <= n_act; j += 2) {
      const Prepared* const two[2] = {&prepared[j], &prepared[j + 1]};
      Kernel::template row<2>(x, n_blocks, two, out + static_cast<size_t>(j) * ldo + r, ldo);
    }
    if (j < n_act) {
      const Prepared* const one[1] = {&prepared[j]};
      Kernel::template row<1>(x, n_blocks, one, out + static_cast<size_t>(j) * ldo + r, ldo);
    }
  }
}

// Q4_K (and Q5_K: QkZmm<BlockQ5_K, true>, its fifth bits added under a mask, 16 where set) for one or two activation
// rows in 512-bit steps. The 64 bytes of qs[64c..64c+63] hold groups 4c and 4c+2 in
// their low nibbles and 4c+1 and 4c+3 in their high ones; one vpdpbusd per nibble half gives the 4-value sums of two
// groups (the activation's two 32-byte runs put side by side), a saturating pack puts both halves' int32 sums
// (|sum| <= 4 * 31 * 128, so nothing saturates) in one vector of int16 pairs, and one vpdpwssd multiplies each pair
// by its group scale and adds it to the super-block's sums: per super-block 4 vpdpbusd and 2 vpdpwssd where the
// 256-bit kernel takes 8 maddubs and 8 vpdpwssd. The mins meet the activation's sixteen 16-value sums in one 256-bit
// madd (each min taken twice); d and dmin convert in one instruction, and the 16 float lanes are summed only at the
// end of the row. The integer sums are the 256-bit kernel's; their float lanes are split differently, so results
// differ from the AVX2 tier's by rounding. bench_dot (L2-resident, one thread, Zen 4): 32.5 GB/s of weights against
// 25.7 for the 256-bit kernel; the one-madd mins, the single conversion and the 512-bit float lanes took it from 32.2
// to 37.0 GB/s (a standalone copy of both, alternating, one sitting). Q5_K through it: bench_dot dot/avx512/Q5_K
// 22.9-23.3 -> 33.9-34.9 GB/s against the 256-bit kernel (the two binaries alternating, two sittings).
template <typename BlockT, bool kFifthBit>
struct QkZmm {
  // The shuffles for c = 0 and 1: in 128-bit lane k the pack holds four sums of the low-nibble vector's lane k
  // (group 4c, or 4c + 2 for k >= 2), then four of the high-nibble vector's (one group more).
  static constexpr std::array<int8_t, 64> kScalePatterns[2] = {
      scale_pattern([](int lane, int half) { return (lane >= 2 ? 2 : 0) + half; }),
      scale_pattern([](int lane, int half) { return 4 + (lane >= 2 ? 2 : 0) + half; })};

  // The activation rows' side, straight from their Q8_K blocks: the two 64-byte operands of 128-value half c of
  // super-block i (values 0-31 and 64-95 side by side, then 32-63 and 96-127), each put together from two loads;
  // the 16-value sums of super-blocks i and i + 1 side by side; their scales, each twice.
  struct Halves {
    __m512i lo, hi;
  };
  template <int N>
  struct Blocks {
    ActRows<quant::BlockQ8_K, N> y;
    Halves halves(int j, int64_t i, int c) const {
      const int8_t* a = y[j][i].qs + 128 * c;
      return {_mm512_inserti64x4(_mm512_castsi256_si512(load256(a)), load256(a + 64), 1),
              _mm512_inserti64x4(_mm512_castsi256_si512(load256(a + 32)), load256(a + 96), 1)};
    }
    const quant::BlockQ8_K& block(int j, int64_t i) const { return y[j][i]; }
    __m512i pair_sums(int j, int64_t i) const {
      return _mm512_inserti64x4(_mm512_castsi256_si512(load256(y[j][i].bsums)), load256(y[j][i + 1].bsums), 1);
    }
    __m128 pair_scales(int j, int64_t i) const {
      return _mm_setr_ps(y[j][i].d, y[j][i].d, y[j][i + 1].d, y[j][i + 1].d);
    }
  };
  // An activation row whose operands were put together once (Prepared): one load each.
  struct PreparedView {
    const quant::BlockQ8_K* y;
    const __m512i* operands;  // 4 per super-block: half 0's two, then half 1's
    const int16_t* sums;      // 16 per super-block, packed
    const float* scales;      // 2 per super-block: its d twice
  };
  // N of them as the activation rows of rows_of<N>.
  template <int N>
  struct PreparedRows {
    PreparedView row[N];
    Halves halves(int j, int64_t i, int c) const {
      return {row[j].operands[4 * i + 2 * c], row[j].operands[4 * i + 2 * c + 1]};
    }
    const quant::BlockQ8_K& block(int j, int64_t i) const { return row[j].y[i]; }
    __m512i pair_sums(int j, int64_t i) const { return load512(row[j].sums + 16 * i); }
    __m128 pair_scales(int j, int64_t i) const { return _mm_loadu_ps(row[j].scales + 2 * i); }
  };

  // Where a pair of super-blocks finds its scales and mins: q4k_scale_bytes of both (block i in bytes 0-15, i + 1 in
  // 16-31) widened to int16, then one vpermw per operand. Scale operand c of block k: kScalePatterns[c]'s int16
  // lanes, shifted by 16 words for block 1; mins: each block's eight mins, each twice (one per 16-value sum).
  static constexpr std::array<int16_t, 32> kPairScaleWords[2][2] = {
      {pattern_words(kScalePatterns[0], 0), pattern_words(kScalePatterns[1], 0)},
      {pattern_words(kScalePatterns[0], 16), pattern_words(kScalePatterns[1], 16)}};
  static constexpr std::array<int16_t, 32> kPairMinWords = [] {
    std::array<int16_t, 32> w{};
    for (int l = 0; l < 32; ++l) w[l] = static_cast<int16_t>(16 * (l / 16) + 8 + (l % 16) / 2);
    return w;
  }();

  // The 4-value sums of super-block x's 256 values against activation row j, each pair of int16 sums times its
  // group's scale (sc: operand c's scales), in 16 int32 lanes.
  template <typename Act>
  static __m512i super_sums(const BlockT& x, const Act& act, int j, int64_t i, const __m512i sc[2]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i sumi = _mm512_setzero_si512();
    [[maybe_unused]] __m512i qh;
    if constexpr (kFifthBit) qh = _mm512_broadcast_i64x4(load256(x.qh));  // both halves: value l's bits in byte l
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      const __m512i q4 = load512(x.qs + 64 * c);
      __m512i lo = _mm512_and_si512(q4, low4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), low4);
      if constexpr (kFifthBit) {
        // Q5_K: group g's fifth bits are bit g of qh; lo holds groups 4c and 4c + 2, hi 4c + 1 and 4c + 3.
        const auto bits = [](int first, int second) {
          return _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << first)),
                                    _mm256_set1_epi8(static_cast<char>(1 << second)), 1);
        };
        const __m512i sixteen = _mm512_set1_epi8(16);
        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, bits(4 * c, 4 * c + 2)), lo, sixteen);
        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bits(4 * c + 1, 4 * c + 3)), hi, sixteen);
      }
      const auto [a_lo, a_hi] = act.halves(j, i, c);
      const __m512i v_lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, a_lo);
      const __m512i v_hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, a_hi);
      sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(v_lo, v_hi), sc[c]);
    }
    return sumi;
  }

  // Super-blocks go in pairs (N <= 2), whose scales, mins, d and dmin are unpacked together, then one alone; either
  // way each super-block adds to the float lanes in order with the same products, so every path gives the same
  // floats. bench_dot (rows of 2048 in L2, one thread, alternating, one sitting): many/avx512/Q4_K 36.0-36.5
  // -> 37.6-38.2 GB/s, rows4 (two cols<2> calls) 22.6-23.1 -> 32.3-33.6; dot (cols<1>) unchanged at about 30.
  // A pair's scale bytes come from one 256-bit pass (q4k_scale_bytes_pair), and its mins go to 16 float lanes of their
  // own, block i's in lanes 0-7 and block i + 1's in lanes 8-15 (a lone block: the lanes of its index's parity), with
  // one permute of dmin and one FMA where two 256-bit halves took seven instructions. A harness (64 rows of 2048 of
  // the bench model's ffn_gate_exps in L2, one thread, 3 rounds alternating): 39.0-40.0 -> 45.6-46.3 GB/s; from DRAM
  // (two threads, two 104 MB matrices, 41 rounds alternating in one process) +0.6 and +1.6 % in two sittings: there
  // each core's stream, not its arithmetic, sets the pace.
  // Inlined where one activation's rows go one after another (row<1> in prepared_many's loop: the constants and the
  // activation's view stay in registers across rows), out of line elsewhere (rows_of).
  template <int N, typename Act>
  __attribute__((always_inline)) static void rows_of_inline(int64_t n, const void* w, const Act& act, float* out) {
    const auto* x = static_cast<const BlockT*>(w);
    const __m512i pattern0 = load512(kScalePatterns[0].data()), pattern1 = load512(kScalePatterns[1].data());
    __m512 acc[N], acc_min[N];
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[j] = acc_min[j] = _mm512_setzero_ps();
    const int64_t n_super = n / quant::kQK_K;
    int64_t i = 0;
    if constexpr (N <= 2) {
      const __m512i words[2][2] = {{load512(kPairScaleWords[0][0].data()), load512(kPairScaleWords[0][1].data())},
                                   {load512(kPairScaleWords[1][0].data()), load512(kPairScaleWords[1][1].data())}};
      const __m512i min_words = load512(kPairMinWords.data());
      const __m512i dmin_lanes = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
      for (; i + 2 <= n_super; i += 2) {
        const __m512i wide = _mm512_cvtepu8_epi16(q4k_scale_bytes_pair(x[i].scales, x[i + 1].scales));
        const __m512i mins = _mm512_permutexvar_epi16(min_words, wide);
        const __m512i sc0[2] = {_mm512_permutexvar_epi16(words[0][0], wide),
                                _mm512_permutexvar_epi16(words[0][1], wide)};
        const __m512i sc1[2] = {_mm512_permutexvar_epi16(words[1][0], wide),
                                _mm512_permutexvar_epi16(words[1][1], wide)};
        uint32_t d0, d1;
        std::memcpy(&d0, &x[i].d, sizeof d0);
        std::memcpy(&d1, &x[i + 1].d, sizeof d1);
        const __m128 xd = _mm_cvtph_ps(_mm_setr_epi32(static_cast<int>(d0), static_cast<int>(d1), 0, 0));
#pragma GCC unroll 8
        for (int j = 0; j < N; ++j) {
          const __m512i s0 = super_sums(x[i], act, j, i, sc0), s1 = super_sums(x[i + 1], act, j, i + 1, sc1);
          const __m128 dm = _mm_mul_ps(xd, act.pair_scales(j, i));  // d, dmin of i; d, dmin of i + 1
          acc[j] = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), _mm512_cvtepi32_ps(s0), acc[j]);
          acc[j] = _mm512_fmadd_ps(_mm512_broadcastss_ps(_mm_movehl_ps(dm, dm)), _mm512_cvtepi32_ps(s1), acc[j]);
          const __m512 min_products = _mm512_cvtepi32_ps(_mm512_madd_epi16(mins, act.pair_sums(j, i)));
          acc_min[j] =
              _mm512_fmadd_ps(_mm512_permutexvar_ps(dmin_lanes, _mm512_castps128_ps512(dm)), min_products, acc_min[j]);
        }
      }
    }
    for (; i < n_super; ++i) {
      const __m128i bytes = q4k_scale_bytes(x[i].scales);
      const __m256i mins = q4k_mins_per_16(bytes);
      const __m512i scales = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(bytes));
      const __m512i sc[2] = {_mm512_shuffle_epi8(scales, pattern0), _mm512_shuffle_epi8(scales, pattern1)};
      const __m128 xd = d_and_dmin(x[i]);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        const __m512i sumi = super_sums(x[i], act, j, i, sc);
        const quant::BlockQ8_K& y = act.block(j, i);
        const __m128 dm = _mm_mul_ps(xd, _mm_set1_ps(y.d));
        acc[j] = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), _mm512_cvtepi32_ps(sumi), acc[j]);
        const __m512 min_products =
            _mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm256_madd_epi16(mins, load256(y.bsums))));
        acc_min[j] =
            _mm512_mask3_fmadd_ps(_mm512_broadcastss_ps(_mm_movehdup_ps(dm)),
                                  i % 2 ? _mm512_shuffle_f32x4(min_products, min_products, 0x44) : min_products,
                                  acc_min[j], i % 2 ? 0xFF00 : 0x00FF);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) out[j] = _mm512_reduce_add_ps(acc[j]) - _mm512_reduce_add_ps(acc_min[j]);
  }
  template <int N, typename Act>
  static void rows_of(int64_t n, const void* w, const Act& act, float* out) {
    rows_of_inline<N>(n, w, act, out);
  }

  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    rows_of<N>(n, w, Blocks<N>{ActRows<quant::BlockQ8_K, N>(act, stride)}, out);
  }

  // Rows against one activation (decode): its operands put together once for all rows (four 64-byte vectors per
  // super-block), so a row's step loads each with one instruction where cols<1> takes two loads and an insert. The
  // same integers and float steps as cols<1>: each row's result is its vec_dot's bit for bit. bench_dot many/avx512
  // (64 rows of 2048 in L2, one thread, alternating, one sitting): 31.6-33.3 -> 34.0-38.5 GB/s. From DRAM the decode
  // step's rows stay bound by the core's memory stream (stream/avx512/Q4_K/t1 about 23 GB/s either way); the gain
  // shows where the two cores out-read the arithmetic.
  static constexpr int64_t kManyMaxSuper = 64;  // rows of up to 16384 values

  // One activation row's operands (n_super super-blocks), put together once per call: the drivers' Prepared
  // (prepared_many: on the stack, 18.5 kB at most; prepared_few: per-thread buffers).
  using Block = BlockT;
  struct Prepared {
    __m512i operands[4 * kManyMaxSuper];
    alignas(64) int16_t sums[16 * kManyMaxSuper];
    alignas(64) float scales[2 * kManyMaxSuper];
    PreparedRows<1> one;  // its view, as rows_of<1> takes it

    void prepare(const void* act, int64_t n_super) {
      const Blocks<1> blocks{ActRows<quant::BlockQ8_K, 1>(static_cast<const uint8_t*>(act), 0)};
      const auto* y = static_cast<const quant::BlockQ8_K*>(act);
      for (int64_t i = 0; i < n_super; ++i) {
        for (int c = 0; c < 2; ++c) {
          const auto [a_lo, a_hi] = blocks.halves(0, i, c);
          operands[4 * i + 2 * c] = a_lo;
          operands[4 * i + 2 * c + 1] = a_hi;
        }
        std::memcpy(sums + 16 * i, y[i].bsums, sizeof y[i].bsums);
        scales[2 * i] = scales[2 * i + 1] = y[i].d;
      }
      one = {{{y, operands, sums, scales}}};
    }
  };

  // One weight row against one prepared activation (prepared_many's loop), through rows_of_inline with the view as it
  // lies in its Prepared. A copy of the view made for each row and read back at once by the out-of-line rows_of cost
  // 5-6 % of many's rate in L2; inlining gains 4-7 % in L2 and 2-4 % from DRAM at two threads over that (64 rows of
  // 2048 in L2, one thread; 512 MB of rows; old and new kernels in one process, 15 rounds alternating, per-round
  // medians).
  template <int N>
  __attribute__((always_inline)) static void row(const BlockT* x, int64_t n_super, const Prepared* const (&p)[N],
                                                 float* out, size_t /*ldo*/) {
    static_assert(N == 1, "few pairs its activations itself");
    rows_of_inline<1>(n_super * quant::kQK_K, x, p[0]->one, out);
  }

  static void many(int64_t n, const uint8_t* w, size_t row_bytes, int64_t n_rows, const void* act, float* out) {
    const int64_t n_super = n / quant::kQK_K;
    if (n_super > kManyMaxSuper) return dot_many<QkZmm>(n, w, row_bytes, n_rows, act, out);
    prepared_many<QkZmm>(n_super, w, row_bytes, n_rows, act, out);
  }

  // Rows against a few activation rows (a verification step, a few sequences decoded together), each prepared once
  // (per-thread buffers): rows_of<2> for each pair of them, rows_of<1> for an odd one, each row's results their
  // vec_dot's bit for bit. Each pair's views are put side by side once per call, not per row (where the out-of-line
  // rows_of<2> would read back what was just stored; inlined it ran 1-2 % slower in L2). rows_of<2> over the rows' own
  // loads and inserts ran at less than half of many's rate (harness, 64 rows of 2048 in L2, one thread: 22 against 49
  // GB/s of weights).
  static void few(int64_t n, const uint8_t* w, size_t row_bytes, int64_t n_rows, const uint8_t* act, size_t stride,
                  int64_t n_act, float* out, size_t ldo) {
    constexpr int64_t kMaxPairs = 4;
    const int64_t n_super = n / quant::kQK_K, n_pairs = n_act / 2;
    if (n_super > kManyMaxSuper || n_pairs > kMaxPairs)
      return dot_few<QkZmm>(n, w, row_bytes, n_rows, act, stride, n_act, out, ldo);
    std::span<Prepared> prepared = scratch<Prepared, QkZmm>(n_act);
    for (int64_t j = 0; j < n_act; ++j) prepared[j].prepare(act + j * stride, n_super);
    PreparedRows<2> pairs[kMaxPairs];
    for (int64_t q = 0; q < n_pairs; ++q) pairs[q] = {{prepared[2 * q].one.row[0], prepared[2 * q + 1].one.row[0]}};
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
      for (int64_t q = 0; q < n_pairs; ++q) {
        float two[2];
        rows_of<2>(n, row, pairs[q], two);
        out[static_cast<size_t>(2 * q) * ldo + r] = two[0];
        out[static_cast<size_t>(2 * q + 1) * ldo + r] = two[1];
      }
      if (2 * n_pairs < n_act)
        rows_of<1>(n, row, prepared[n_act - 1].one, out + static_cast<size_t>(n_act - 1) * ldo + r);
    }
  }
};
using Q4KZmm = QkZmm<quant::BlockQ4_K, false>;
using Q5KZmm = QkZmm<quant::BlockQ5_K, true>;

// Q5_0 for one or two activation rows, two blocks per 512-bit step. Each block's 16 bytes of nibbles go to two
// 128-bit lanes (a broadcast, then a masked broadcast of the next block's), shifted by 0 and 4: values 0-15 and 16-31
// of both blocks in order. The fifth bits of both, as one 64-bit mask, add 16 where set; the unsigned values (0..31)
// meet the activation in one vpdpbusd and the offset in another (16 x the activation's 4-value sums). The int32
// lanes are not reduced per block: each converts to float and takes its block's scale (a permute of the eight
// blocks' scales), and the 16 float lanes are summed once at the end of the row. Blocks past the last eight go in
// pairs, then one. The pairs of a step of eight alternate between two accumulators (added before the final sum), which
// halves the chain of dependent FMAs: bench_dot many/avx512/Q5_0 (L2, one thread, alternating, 4 rounds) 26.9-27.6 ->
// 28.2-28.5 GB/s in three of them. bench_dot (one thread, Zen 4, alternating, one sitting): L2-resident rows of
// 2048 21.1-21.3 against 17.8-18.0 GB/s for the 256-bit kernel with eight-block totals; streamed from DRAM 18.2-19.2
// against 15.6-16.6 (one thread) and 36.2-36.4 against 30.9-31.2 (two).
struct Q5PairZmm {
  using Block = quant::BlockQ5_0;
  // The unsigned values (0..31) of blocks b and b + 1: 32 of each, in order.
  static __m512i pair_values(const quant::BlockQ5_0* x, int64_t b) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    const __m512i shifts = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    __m512i q = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs)));
    q = _mm512_mask_broadcast_i32x4(q, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b + 1].qs)));
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi64(q, shifts), low4);
    uint32_t h0, h1;
    std::memcpy(&h0, x[b].qh, 4);
    std::memcpy(&h1, x[b + 1].qh, 4);
    return _mm512_mask_add_epi8(low, _cvtu64_mask64(uint64_t{h1} << 32 | h0), low, sixteen);
  }

  // The activation's blocks b and b + 1 side by side (64 bytes), and 16 x their 4-value sums: the offset that the
  // unsigned values carry, per int32 lane.
  static __m512i act_pair(const quant::BlockQ8_0* y, int64_t b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(y[b].qs)), load256(y[b + 1].qs), 1);
  }
  static __m512i offset_sums(__m512i a) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(16), a); }
  // The offset negated: the starting value of a vpdpbusd that then gives a pair's lanes less the offset.
  static __m512i negated_offset(__m512i a) { return _mm512_sub_epi32(_mm512_setzero_si512(), offset_sums(a)); }
  // A pair's 16 int32 lanes against activation pair a: the values' dots less the offset.
  static __m512i pair_sums(__m512i u, __m512i a) {
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, a), offset_sums(a));
  }

  // The scales of a row's four blocks as floats: the halves at words 0, 11, 22 and 33 of its 88 bytes, from one load
  // and one masked load (the kTailWords words past the first 64 bytes) by one word permute, where the per-pair path
  // converts each half on its own (about 3 instructions each) and puts the products together per pair.
  static __m128 four_scales(const quant::BlockQ5_0* x) {
    constexpr int kWords = sizeof(quant::BlockQ5_0) / 2;  // 11
    constexpr int kTailWords = (4 * static_cast<int>(sizeof(quant::BlockQ5_0)) - 64) / 2;
    static_assert(sizeof(quant::BlockQ5_0) % 2 == 0 && offsetof(quant::BlockQ5_0, d) == 0 && kTailWords > 0 &&
                  kTailWords <= 32);
    static constexpr auto kIndex = [] {  // word b * 11: from the first load below 32, else the second's word - 32
      std::array<int16_t, 32> words{};
      for (int b = 0; b < 4; ++b) words[b] = static_cast<int16_t>(b * kWords);
      return words;
    }();
    const auto* bytes = reinterpret_cast<const uint8_t*>(x);
    const __m512i tail = _mm512_maskz_loadu_epi16((__mmask32{1} << kTailWords) - 1, bytes + 64);
    const __m512i halves = _mm512_permutex2var_epi16(load512(bytes), load512(kIndex.data()), tail);
    return _mm_cvtph_ps(_mm512_castsi512_si128(halves));
  }

  // Rows of four blocks (MLA's attn_k_b: 128 values) against one activation: per row its four scales in one step
  // and per pair a permute of them, four rows summed at once (reduce_add4). The same integers, products and float
  // steps as cols<1>, so each row is its vec_dot's bit for bit. bench_dot heads/avx512/kb (16 heads of 512 rows from
  // DRAM, two threads, alternating, two sittings of 4 rounds): 20.8-24.6 -> 25.1-31.2 and 25.0-27.1 -> 31.9-34.3 GB/s;
  // one thread on rows in L2 ran at 11.6-11.9 GB/s before, against 29 for rows of 1408.
  static void many_four_blocks(const uint8_t* w, size_t row_bytes, int64_t n_rows, const quant::BlockQ8_0* y,
                               float* out) {
    const __m512i a[2] = {act_pair(y, 0), act_pair(y, 2)};
    const __m512i start[2] = {negated_offset(a[0]), negated_offset(a[1])};
    const __m128 yd =
        _mm_setr_ps(fp16_to_fp32(y[0].d), fp16_to_fp32(y[1].d), fp16_to_fp32(y[2].d), fp16_to_fp32(y[3].d));
    auto row_sums = [&](int64_t r) {
      const auto* x = reinterpret_cast<const quant::BlockQ5_0*>(w + static_cast<size_t>(r) * row_bytes);
      const __m256 scales = _mm256_castps128_ps256(_mm_mul_ps(four_scales(x), yd));  // lanes 4-7 unused
      __m512 acc = _mm512_setzero_ps();
      for (int p = 0; p < 2; ++p) {
        const __m512i sums = _mm512_dpbusd_epi32(start[p], pair_values(x, 2 * p), a[p]);
        acc = _mm512_fmadd_ps(pair_scales(scales, p), _mm512_cvtepi32_ps(sums), acc);
      }
      return acc;
    };
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const __m128 sums = reduce_add4(row_sums(r), row_sums(r + 1), row_sums(r + 2), row_sums(r + 3));
      _mm_storeu_ps(out + r, _mm_add_ps(sums, _mm_setzero_ps()));  // + cols<1>'s tail of an even row: 0
    }
    for (; r < n_rows; ++r) out[r] = reduce_add(row_sums(r)) + 0.0f;
  }

  // Rows of fewer than eight blocks against one activation, each row the instruction sequence of cols<1> but with the
  // activation's side done once for all rows: its pairs of blocks, their 16x sums (the offset) and scales. Rows of
  // four blocks go through many_four_blocks, longer rows through many_long.
  static void many(int64_t n, const uint8_t* w, size_t row_bytes, int64_t n_rows, const void* act, float* out) {
    const int64_t n_blocks = n / 32;
    const auto* y = static_cast<const quant::BlockQ8_0*>(act);
    if (n_blocks >= 8) return many_long(n, w, row_bytes, n_rows, act, out);
    if (n_blocks == 4) return many_four_blocks(w, row_bytes, n_rows, y, out);
    const int64_t n_pairs = n_blocks / 2;
    __m512i a[3], start[3];
    float yd[7];
    for (int64_t b = 0; b < n_blocks; ++b) yd[b] = fp16_to_fp32(y[b].d);
    for (int64_t p = 0; p < n_pairs; ++p) {
      a[p] = act_pair(y, 2 * p);
      start[p] = negated_offset(a[p]);
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      const auto* x = reinterpret_cast<const quant::BlockQ5_0*>(w + static_cast<size_t>(r) * row_bytes);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t p = 0; p < n_pairs; ++p) {
        const __m512i sums = _mm512_dpbusd_epi32(start[p], pair_values(x, 2 * p), a[p]);
        const float xd0 = fp16_to_fp32(x[2 * p].d), xd1 = fp16_to_fp32(x[2 * p + 1].d);
        const __m512 scale = rest_scales(xd0, yd[2 * p], xd1, yd[2 * p + 1]);
        acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc);
      }
      float tail = 0.0f;
      if (2 * n_pairs < n_blocks) {
        const int64_t i = 2 * n_pairs;
        const auto q = block_weights<Q5Values>(x[i]);
        tail = fp16_to_fp32(x[i].d) * yd[i] * static_cast<float>(hsum_epi32(q.dot(load256(y[i].qs))));
      }
      out[r] = reduce_add(acc) + tail;
    }
  }

  // Lanes 0-7 take scale 2p of the eight, lanes 8-15 scale 2p + 1.
  static __m512 pair_scales(__m256 scales8, int p) {
    const __m512i index =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * p)), _mm256_set1_epi32(2 * p + 1), 1);
    return _mm512_permutexvar_ps(index, _mm512_castps256_ps512(scales8));
  }

  // A pair's scales outside the steps of eight: lanes 0-7 xd0 x yd0, lanes 8-15 xd1 x yd1.
  static __m512 rest_scales(float xd0, float yd0, float xd1, float yd1) {
    return _mm512_insertf32x8(_mm512_set1_ps(xd0 * yd0), _mm256_set1_ps(xd1 * yd1), 1);
  }

  // The pairs of blocks from `i` on that do not make a step of eight, then the last odd block: into acc and tail.
  template <int N>
  static void rest(const quant::BlockQ5_0* x, const ActRows<quant::BlockQ8_0, N>& y, int64_t i, int64_t n_blocks,
                   __m512 (&acc)[N], float (&tail)[N]) {
    for (; i + 2 <= n_blocks; i += 2) {
      const __m512i u = pair_values(x, i);
      const float xd0 = fp16_to_fp32(x[i].d), xd1 = fp16_to_fp32(x[i + 1].d);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        const __m512i sums = pair_sums(u, act_pair(y[j], i));
        const __m512 scale = rest_scales(xd0, fp16_to_fp32(y[j][i].d), xd1, fp16_to_fp32(y[j][i + 1].d));
        acc[j] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[j]);
      }
    }
    odd_block<N>(x, y, i, n_blocks, tail);
  }

  // Block i alone when it is the row's last (an odd number of blocks), else 0: into tail.
  template <int N>
  static void odd_block(const quant::BlockQ5_0* x, const ActRows<quant::BlockQ8_0, N>& y, int64_t i, int64_t n_blocks,
                        float (&tail)[N]) {
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) tail[j] = 0.0f;
    if (i < n_blocks) {
      const auto q = block_weights<Q5Values>(x[i]);
      const float xd = fp16_to_fp32(x[i].d);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        const __m256i qy = load256(y[j][i].qs);
        tail[j] = xd * fp16_to_fp32(y[j][i].d) * static_cast<float>(hsum_epi32(q.dot(qy)));
      }
    }
  }

  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const auto* x = static_cast<const quant::BlockQ5_0*>(w);
    const ActRows<quant::BlockQ8_0, N> y(act, stride);
    __m512 acc[N], odd[N];
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[j] = odd[j] = _mm512_setzero_ps();
    const int64_t n_blocks = n / 32;
    int64_t i = 0;
    for (; i + 8 <= n_blocks; i += 8) {
      const __m256 xd = block_scales8(x + i);
      __m256 scales8[N];
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) scales8[j] = _mm256_mul_ps(xd, block_scales8(y[j] + i));
#pragma GCC unroll 8
      for (int p = 0; p < 4; ++p) {
        const int64_t b = i + 2 * p;
        const __m512i u = pair_values(x, b);
#pragma GCC unroll 8
        for (int j = 0; j < N; ++j) {
          const __m512i sums = pair_sums(u, act_pair(y[j], b));
          __m512& into = p % 2 ? odd[j] : acc[j];
          into = _mm512_fmadd_ps(pair_scales(scales8[j], p), _mm512_cvtepi32_ps(sums), into);
        }
      }
    }
    float tail[N];
    rest<N>(x, y, i, n_blocks, acc, tail);
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) out[j] = reduce_add(_mm512_add_ps(acc[j], odd[j])) + tail[j];
  }

  // Rows of eight blocks or more against one activation (decode): cols<1>'s instructions for the weights, with the
  // activation's side of the steps of eight done once per call: each pair's 64 bytes side by side (one load, no
  // insert), 16 x its 4-value sums negated as the vpdpbusd's starting value (the integers cols<1> gets from a second
  // vpdpbusd and a subtraction), and each eight blocks' scales as floats. The same integers and float steps as
  // cols<1>, so each row's result is its vec_dot's bit for bit. bench_dot many/avx512/Q5_0 (alternating, one
  // sitting): 19.6-21.4 -> 24.5-26.5 GB/s. The pairs past the last eight (V2-Lite's expert down rows of 1408 values
  // end with two) take prepared operands too, not rest<1>'s: rows of 1408 from L2 25.6 -> 29.1 GB/s, from DRAM one
  // thread 20.8 -> 22.4, two threads 38.6-41.4 -> 43.1-45.0 (harness, alternating).
  static constexpr int64_t kManyMaxSteps = 32;  // rows of up to 8192 values

  // One activation's side of rows of eight blocks or more, once per call: per pair p, [2p] its 64 bytes and [2p + 1]
  // its negated offset sums (the pairs past the last step of eight too, up to three), each step's scales, and the
  // scales of the blocks past the steps as floats.
  struct Prepared {
    const quant::BlockQ8_0* y = nullptr;
    __m512i pairs[8 * kManyMaxSteps + 6];
    __m256 scales[kManyMaxSteps];
    float rest_yd[6];

    void prepare(const void* act, int64_t n_blocks) {
      y = static_cast<const quant::BlockQ8_0*>(act);
      const int64_t n_steps = n_blocks / 8, n_pairs = n_blocks / 2;
      for (int64_t s = 0; s < n_steps; ++s) scales[s] = block_scales8(y + 8 * s);
      for (int64_t b = 8 * n_steps; b < 2 * n_pairs; ++b) rest_yd[b - 8 * n_steps] = fp16_to_fp32(y[b].d);
      for (int64_t p = 0; p < n_pairs; ++p) {
        const __m512i a = act_pair(y, 2 * p);
        pairs[2 * p] = a;
        pairs[2 * p + 1] = negated_offset(a);
      }
    }
  };

  // One weight row of eight blocks or more against N prepared activations: its pairs' values and its steps' scales
  // unpacked once for all of them, each activation's integers and float steps cols<1>'s. Inlined into the row loops.
  template <int N>
  __attribute__((always_inline)) static void row(const quant::BlockQ5_0* x, int64_t n_blocks,
                                                 const Prepared* const (&p)[N], float* out, size_t ldo) {
    const int64_t n_steps = n_blocks / 8, n_pairs = n_blocks / 2;
    __m512 acc[N], odd[N];
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[j] = odd[j] = _mm512_setzero_ps();
    for (int64_t s = 0; s < n_steps; ++s) {
      const __m256 xd = eight_scales(x + 8 * s);
      __m256 scales8[N];
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) scales8[j] = _mm256_mul_ps(xd, p[j]->scales[s]);
#pragma GCC unroll 8
      for (int q = 0; q < 4; ++q) {
        const __m512i u = pair_values(x, 8 * s + 2 * q);
#pragma GCC unroll 8
        for (int j = 0; j < N; ++j) {
          const __m512i* a = p[j]->pairs + 8 * s;
          const __m512i sums = _mm512_dpbusd_epi32(a[2 * q + 1], u, a[2 * q]);
          __m512& into = q % 2 ? odd[j] : acc[j];
          into = _mm512_fmadd_ps(pair_scales(scales8[j], q), _mm512_cvtepi32_ps(sums), into);
        }
      }
    }
    // The pairs past the steps as rest<1> takes them (the same integers and float steps), prepared.
    for (int64_t b = 8 * n_steps; b < 2 * n_pairs; b += 2) {
      const __m512i u = pair_values(x, b);
      const float xd0 = fp16_to_fp32(x[b].d), xd1 = fp16_to_fp32(x[b + 1].d);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        const __m512i sums = _mm512_dpbusd_epi32(p[j]->pairs[b + 1], u, p[j]->pairs[b]);
        const float* yd = p[j]->rest_yd + (b - 8 * n_steps);
        acc[j] = _mm512_fmadd_ps(rest_scales(xd0, yd[0], xd1, yd[1]), _mm512_cvtepi32_ps(sums), acc[j]);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      float tail[1];
      odd_block<1>(x, ActRows<quant::BlockQ8_0, 1>(reinterpret_cast<const uint8_t*>(p[j]->y), 0), 2 * n_pairs, n_blocks,
                   tail);
      out[static_cast<size_t>(j) * ldo] = reduce_add(_mm512_add_ps(acc[j], odd[j])) + tail[0];
    }
  }

  static void many_long(int64_t n, const uint8_t* w, size_t row_bytes, int64_t n_rows, const void* act, float* out) {
    // The Prepared on the stack (17 kB at most).
    if (n / 32 / 8 > kManyMaxSteps) return dot_many<Q5PairZmm>(n, w, row_bytes, n_rows, act, out);
    prepared_many<Q5PairZmm>(n / 32, w, row_bytes, n_rows, act, out);
  }

  // Rows against a few activations: rows of eight blocks or more with each activation prepared once (per-thread
  // buffers) and row<2> per pair, row<1> for an odd one; shorter rows (MLA's attn_k_b) one activation after another
  // through many over pieces kept in L2. Each result many's, bit for bit.
  static void few(int64_t n, const uint8_t* w, size_t row_bytes, int64_t n_rows, const uint8_t* act, size_t stride,
                  int64_t n_act, float* out, size_t ldo) {
    const int64_t n_blocks = n / 32;
    if (n_blocks < 8 || n_blocks / 8 > kManyMaxSteps)
      return dot_few_by_activation<&Q5PairZmm::many>(n, w, row_bytes, n_rows, act, stride, n_act, out, ldo);
    prepared_few<Q5PairZmm>(n_blocks, w, row_bytes, n_rows, act, stride, n_act, out, ldo);
  }
};

// Q8_0 rows against one activation (decode), as the 256-bit Blocks32 kernel but with the weights made unsigned
// (xor 0x80: w + 128) so that one vpdpbusd takes them as they are, and each block's total less 128 x the activation's
// sum over the block (worked out once per call, eight blocks to a vector, with the activation's eight-block scales):
// per block an xor where cols<1> takes two sign operations, and the same integers and float steps, so each row's
// result is its vec_dot's bit for bit. bench_dot many/avx512/Q8_0 (alternating, one sitting, the VM in a slow phase):
// 19.7-25.6 -> 26.7-32.7 GB/s. The offsets were once -128 x the 4-value sums per lane, 32 bytes a block, which kept
// rows past 4096 values (V2-Lite's dense ffn_down: 10944) on cols<1> so as to leave L1 to the weights; as one int32 a
// block they take 4 bytes, and such rows come here too. In a harness (old and new kernels in one process, 21 rounds
// alternating, one thread): 64 rows in L2 of 10944 values 39.2 -> 52.5 GB/s, of 1408 values 47.4 -> 55.2; from DRAM
// (384 MB in 2 MB pages, 15 rounds) 34.8 -> 35.6 (two threads), 25.9 -> 26.1 (one).
struct Q8ZeroMany {
  using Block = quant::BlockQ8_0;
  // Rows of up to 32768 values (8 kB of offsets and scales an activation); longer rows go through cols<1>.
  static constexpr int64_t kMaxBlocks = 1024;
  using Rows = Blocks32<quant::BlockQ8_0, Q8Values>;

  // One activation's side, worked out once per call: per step of eight blocks, 128 x each block's activation sum (what
  // the weights' +128 adds to its total) and the activation's scales; per block past the last step, -128 x its
  // 4-value sums, lane by lane.
  struct Prepared {
    const quant::BlockQ8_0* y = nullptr;
    __m256i offsets[kMaxBlocks / 8];
    __m256 scales[kMaxBlocks / 8];
    __m256i tail_start[8];

    void prepare(const void* act, int64_t n_blocks) {
      y = static_cast<const quant::BlockQ8_0*>(act);
      const int64_t n_full = n_blocks / 8 * 8;
      auto sums_x128 = [&](int64_t b) {  // 128 x block b's 4-value activation sums, lane by lane
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), load256(y[b].qs));
      };
      for (int64_t i = 0; i < n_full; i += 8) {
        __m256i sums[4];
        for (int b = 0; b < 8; b += 2) sums[b / 2] = _mm256_hadd_epi32(sums_x128(i + b), sums_x128(i + b + 1));
        offsets[i / 8] = lane_totals8(sums);
        scales[i / 8] = block_scales8(y + i);
      }
      for (int64_t i = n_full; i < n_blocks; ++i)
        tail_start[i - n_full] = _mm256_sub_epi32(_mm256_setzero_si256(), sums_x128(i));
    }
  };

  // One weight row against N prepared activations: its blocks loaded and made unsigned once for all of them, each
  // activation's sums, offsets and float steps those of many's one. Inlined: a call per row cost many 6 % on the
  // experts' rows of 1408 values (L2, one thread).
  template <int N>
  __attribute__((always_inline)) static void row(const quant::BlockQ8_0* x, int64_t n_blocks,
                                                 const Prepared* const (&p)[N], float* out, size_t ldo) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    const int64_t n_full = n_blocks / 8 * 8;
    __m256 acc[N];
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
    // The weights' loads and xors are written per activation; the compiler shares them between activations.
    auto biased_dot = [&](const quant::BlockQ8_0* y, int64_t b) {
      return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(load256(x[b].qs), bias), load256(y[b].qs));
    };
    for (int64_t i = 0; i < n_full; i += 8) {
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        const quant::BlockQ8_0* y = p[j]->y;
        __m256i sums[4];
#pragma GCC unroll 8
        for (int b = 0; b < 8; b += 2) sums[b / 2] = _mm256_hadd_epi32(biased_dot(y, i + b), biased_dot(y, i + b + 1));
        acc[j] =
            _mm256_fmadd_ps(_mm256_mul_ps(block_scales8(x + i), p[j]->scales[i / 8]),
                            _mm256_cvtepi32_ps(_mm256_sub_epi32(lane_totals8(sums), p[j]->offsets[i / 8])), acc[j]);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) {
      const quant::BlockQ8_0* y = p[j]->y;
      __m256 tail = _mm256_setzero_ps();
      for (int64_t i = n_full; i < n_blocks; ++i)
        tail = _mm256_fmadd_ps(
            _mm256_set1_ps(fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)),
            _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(p[j]->tail_start[i - n_full],
                                                   _mm256_xor_si256(load256(x[i].qs), bias), load256(y[i].qs))),
            tail);
      out[static_cast<size_t>(j) * ldo] = hsum(_mm256_add_ps(acc[j], tail));
    }
  }

  static void many(int64_t n, const uint8_t* w, size_t row_bytes, int64_t n_rows, const void* act, float* out) {
    const int64_t n_blocks = n / 32;
    if (n_blocks > kMaxBlocks) return dot_many<Rows>(n, w, row_bytes, n_rows, act, out);
    prepared_many<Q8ZeroMany>(n_blocks, w, row_bytes, n_rows, act, out);
  }

  // Rows against a few activations (a verification step, a few sequences decoded together), each prepared once (in
  // per-thread buffers): row<2> for each pair, row<1> for an odd one. Each result is many's, bit for bit.
  static void few(int64_t n, const uint8_t* w, size_t row_bytes, int64_t n_rows, const uint8_t* act, size_t stride,
                  int64_t n_act, float* out, size_t ldo) {
    const int64_t n_blocks = n / 32;
    if (n_blocks > kMaxBlocks) return dot_few<Rows>(n, w, row_bytes, n_rows, act, stride, n_act, out, ldo);
    prepared_few<Q8ZeroMany>(n_blocks, w, row_bytes, n_rows, act, stride, n_act, out, ldo);
  }
};

// Q6_K for one or two activation rows in 512-bit steps. In half h of a super-block, ql[64h..64h+63] and qh[32h..32h+31]
// (in both 256-bit halves) give values 128h + 0..63 (low nibbles, qh bits 0-1 then 2-3) and 128h + 64..127 (high
// nibbles, qh bits 4-5 then 6-7), each against a contiguous 64 bytes of the activation; the values are unsigned (+32)
// and the offset comes back through the activation's group sums, as in the 256-bit kernel. A vpdpbusd lane covers
// 4 values, a 128-bit lane one group of 16: after the pack, lane k of half h holds groups 8h + k and 8h + 4 + k.
// bench_dot (L2-resident, one thread, Zen 4): 47.4 GB/s of weights against the AVX2 tier's 29.3 in one sitting.
struct Q6KZmm {
  // The shuffle of half h's 8 scales: lane k's first four int16 take scale k, the next four scale 4 + k.
  static constexpr std::array<int8_t, 64> kScalePattern =
      scale_pattern([](int lane, int half) { return lane + 4 * half; });

  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const auto* x = static_cast<const quant::BlockQ6_K*>(w);
    const ActRows<quant::BlockQ8_K, N> y(act, stride);
    const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    const __m512i pattern = load512(kScalePattern.data());
    // qh's bits into place 4-5: rows 0 and 1 (shift left 4 and 2), rows 2 and 3 (as is, and right 2).
    const __m512i shift01 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
    const __m512i shift23 = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    __m256 acc[N];
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      const quant::BlockQ6_K& b = x[i];
      const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
      __m256i offset[N];
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) offset[j] = _mm256_slli_epi32(_mm256_madd_epi16(scales16, load256(y[j][i].bsums)), 5);
      __m512i sumi[N][2];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i ql = load512(b.ql + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(load256(b.qh + 32 * h));
        const __m512i v01 =
            _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_sllv_epi64(qh, shift01), bits45));
        const __m512i v23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                            _mm512_and_si512(_mm512_srlv_epi64(qh, shift23), bits45));
        const __m512i sc = _mm512_shuffle_epi8(
            _mm512_broadcast_i32x4(h == 0 ? _mm256_castsi256_si128(scales16) : _mm256_extracti128_si256(scales16, 1)),
            pattern);
#pragma GCC unroll 8
        for (int j = 0; j < N; ++j) {
          const int8_t* a = y[j][i].qs + 128 * h;
          const __m512i s01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v01, load512(a));
          const __m512i s23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v23, load512(a + 64));
          sumi[j][h] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(s01, s23), sc);
        }
      }
      const float xd = fp16_to_fp32(b.d);
#pragma GCC unroll 8
      for (int j = 0; j < N; ++j) {
        const __m512i s = _mm512_add_epi32(sumi[j][0], sumi[j][1]);
        const __m256i s8 =
            _mm256_sub_epi32(_mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1)), offset[j]);
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(y[j][i].d * xd), _mm256_cvtepi32_ps(s8), acc[j]);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < N; ++j) out[j] = hsum(acc[j]);
  }
};

// The 16 rows of a Q4_K tile at one super-block, unpacked: packed[8g + k] holds values 4k..4k+3 of group g for
// the 16 rows (row r in bytes 4r..4r+3), which is the operand layout of a vpdpbusd with the activation broadcast
// and, at once, of an AMX B tile (group g: 8 rows of 64 bytes); with the rows' group scales, mins (int16 pairs of
// groups 2h, 2h+1), d and dmin.
struct Q4KRows16 {
  alignas(64) uint8_t packed[64][64];
  alignas(64) int32_t scales[8][16], mins[4][16];
  alignas(64) float d[16], dmin[16];

  void unpack(const uint8_t* w, size_t row_bytes, int64_t i) {
    auto block = [&](int r) -> const quant::BlockQ4_K& {
      return reinterpret_cast<const quant::BlockQ4_K*>(w + r * row_bytes)[i];
    };
    // Two super-blocks ahead for the 16 rows (three cache lines each): 16 interleaved streams advancing 144 bytes a
    // step are more than the hardware prefetchers follow (bench_dot tile16/avx512/Q4_K on 75 MB of rows, one
    // thread: 63 against 46 GB/s).
    for (int r = 0; r < 16; ++r) prefetch_lines(&block(r) + 2, 3);
    // The rows' scales and mins: int32 lane k of a row's unpacked vector holds its int16 values 2k and 2k + 1, scales
    // for k < 4 and min pairs (the madd operand of mins[k - 4]) for k >= 4; transposed, lane k of every row at once.
    __m256i sm0[8], sm1[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      sm0[r] = q4k_scales_and_mins(block(r).scales);
      sm1[r] = q4k_scales_and_mins(block(8 + r).scales);
      d[r] = fp16_to_fp32(block(r).d);
      dmin[r] = fp16_to_fp32(block(r).dmin);
      d[8 + r] = fp16_to_fp32(block(8 + r).d);
      dmin[8 + r] = fp16_to_fp32(block(8 + r).dmin);
    }
    transpose_8x8_epi32(sm0);
    transpose_8x8_epi32(sm1);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(sm0[k]), sm1[k], 1);
      if (k < 4) {
        _mm512_store_si512(scales[2 * k], _mm512_and_si512(both, _mm512_set1_epi32(0xFFFF)));
        _mm512_store_si512(scales[2 * k + 1], _mm512_srli_epi32(both, 16));
      } else {
        _mm512_store_si512(mins[k - 4], both);
      }
    }
    // Chunk c of 32 packed bytes holds groups 2c (low nibbles) and 2c+1 (high nibbles): transpose the packed bytes
    // of rows 0-7 and 8-15 in 4-byte steps, join the halves, then split the nibbles.
    const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 16
    for (int c = 0; c < 4; ++c) {
      __m256i t0[8], t1[8];
#pragma GCC unroll 16
      for (int r = 0; r < 8; ++r) {
        t0[r] = load256(block(r).qs + 32 * c);
        t1[r] = load256(block(8 + r).qs + 32 * c);
      }
      transpose_8x8_epi32(t0);
      transpose_8x8_epi32(t1);
#pragma GCC unroll 16
      for (int k = 0; k < 8; ++k) {
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(t0[k]), t1[k], 1);
        _mm512_store_si512(packed[16 * c + k], _mm512_and_si512(both, low4));
        _mm512_store_si512(packed[16 * c + 8 + k], _mm512_and_si512(_mm512_srli_epi16(both, 4), low4));
      }
    }
  }

  // One activation row's super-block into the float sums of the 16 rows, from its scaled integer sums (sum over
  // groups of scale x group product): acc += d yd sumi, acc_min += dmin yd (sum over groups of min x group sum).
  void finish(const quant::BlockQ8_K& y, const int32_t* sumi, __m512& acc, __m512& acc_min) const {
    const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums)),
                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums + 8)));
    alignas(16) int32_t group_pairs[4];  // activation sums of groups 2h and 2h+1 as int16 pairs
    _mm_store_si128(reinterpret_cast<__m128i*>(group_pairs), bs);
    __m512i msum = _mm512_setzero_si512();
    for (int h = 0; h < 4; ++h)
      msum = _mm512_add_epi32(msum, _mm512_madd_epi16(_mm512_load_si512(mins[h]), _mm512_set1_epi32(group_pairs[h])));
    const __m512 yd = _mm512_set1_ps(y.d);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(d), yd), _mm512_cvtepi32_ps(_mm512_load_si512(sumi)), acc);
    acc_min = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(dmin), yd), _mm512_cvtepi32_ps(msum), acc_min);
  }
};

// Q4_K tiles for prefill: 16 weight rows against many activation rows, the rows interleaved so that one 512-bit
// vpdpbusd multiplies 4 values of each of the 16 rows by the same 4 activation values (broadcast), one row per
// int32 lane. Per super-block the 16 rows are unpacked once into that layout (4 KB, in L1) and then serve every
// activation row: 8 vpdpbusd and one vpmulld (the group's 16 scales) per 32 values x 16 rows, where the
// row-at-a-time kernels need maddubs + vpdpwssd per 32 values per row. Integer sums per group are the same; the
// float sums run per super-block and row instead of per lane, so the results agree with vec_dot to rounding.
struct Q4KTile {
  static constexpr int64_t kCols = 32;  // activation rows per pass over the tile's super-blocks

  static void chunk(int64_t n, const uint8_t* w, size_t row_bytes, const uint8_t* act, size_t act_stride, int64_t n_act,
                    float* out, size_t ldo) {
    Q4KRows16 rows;
    alignas(64) int32_t sumi[kCols][16];
    __m512 acc[kCols], acc_min[kCols];
    for (int64_t j = 0; j < n_act; ++j) acc[j] = acc_min[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      rows.unpack(w, row_bytes, i);
      for (int64_t j = 0; j < n_act; ++j) _mm512_store_si512(sumi[j], _mm512_setzero_si512());
      for (int g = 0; g < 8; ++g) {
        __m512i wv[8];
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; ++kk) wv[kk] = _mm512_load_si512(rows.packed[8 * g + kk]);
        const __m512i sc = _mm512_load_si512(rows.scales[g]);
        // Four activation rows at a time, two partial sums each: eight independent vpdpbusd chains, so the
        // instruction's latency hides behind its throughput.
        int64_t j = 0;
        for (; j + 4 <= n_act; j += 4) {
          const int8_t* a[4];
#pragma GCC unroll 8
          for (int c = 0; c < 4; ++c)
            a[c] = reinterpret_cast<const quant::BlockQ8_K*>(act + (j + c) * act_stride)[i].qs + 32 * g;
          __m512i pa0 = _mm512_setzero_si512(), pa1 = pa0, pa2 = pa0, pa3 = pa0;
          __m512i pb0 = pa0, pb1 = pa0, pb2 = pa0, pb3 = pa0;
#pragma GCC unroll 8
          for (int kk = 0; kk < 8; kk += 2) {
            pa0 = _mm512_dpbusd_epi32(pa0, wv[kk], broadcast4x16(a[0] + 4 * kk));
            pa1 = _mm512_dpbusd_epi32(pa1, wv[kk], broadcast4x16(a[1] + 4 * kk));
            pa2 = _mm512_dpbusd_epi32(pa2, wv[kk], broadcast4x16(a[2] + 4 * kk));
            pa3 = _mm512_dpbusd_epi32(pa3, wv[kk], broadcast4x16(a[3] + 4 * kk));
            pb0 = _mm512_dpbusd_epi32(pb0, wv[kk + 1], broadcast4x16(a[0] + 4 * kk + 4));
            pb1 = _mm512_dpbusd_epi32(pb1, wv[kk + 1], broadcast4x16(a[1] + 4 * kk + 4));
            pb2 = _mm512_dpbusd_epi32(pb2, wv[kk + 1], broadcast4x16(a[2] + 4 * kk + 4));
            pb3 = _mm512_dpbusd_epi32(pb3, wv[kk + 1], broadcast4x16(a[3] + 4 * kk + 4));
          }
          const __m512i p[4] = {_mm512_add_epi32(pa0, pb0), _mm512_add_epi32(pa1, pb1), _mm512_add_epi32(pa2, pb2),
                                _mm512_add_epi32(pa3, pb3)};
#pragma GCC unroll 8
          for (int c = 0; c < 4; ++c)
            _mm512_store_si512(sumi[j + c],
                               _mm512_add_epi32(_mm512_load_si512(sumi[j + c]), _mm512_mullo_epi32(p[c], sc)));
        }
        for (; j < n_act; ++j) {
          const int8_t* a = reinterpret_cast<const quant::BlockQ8_K*>(act + j * act_stride)[i].qs + 32 * g;
          __m512i pa = _mm512_setzero_si512(), pb = _mm512_setzero_si512();
#pragma GCC unroll 8
          for (int kk = 0; kk < 8; kk += 2) {
            pa = _mm512_dpbusd_epi32(pa, wv[kk], broadcast4x16(a + 4 * kk));
            pb = _mm512_dpbusd_epi32(pb, wv[kk + 1], broadcast4x16(a + 4 * kk + 4));
          }
          _mm512_store_si512(
              sumi[j], _mm512_add_epi32(_mm512_load_si512(sumi[j]), _mm512_mullo_epi32(_mm512_add_epi32(pa, pb), sc)));
        }
      }
      for (int64_t j = 0; j < n_act; ++j)
        rows.finish(reinterpret_cast<const quant::BlockQ8_K*>(act + j * act_stride)[i], sumi[j], acc[j], acc_min[j]);
    }
    for (int64_t j = 0; j < n_act; ++j) _mm512_storeu_ps(out + j * ldo, _mm512_sub_ps(acc[j], acc_min[j]));
  }
};

// Q6_K tiles for prefill, laid out as the Q4_K tile: per super-block the 16 rows' 6-bit codes (0..63, stored
// value + 32) are unpacked into vpdpbusd operands, 4 values of each row per 512-bit vector; per 16-value sub-block
// one integer product less 32 x the activation's sum of the sub-block (Q8_K's bsums: exact), times the rows' 16
// int8 scales; one float multiply-add per super-block and row. Equal to vec_dot to rounding.
struct Q6KTile {
  static constexpr int64_t kCols = 32;

  static void chunk(int64_t n, const uint8_t* w, size_t row_bytes, const uint8_t* act, size_t act_stride, int64_t n_act,
                    float* out, size_t ldo) {
    alignas(64) uint8_t packed[64][64];  // packed[8c + k]: values 32c + 4k .. + 3 of the 16 rows
    alignas(64) int32_t scales[16][16];  // scales[sub-block][row]
    alignas(64) float d[16];
    alignas(64) int32_t sumi[kCols][16];
    __m512 acc[kCols];
    for (int64_t j = 0; j < n_act; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      auto block = [&](int r) -> const quant::BlockQ6_K& {
        return reinterpret_cast<const quant::BlockQ6_K*>(w + r * row_bytes)[i];
      };
      for (int r = 0; r < 16; ++r) prefetch_lines(&block(r) + 2, 4);  // two super-blocks ahead (210 bytes each)
      for (int r = 0; r < 16; ++r) {
        d[r] = fp16_to_fp32(block(r).d);
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block(r).scales)));
        alignas(64) int32_t row_scales[16];
        _mm512_store_si512(row_scales, sc);
        for (int k = 0; k < 16; ++k) scales[k][r] = row_scales[k];
      }
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        __m256i t0[8], t1[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
          t0[r] = q6k_codes32(block(r), c);
          t1[r] = q6k_codes32(block(8 + r), c);
        }
        transpose_8x8_epi32(t0);
        transpose_8x8_epi32(t1);
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k)
          _mm512_store_si512(packed[8 * c + k], _mm512_inserti64x4(_mm512_castsi256_si512(t0[k]), t1[k], 1));
      }
      for (int64_t j = 0; j < n_act; ++j) _mm512_store_si512(sumi[j], _mm512_setzero_si512());
      for (int sb = 0; sb < 16; ++sb) {  // 16 values: packed[4 sb .. 4 sb + 3]
        __m512i wv[4];
#pragma GCC unroll 8
        for (int k = 0; k < 4; ++k) wv[k] = _mm512_load_si512(packed[4 * sb + k]);
        const __m512i sc = _mm512_load_si512(scales[sb]);
        int64_t j = 0;
        for (; j + 4 <= n_act; j += 4) {  // four activation rows, two chains each
          const quant::BlockQ8_K* y[4];
#pragma GCC unroll 8
          for (int c = 0; c < 4; ++c) y[c] = reinterpret_cast<const quant::BlockQ8_K*>(act + (j + c) * act_stride) + i;
          __m512i pa[4], pb[4];
#pragma GCC unroll 8
          for (int c = 0; c < 4; ++c) {
            const int8_t* a = y[c]->qs + 16 * sb;
            pa[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], broadcast4x16(a));
            pb[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], broadcast4x16(a + 4));
            pa[c] = _mm512_dpbusd_epi32(pa[c], wv[2], broadcast4x16(a + 8));
            pb[c] = _mm512_dpbusd_epi32(pb[c], wv[3], broadcast4x16(a + 12));
          }
#pragma GCC unroll 8
          for (int c = 0; c < 4; ++c) {
            const __m512i p = _mm512_sub_epi32(_mm512_add_epi32(pa[c], pb[c]), _mm512_set1_epi32(32 * y[c]->bsums[sb]));
            _mm512_store_si512(sumi[j + c],
                               _mm512_add_epi32(_mm512_load_si512(sumi[j + c]), _mm512_mullo_epi32(p, sc)));
          }
        }
        for (; j < n_act; ++j) {
          const quant::BlockQ8_K* y = reinterpret_cast<const quant::BlockQ8_K*>(act + j * act_stride) + i;
          const int8_t* a = y->qs + 16 * sb;
          __m512i pa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], broadcast4x16(a));
          __m512i pb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], broadcast4x16(a + 4));
          pa = _mm512_dpbusd_epi32(pa, wv[2], broadcast4x16(a + 8));
          pb = _mm512_dpbusd_epi32(pb, wv[3], broadcast4x16(a + 12));
          const __m512i p = _mm512_sub_epi32(_mm512_add_epi32(pa, pb), _mm512_set1_epi32(32 * y->bsums[sb]));
          _mm512_store_si512(sumi[j], _mm512_add_epi32(_mm512_load_si512(sumi[j]), _mm512_mullo_epi32(p, sc)));
        }
      }
      const __m512 dv = _mm512_load_ps(d);
      for (int64_t j = 0; j < n_act; ++j) {
        const float yd = reinterpret_cast<const quant::BlockQ8_K*>(act + j * act_stride)[i].d;
        acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(yd)), _mm512_cvtepi32_ps(_mm512_load_si512(sumi[j])),
                                 acc[j]);
      }
    }
    for (int64_t j = 0; j < n_act; ++j) _mm512_storeu_ps(out + j * ldo, acc[j]);
  }
};

// Block b of 16 rows of a 32-value block format: wv[k] holds values 4k..4k+3 (as Values::get gives them) of rows
// 0..15, row r in bytes 4r..4r+3, and d[r] the row's scale.
template <typename Block, typename Values>
inline void unpack_blocks32_16(const uint8_t* w, size_t row_bytes, int64_t b, __m512i (&wv)[8], float* d) {
  // Four blocks ahead for the 16 rows, as Q4KRows16::unpack does.
  for (int r = 0; r < 16; ++r) prefetch_lines(reinterpret_cast<const Block*>(w + r * row_bytes) + b + 4, 1);
  __m256i t0[8], t1[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    const Block& lo = reinterpret_cast<const Block*>(w + r * row_bytes)[b];
    const Block& hi = reinterpret_cast<const Block*>(w + (8 + r) * row_bytes)[b];
    d[r] = fp16_to_fp32(lo.d);
    d[8 + r] = fp16_to_fp32(hi.d);
    t0[r] = Values::get(lo);
    t1[r] = Values::get(hi);
  }
  transpose_8x8_epi32(t0);
  transpose_8x8_epi32(t1);
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) wv[k] = _mm512_inserti64x4(_mm512_castsi256_si512(t0[k]), t1[k], 1);
}

// Q8_0 and Q5_0 tiles for prefill, laid out as the Q4_K tile: 16 rows interleaved per 32-value block, one
// vpdpbusd per 4 values of 16 rows. vpdpbusd wants unsigned weights, so the values are taken with a bias (Q8_0:
// + 128, Q5_0: the stored 0..31, i.e. + 16) and bias x (the activation block's sum) is taken off again, exactly, in
// integers. One float multiply-add per block and row, as the single dot does per lane: equal to rounding.
template <typename Block, typename Biased>
struct Blocks32Tile {
  static constexpr int64_t kCols = 32;

  static void chunk(int64_t n, const uint8_t* w, size_t row_bytes, const uint8_t* act, size_t act_stride, int64_t n_act,
                    float* out, size_t ldo) {
    const int64_t n_blocks = n / 32;
    // Biased sums of each activation block: bias * sum(a), per block and activation row.
    std::span<int32_t> corr = scratch<int32_t, struct Blocks32TileSite>(n_blocks * kCols);
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t j = 0; j < n_act; ++j) {
      const auto* y = reinterpret_cast<const quant::BlockQ8_0*>(act + j * act_stride);
      for (int64_t b = 0; b < n_blocks; ++b)
        corr[b * kCols + j] = Biased::kBias * hsum_epi32(sum4_u8s8(ones, load256(y[b].qs)));
    }
    __m512 acc[kCols];
    for (int64_t j = 0; j < n_act; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      alignas(64) float d[16];
      __m512i wv[8];
      unpack_blocks32_16<Block, Biased>(w, row_bytes, b, wv, d);
      const __m512 dv = _mm512_load_ps(d);
      int64_t j = 0;
      for (; j + 2 <= n_act; j += 2) {
        const auto& y0 = reinterpret_cast<const quant::BlockQ8_0*>(act + j * act_stride)[b];
        const auto& y1 = reinterpret_cast<const quant::BlockQ8_0*>(act + (j + 1) * act_stride)[b];
        __m512i pa0 = _mm512_setzero_si512(), pa1 = pa0, pb0 = pa0, pb1 = pa0;
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; kk += 2) {
          pa0 = _mm512_dpbusd_epi32(pa0, wv[kk], broadcast4x16(y0.qs + 4 * kk));
          pa1 = _mm512_dpbusd_epi32(pa1, wv[kk], broadcast4x16(y1.qs + 4 * kk));
          pb0 = _mm512_dpbusd_epi32(pb0, wv[kk + 1], broadcast4x16(y0.qs + 4 * kk + 4));
          pb1 = _mm512_dpbusd_epi32(pb1, wv[kk + 1], broadcast4x16(y1.qs + 4 * kk + 4));
        }
        const __m512i s0 = _mm512_sub_epi32(_mm512_add_epi32(pa0, pb0), _mm512_set1_epi32(corr[b * kCols + j]));
        const __m512i s1 = _mm512_sub_epi32(_mm512_add_epi32(pa1, pb1), _mm512_set1_epi32(corr[b * kCols + j + 1]));
        acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(fp16_to_fp32(y0.d))), _mm512_cvtepi32_ps(s0), acc[j]);
        acc[j + 1] =
            _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(fp16_to_fp32(y1.d))), _mm512_cvtepi32_ps(s1), acc[j + 1]);
      }
      for (; j < n_act; ++j) {
        const auto& y0 = reinterpret_cast<const quant::BlockQ8_0*>(act + j * act_stride)[b];
        __m512i pa = _mm512_setzero_si512(), pb = pa;
#pragma GCC unroll 8
        for (int kk = 0; kk < 8; kk += 2) {
          pa = _mm512_dpbusd_epi32(pa, wv[kk], broadcast4x16(y0.qs + 4 * kk));
          pb = _mm512_dpbusd_epi32(pb, wv[kk + 1], broadcast4x16(y0.qs + 4 * kk + 4));
        }
        const __m512i s0 = _mm512_sub_epi32(_mm512_add_epi32(pa, pb), _mm512_set1_epi32(corr[b * kCols + j]));
        acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(fp16_to_fp32(y0.d))), _mm512_cvtepi32_ps(s0), acc[j]);
      }
    }
    for (int64_t j = 0; j < n_act; ++j) _mm512_storeu_ps(out + j * ldo, acc[j]);
  }
};

struct Q8Biased {
  static constexpr int32_t kBias = 128;
  static __m256i get(const quant::BlockQ8_0& b) { return _mm256_xor_si256(load256(b.qs), _mm256_set1_epi8(-128)); }
};

struct Q5Biased {
  static constexpr int32_t kBias = 16;
  static __m256i get(const quant::BlockQ5_0& b) { return _mm256_or_si256(nibbles_32(b.qs), fifth_bits(b.qh)); }
};

// A tile kernel over any number of activation rows, kCols at a time (the tile's accumulators live on the stack).
template <typename Tile>
void gemm_tile(int64_t n, const uint8_t* w, size_t row_bytes, const uint8_t* act, size_t act_stride, int64_t n_act,
               float* out, size_t ldo) {
  for (int64_t j0 = 0; j0 < n_act; j0 += Tile::kCols)
    Tile::chunk(n, w, row_bytes, act + j0 * act_stride, act_stride, std::min(Tile::kCols, n_act - j0), out + j0 * ldo,
                ldo);
}

// AMX tiles. One tile product here: C (m x 16 int32) = A (m activation rows x 32 signed bytes, one group or block,
// read in place with the activation stride) times B (8 rows of 64 bytes: the 16 weight rows' values in steps of 4,
// the layout Q4KRows16 and unpack_blocks32_16 produce), with TDPBSUD (unsigned weights) or TDPBSSD (signed). The
// scales stay with AVX-512, per stored C: the group formats rescale every 32 values, so the 64-byte depth of a tile
// is not filled; the gain over the broadcast vpdpbusd is that one instruction does 16 x 16 x 32 products.
// Tiles are a policy so that the kernels' packing and scaling can be checked on hosts without AMX against
// EmulatedTiles, which computes the same products in scalar code.
// The hardware: tile 0 holds C, tile 1 A, tile 2 B. Needs the OS permission detect_isa() requested.
struct HwTiles {
  static void configure(int rows) {
    struct alignas(64) Config {
      uint8_t palette, start_row, reserved[14];
      uint16_t colsb[16];
      uint8_t rows[16];
    } cfg{};
    cfg.palette = 1;
    cfg.colsb[0] = 64, cfg.rows[0] = static_cast<uint8_t>(rows);
    cfg.colsb[1] = 32, cfg.rows[1] = static_cast<uint8_t>(rows);
    cfg.colsb[2] = 64, cfg.rows[2] = 8;
    _tile_loadconfig(&cfg);
  }
  template <bool kSignedWeights>
  static void product(const int8_t* a, size_t a_stride, const uint8_t* b, int32_t (*c)[16]) {
    _tile_zero(0);
    _tile_loadd(1, a, a_stride);
    _tile_loadd(2, b, 64);
    if constexpr (kSignedWeights)
      _tile_dpbssd(0, 1, 2);
    else
      _tile_dpbsud(0, 1, 2);
    _tile_stored(0, c, 64);
  }
  static void release() { _tile_release(); }
};

// The same products in scalar code, row count as configured (per thread, as the hardware's tile configuration).
struct EmulatedTiles {
  static inline thread_local int configured_rows = 0;
  static void configure(int rows) { configured_rows = rows; }
  template <bool kSignedWeights>
  static void product(const int8_t* a, size_t a_stride, const uint8_t* b, int32_t (*c)[16]) {
    for (int m = 0; m < configured_rows; ++m)
      for (int col = 0; col < 16; ++col) {
        int32_t sum = 0;
        for (int k = 0; k < 8; ++k)
          for (int e = 0; e < 4; ++e) {
            const uint8_t wb = b[64 * k + 4 * col + e];
            const int32_t wv = kSignedWeights ? static_cast<int8_t>(wb) : wb;
            sum += a[m * a_stride + 4 * k + e] * wv;
          }
        c[m][col] = sum;
      }
  }
  static void release() { configured_rows = 0; }
};

// Q4_K on tiles: per super-block and group, one tile product of up to 16 activation rows with the group's values
// of 16 weight rows, then the group scales (vpmulld) and, per super-block, the float sums as in Q4KTile.
template <typename Tiles>
struct AmxQ4KTile {
  static constexpr int64_t kCols = 16;  // a tile's activation rows

  static void chunk(int64_t n, const uint8_t* w, size_t row_bytes, const uint8_t* act, size_t act_stride, int64_t n_act,
                    float* out, size_t ldo) {
    Q4KRows16 rows;
    alignas(64) int32_t sumi[kCols][16], c[16][16];
    __m512 acc[kCols], acc_min[kCols];
    for (int64_t j = 0; j < n_act; ++j) acc[j] = acc_min[j] = _mm512_setzero_ps();
    auto block = [&](int64_t j, int64_t i) -> const quant::BlockQ8_K& {
      return reinterpret_cast<const quant::BlockQ8_K*>(act + j * act_stride)[i];
    };
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      rows.unpack(w, row_bytes, i);
      for (int g = 0; g < 8; ++g) {
        Tiles::template product<false>(block(0, i).qs + 32 * g, act_stride, rows.packed[8 * g], c);
        const __m512i sc = _mm512_load_si512(rows.scales[g]);
        for (int64_t j = 0; j < n_act; ++j) {
          const __m512i scaled = _mm512_mullo_epi32(_mm512_load_si512(c[j]), sc);
          _mm512_store_si512(sumi[j], g == 0 ? scaled : _mm512_add_epi32(_mm512_load_si512(sumi[j]), scaled));
        }
      }
      for (int64_t j = 0; j < n_act; ++j) rows.finish(block(j, i), sumi[j], acc[j], acc_min[j]);
    }
    for (int64_t j = 0; j < n_act; ++j) _mm512_storeu_ps(out + j * ldo, _mm512_sub_ps(acc[j], acc_min[j]));
  }
};

// Q8_0 and Q5_0 on tiles: signed values (Q5_0 less its 16) against the activation block, TDPBSSD, no correction.
template <typename Block, typename Values, typename Tiles>
struct AmxBlocks32Tile {
  static constexpr int64_t kCols = 16;

  static void chunk(int64_t n, const uint8_t* w, size_t row_bytes, const uint8_t* act, size_t act_stride, int64_t n_act,
                    float* out, size_t ldo) {
    alignas(64) uint8_t packed[8][64];
    alignas(64) int32_t c[16][16];
    __m512 acc[kCols];
    for (int64_t j = 0; j < n_act; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / 32; ++b) {
      alignas(64) float d[16];
      __m512i wv[8];
      unpack_blocks32_16<Block, Values>(w, row_bytes, b, wv, d);
      for (int k = 0; k < 8; ++k) _mm512_store_si512(packed[k], wv[k]);
      const auto* y0 = reinterpret_cast<const quant::BlockQ8_0*>(act) + b;
      Tiles::template product<true>(y0->qs, act_stride, packed[0], c);
      const __m512 dv = _mm512_load_ps(d);
      for (int64_t j = 0; j < n_act; ++j) {
        const auto& y = reinterpret_cast<const quant::BlockQ8_0*>(act + j * act_stride)[b];
        acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(fp16_to_fp32(y.d))),
                                 _mm512_cvtepi32_ps(_mm512_load_si512(c[j])), acc[j]);
      }
    }
    for (int64_t j = 0; j < n_act; ++j) _mm512_storeu_ps(out + j * ldo, acc[j]);
  }
};

// Tiles of 16 activation rows: the configuration is set for full tiles, then once more for the rest, and handed
// back to the OS at the end (a thread that holds tile state makes every context switch save 8 KB more).
template <typename Tile, typename Tiles>
void gemm_amx(int64_t n, const uint8_t* w, size_t row_bytes, const uint8_t* act, size_t act_stride, int64_t n_act,
              float* out, size_t ldo) {
  int configured = 0;
  for (int64_t j0 = 0; j0 < n_act; j0 += Tile::kCols) {
    const int rows = static_cast<int>(std::min(Tile::kCols, n_act - j0));
    if (rows != configured) Tiles::configure(configured = rows);
    Tile::chunk(n, w, row_bytes, act + j0 * act_stride, act_stride, rows, out + j0 * ldo, ldo);
  }
  Tiles::release();
}

template <typename Tiles>
void install_tiles(KernelTable& table) {
  using quant::GgmlType;
  table.gemm_tile[kernel_slot(GgmlType::Q4_K)] = &gemm_amx<AmxQ4KTile<Tiles>, Tiles>;
  table.gemm_tile[kernel_slot(GgmlType::Q8_0)] = &gemm_amx<AmxBlocks32Tile<quant::BlockQ8_0, Q8Values, Tiles>, Tiles>;
  table.gemm_tile[kernel_slot(GgmlType::Q5_0)] = &gemm_amx<AmxBlocks32Tile<quant::BlockQ5_0, Q5Values, Tiles>, Tiles>;
}

}  // namespace

void install(KernelTable& table) {
  install_256(table);
  using quant::GgmlType;
  table.vec_dot[kernel_slot(GgmlType::Q4_K)] = &dot_one<Q4KZmm>;
  table.vec_dot_rows[kernel_slot(GgmlType::Q4_K)] = &dot_rows<Q4KZmm>;
  table.vec_dot_many[kernel_slot(GgmlType::Q4_K)] = &Q4KZmm::many;
  table.vec_dot_few[kernel_slot(GgmlType::Q4_K)] = &Q4KZmm::few;
  table.vec_dot[kernel_slot(GgmlType::Q5_K)] = &dot_one<Q5KZmm>;
  table.vec_dot_rows[kernel_slot(GgmlType::Q5_K)] = &dot_rows<Q5KZmm>;
  table.vec_dot_many[kernel_slot(GgmlType::Q5_K)] = &Q5KZmm::many;
  table.vec_dot_few[kernel_slot(GgmlType::Q5_K)] = &Q5KZmm::few;
  table.vec_dot[kernel_slot(GgmlType::Q5_0)] = &dot_one<Q5PairZmm>;
  table.vec_dot_rows[kernel_slot(GgmlType::Q5_0)] = &dot_rows<Q5PairZmm>;
  table.vec_dot_many[kernel_slot(GgmlType::Q5_0)] = &Q5PairZmm::many;
  table.vec_dot_few[kernel_slot(GgmlType::Q5_0)] = &Q5PairZmm::few;
  table.vec_dot[kernel_slot(GgmlType::Q6_K)] = &dot_one<Q6KZmm>;
  table.vec_dot_rows[kernel_slot(GgmlType::Q6_K)] = &dot_rows<Q6KZmm>;
  table.vec_dot_many[kernel_slot(GgmlType::Q6_K)] = &dot_many<Q6KZmm>;
  table.vec_dot_few[kernel_slot(GgmlType::Q6_K)] = &dot_few3<Q6KZmm>;
  table.vec_dot_many[kernel_slot(GgmlType::Q8_0)] = &Q8ZeroMany::many;
  table.vec_dot_few[kernel_slot(GgmlType::Q8_0)] = &Q8ZeroMany::few;
  table.gemm_tile[kernel_slot(GgmlType::Q4_K)] = &gemm_tile<Q4KTile>;
  table.gemm_tile[kernel_slot(GgmlType::Q8_0)] = &gemm_tile<Blocks32Tile<quant::BlockQ8_0, Q8Biased>>;
  table.gemm_tile[kernel_slot(GgmlType::Q5_0)] = &gemm_tile<Blocks32Tile<quant::BlockQ5_0, Q5Biased>>;
  table.gemm_tile[kernel_slot(GgmlType::Q6_K)] = &gemm_tile<Q6KTile>;
}

void install_amx(KernelTable& table) { install_tiles<HwTiles>(table); }

void install_amx_emulated(KernelTable& table) { install_tiles<EmulatedTiles>(table); }

}  // namespace hetmoe::cpu::avx512
