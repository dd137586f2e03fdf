// AVX-512 versions of the attention's head-group kernels (KernelTable::dot_heads and sum_heads): 16-float steps and
// tiles sized for a long run of cached rows shared by many heads (MLA decode: 16 to 128 heads over one latent row of
// 576 floats per position; GQA: a group of 4 to 16 heads per key head).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu_kernels/avx512/kernels_avx512.h"

namespace hetmoe::cpu::avx512 {
namespace {

// A score's 16 lanes are summed by one tree: lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1.
// reduce16 sums one vector that way; reduce16x16 sums 16 of them at once (transposing as it goes) with the same
// additions, so a score's float does not depend on how many scores were reduced together.
inline float reduce16(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// out[r] = reduce16(x[r]) for r < 16.
inline void reduce16x16(const __m512* x, float* out) {
  __m512 y[8], z[4], w[2];
  // y[k]: lanes 0-7 the pairs (i, i + 8) of x[2k], lanes 8-15 those of x[2k + 1].
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    y[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x44),
                         _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xEE));
  }
  // z[m]: 128-bit lane q holds the four pair sums (i, i + 4) of score 4m + q.
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    z[m] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * m], y[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(y[2 * m], y[2 * m + 1], 0xDD));
  }
  // w[n]: lane q holds the sums (i, i + 2) of scores 8n + q, then of 8n + 4 + q.
#pragma GCC unroll 2
  for (int n = 0; n < 2; ++n)
    w[n] =
        _mm512_add_ps(_mm512_shuffle_ps(z[2 * n], z[2 * n + 1], 0x44), _mm512_shuffle_ps(z[2 * n], z[2 * n + 1], 0xEE));
  // Element t of 128-bit lane q: score 4t + q; the permute puts score s at s.
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, v));
}

// H heads' scores against K keys: one accumulator per score over the 16-float steps, each key's step loaded once for
// the H heads and each head's once for the K keys (4 x 6: 10 loads for 24 multiply-adds), then the tree, then the
// n % 16 tail added in order.
// With `next`, the tile also prefetches the same 64 bytes of the next n_next key rows at each step, so the next keys
// are on their way from memory while these are multiplied.
template <int H, int K>
inline void dot_heads_tile(int64_t n, const float* q, int64_t q_stride, const float* k, int64_t k_stride, float* scores,
                           int64_t scores_stride, const float* next = nullptr, int64_t n_next = 0) {
  __m512 acc[H * K];
#pragma GCC unroll 32
  for (int r = 0; r < H * K; ++r) acc[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int64_t j = 0; j < n_next; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(next + j * k_stride + i), _MM_HINT_T0);
    __m512 kv[K];
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) kv[j] = _mm512_loadu_ps(k + j * k_stride + i);
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      const __m512 qv = _mm512_loadu_ps(q + h * q_stride + i);
#pragma GCC unroll 8
      for (int j = 0; j < K; ++j) acc[h * K + j] = _mm512_fmadd_ps(qv, kv[j], acc[h * K + j]);
    }
  }
  float sums[H * K];
  int r = 0;
  for (; r + 16 <= H * K; r += 16) reduce16x16(acc + r, sums + r);
#pragma GCC unroll 8
  for (; r < H * K; ++r) sums[r] = reduce16(acc[r]);
  for (int h = 0; h < H; ++h)
    for (int j = 0; j < K; ++j) {
      float sum = sums[h * K + j];
      for (int64_t t = i; t < n; ++t) sum = std::fma(q[h * q_stride + t], k[j * k_stride + t], sum);
      scores[h * scores_stride + j] = sum;
    }
}

// Six keys at a time (14 KB of 576-float latent rows, kept in L1 while every four heads pass over it), heads in
// fours inside; the last keys four, then one at a time. In L2 (16 heads x 512 keys of 576 floats, one thread, a
// harness of the same loops, one sitting): 82.7 us in tiles of 4 x 4, 73.0 in tiles of 4 x 6; each score is the same
// arithmetic either way.
void dot_heads_zmm(int64_t n, int n_heads, const float* q, int64_t q_stride, int64_t n_keys, const float* k,
                   int64_t k_stride, float* scores, int64_t scores_stride) {
  auto heads = [&]<int K>(int64_t j) {
    // The first tile of these keys prefetches the next keys (up to six rows).
    const int64_t n_next = std::min<int64_t>(6, n_keys - j - K);
    int h = 0;
    for (; h + 4 <= n_heads; h += 4)
      dot_heads_tile<4, K>(n, q + h * q_stride, q_stride, k + j * k_stride, k_stride, scores + h * scores_stride + j,
                           scores_stride, k + (j + K) * k_stride, h == 0 ? n_next : 0);
    for (; h < n_heads; ++h)
      dot_heads_tile<1, K>(n, q + h * q_stride, q_stride, k + j * k_stride, k_stride, scores + h * scores_stride + j,
                           scores_stride, k + (j + K) * k_stride, h == 0 ? n_next : 0);
  };
  int64_t j = 0;
  for (; j + 6 <= n_keys; j += 6) heads.template operator()<6>(j);
  for (; j + 4 <= n_keys; j += 4) heads.template operator()<4>(j);
  for (; j < n_keys; ++j) heads.template operator()<1>(j);
}

// H heads' weighted sums over the value rows j0..j1 into out, 32 floats (then 16, then the masked rest) at a time:
// from zero for the first block of keys, else from what out holds. Each output float is one multiply-add per key in
// key order whatever the blocks are, as axpy key by key gives it.
// With n_next, the 32-float steps also prefetch the same 128 bytes of the next block's first n_next value rows.
template <int H>
inline void sum_heads_keys(int64_t n, int64_t j0, int64_t j1, bool first, const float* p, int64_t p_stride,
                           const float* v, int64_t v_stride, float* out, int64_t out_stride, int64_t n_next = 0) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int64_t j = 0; j < n_next; ++j) {
      const char* row = reinterpret_cast<const char*>(v + (j1 + j) * v_stride + i);
      _mm_prefetch(row, _MM_HINT_T0);
      _mm_prefetch(row + 64, _MM_HINT_T0);
    }
    __m512 acc[H][2];
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      acc[h][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + h * out_stride + i);
      acc[h][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + h * out_stride + i + 16);
    }
    for (int64_t j = j0; j < j1; ++j) {
      const __m512 v0 = _mm512_loadu_ps(v + j * v_stride + i), v1 = _mm512_loadu_ps(v + j * v_stride + i + 16);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        const __m512 pj = _mm512_set1_ps(p[h * p_stride + j]);
        acc[h][0] = _mm512_fmadd_ps(pj, v0, acc[h][0]);
        acc[h][1] = _mm512_fmadd_ps(pj, v1, acc[h][1]);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      _mm512_storeu_ps(out + h * out_stride + i, acc[h][0]);
      _mm512_storeu_ps(out + h * out_stride + i + 16, acc[h][1]);
    }
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 acc[H];
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h)
      acc[h] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, out + h * out_stride + i);
    for (int64_t j = j0; j < j1; ++j) {
      const __m512 v0 = _mm512_maskz_loadu_ps(m, v + j * v_stride + i);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[h * p_stride + j]), v0, acc[h]);
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) _mm512_mask_storeu_ps(out + h * out_stride + i, m, acc[h]);
  }
}

// Blocks of 32 keys outside, heads in eights inside (then fours, then one at a time): a block's value rows (up to 32 x
// 576 floats, in L2) are read from memory once while every head and column passes over them, each step loading two
// 16-float vectors of a row for 16 multiply-adds. (Columns outside, as the 256-bit kernel runs them, read every
// cached row once per 16 columns and four heads.) In L2 (16 heads x 512 keys, one thread, a harness of the same
// loops, one sitting): 74.2 us by 16 keys and four heads, 55.2 by 32 keys and eight heads; each output float is the
// same multiply-adds in key order either way.
void sum_heads_zmm(int64_t n, int n_heads, int64_t n_keys, const float* p, int64_t p_stride, const float* v,
                   int64_t v_stride, float* out, int64_t out_stride) {
  constexpr int64_t kKeyBlock = 32;
  // No keys: zeros (the first block, empty).
  for (int64_t j0 = 0; j0 == 0 || j0 < n_keys; j0 += kKeyBlock) {
    const int64_t j1 = std::min(n_keys, j0 + kKeyBlock);
    // The first heads' pass over this block prefetches the next block's rows.
    const int64_t n_next = std::min(kKeyBlock, n_keys - j1);
    int h = 0;
    for (; h + 8 <= n_heads; h += 8)
      sum_heads_keys<8>(n, j0, j1, j0 == 0, p + h * p_stride, p_stride, v, v_stride, out + h * out_stride, out_stride,
                        h == 0 ? n_next : 0);
    for (; h + 4 <= n_heads; h += 4)
      sum_heads_keys<4>(n, j0, j1, j0 == 0, p + h * p_stride, p_stride, v, v_stride, out + h * out_stride, out_stride,
                        h == 0 ? n_next : 0);
    for (; h < n_heads; ++h)
      sum_heads_keys<1>(n, j0, j1, j0 == 0, p + h * p_stride, p_stride, v, v_stride, out + h * out_stride, out_stride,
                        h == 0 ? n_next : 0);
  }
}

}  // namespace

void install_attention(KernelTable& table) {
  table.dot_heads = &dot_heads_zmm;
  table.sum_heads = &sum_heads_zmm;
}

}  // namespace hetmoe::cpu::avx512
