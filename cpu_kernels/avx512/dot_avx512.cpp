// The AVX-512 tier: every 256-bit kernel of dots256.inc rebuilt with VNNI (vpdpbusd for maddubs + madd, vpdpwssd
// for madd + add; AVX-512VL also gives the compiler 32 vector registers), plus a 512-bit Q6_K. Integer results
// equal the AVX2 tier's, so both tiers give the same floats except for Q6_K's summation order.
//
// Measured with tests/bench/bench_dot (L2-resident rows of 2048, one thread, AMD EPYC Zen 4, GB/s of weights,
// single dot AVX2 -> this tier): Q4_K 10.1 -> 15.5, Q5_0 9.1 -> 11.3, Q8_0 27.0 -> 27.5, Q6_K 9.5 -> 21.7 (the
// 512-bit kernel; straight 512-bit versions of Q4_K, Q5_0 and Q8_0 measured slower than 256-bit ones, since Zen 4
// splits 512-bit work in two and the per-group scale multiply costs more than it saves).
#include <immintrin.h>

#include <cstring>

#include "cpu_kernels/avx512/kernels_avx512.h"
#include "quant/blocks.h"

namespace hetmoe::cpu::avx512 {
namespace {

// The 256-bit kernels of dots256.inc with VNNI: one vpdpbusd for maddubs + madd, one vpdpwssd for madd + add.
inline __m256i sum4_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i add_madd16(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }

}  // namespace

#include "cpu_kernels/x86/dots256.inc"

namespace {

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Q6_K: 6-bit values 0..63 (minus 32 folded in through the activation group sums), 16 groups of 16 with signed
// 8-bit scales. 64 values per VNNI step: four groups, each 4 lanes of the result.
// One weight row against N activation rows (N = 1..4) with the row unpacked once; column j's arithmetic is the
// same for every N, so the multi-row and single-row entries agree bit for bit.
struct Q6K512 {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const auto* x = static_cast<const quant::BlockQ6_K*>(w);
    const quant::BlockQ8_K* y[N];
    for (int j = 0; j < N; ++j) y[j] = reinterpret_cast<const quant::BlockQ8_K*>(act + j * stride);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    const __m512i idx01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i idx23 = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    __m512 acc[N];
    for (int j = 0; j < N; ++j) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      const quant::BlockQ6_K& b = x[i];
      const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
      const __m512i scales32 = _mm512_cvtepi8_epi32(s);
      __m512i sumi[N];
      int32_t corr[N];
      for (int j = 0; j < N; ++j) {
        corr[j] = _mm512_reduce_add_epi32(_mm512_mullo_epi32(scales32, _mm512_cvtepi16_epi32(load256(y[j][i].bsums))));
        sumi[j] = _mm512_setzero_si512();
      }
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = b.ql + 64 * half;
        const __m256i ql0 = load256(ql);
        const __m256i ql1 = load256(ql + 32);
        const __m256i qh = load256(b.qh + 32 * half);
        const __m256i r0 =
            _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
        const __m256i r1 =
            _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
        const __m256i r2 =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45));
        const __m256i r3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
        const __m512i q01 = _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1);
        const __m512i q23 = _mm512_inserti64x4(_mm512_castsi256_si512(r2), r3, 1);
        // Lane l of a product over q01 covers values 4l..4l+3 of these 64, i.e. group 8*half + l/4; likewise q23.
        const __m512i base = _mm512_cvtepi8_epi32(half == 0 ? s : _mm_srli_si128(s, 8));
        const __m512i sc01 = _mm512_permutexvar_epi32(idx01, base);
        const __m512i sc23 = _mm512_permutexvar_epi32(idx23, base);
        for (int j = 0; j < N; ++j) {
          const int8_t* ay = y[j][i].qs + 128 * half;
          const __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q01, load512(ay));
          const __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q23, load512(ay + 64));
          sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(p01, sc01));
          sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(p23, sc23));
        }
      }
      const float xd = fp16_to_fp32(b.d);
      for (int j = 0; j < N; ++j)
        acc[j] =
            _mm512_fmadd_ps(_mm512_set1_ps(y[j][i].d * xd),
                            _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                sumi[j], _mm512_setr_epi32(32 * corr[j], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))),
                            acc[j]);
    }
    for (int j = 0; j < N; ++j) out[j] = _mm512_reduce_add_ps(acc[j]);
  }
};

float dot_q6_k(int64_t n, const void* w, const void* a) {
  float out;
  Q6K512::cols<1>(n, w, static_cast<const uint8_t*>(a), 0, &out);
  return out;
}

void dot_rows_q6_k(int64_t n, const void* w, const uint8_t* act, size_t stride, int64_t n_act, float* out) {
  int64_t j = 0;
  for (; j + 4 <= n_act; j += 4) Q6K512::cols<4>(n, w, act + j * stride, stride, out + j);
  for (; j < n_act; ++j) Q6K512::cols<1>(n, w, act + j * stride, stride, out + j);
}

}  // namespace

void install(KernelTable& table) {
  install_256(table);
  using quant::GgmlType;
  table.vec_dot[static_cast<uint32_t>(GgmlType::Q6_K)] = &dot_q6_k;
  table.vec_dot_rows[static_cast<uint32_t>(GgmlType::Q6_K)] = &dot_rows_q6_k;
}

}  // namespace hetmoe::cpu::avx512
