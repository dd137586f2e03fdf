// KernelTable::swiglu in 256-bit steps: cpu::silu_times (silu_exp's clamp, rounding, reduction and polynomial, then
// the division and the product) on 8 lanes at once, in the same float operations in the same order. This file is
// compiled with -mavx2 and -ffp-contract=off (CMakeLists.txt): the compiler may fuse no multiply with an add, so every
// lane is the scalar function's float (the kernel test compares them bit for bit).
#include <immintrin.h>

#include <algorithm>

#include "cpu_kernels/avx2/kernels_avx2.h"
#include "cpu_kernels/ops.h"

namespace hetmoe::cpu::avx2 {
namespace {

// silu_exp on 8 lanes. max(low, x) and min(high, x) keep a NaN as it is, as std::max(x, low) and std::min(x, high) do.
inline __m256 silu_exp8(__m256 x) {
  using E = SiluExp;
  x = _mm256_min_ps(_mm256_set1_ps(E::kHigh), _mm256_max_ps(_mm256_set1_ps(E::kLow), x));
  const __m256 round = _mm256_set1_ps(E::kRound);
  const __m256 shifted = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(E::kLog2e)), round);
  const __m256 k = _mm256_sub_ps(shifted, round);
  const __m256i k_bits = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_castps_si256(round));
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(k, _mm256_set1_ps(E::kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(k, _mm256_set1_ps(E::kLn2Lo)));
  __m256 p = _mm256_set1_ps(E::kP0);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(E::kP1));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(E::kP2));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(E::kP3));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(E::kP4));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(E::kP5));
  p = _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(k_bits, _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

inline __m256 silu_times8(__m256 g, __m256 u) {
  const __m256 e = silu_exp8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));  // -g: the sign flipped, as in C++
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

void swiglu_ymm(int64_t n, const float* gate, const float* up, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, silu_times8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i == n) return;
  // The tail through a padded vector: the same lanes' arithmetic.
  float g[8] = {}, u[8] = {}, o[8];
  std::copy(gate + i, gate + n, g);
  std::copy(up + i, up + n, u);
  _mm256_storeu_ps(o, silu_times8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
  std::copy(o, o + (n - i), out + i);
}

}  // namespace

void install_swiglu(KernelTable& table) { table.swiglu = &swiglu_ymm; }

}  // namespace hetmoe::cpu::avx2
