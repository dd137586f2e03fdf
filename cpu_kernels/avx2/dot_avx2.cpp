// AVX2 dot products of weight rows with converted activations. The integer arithmetic per block is the same as
// the scalar reference in quant/; only the float summation order differs (8 lanes, then a horizontal sum).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "cpu_kernels/avx2/kernels_avx2.h"
#include "cpu_kernels/scratch.h"
#include "quant/blocks.h"
#include "quant/iq_decode.h"

namespace hetmoe::cpu::avx2 {
namespace {

inline __m256i sum4_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
inline __m256i add_madd16(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
// sum4_u8s8 costs two instructions here: formats with an offset take the signed form (dots256.inc).
constexpr bool kOneInstructionSum4 = false;

}  // namespace

#include "cpu_kernels/x86/dots256.inc"

void install(KernelTable& table) { install_256(table); }

}  // namespace hetmoe::cpu::avx2
