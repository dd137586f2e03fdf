// AVX2 dot products of weight rows with converted activations. The integer arithmetic per block is the same as
// the scalar reference in quant/; only the float summation order differs (8 lanes, then a horizontal sum).
#include <immintrin.h>

#include <cstring>

#include "cpu_kernels/avx2/kernels_avx2.h"
#include "quant/blocks.h"

namespace hetmoe::cpu::avx2 {
namespace {

// F16C converts a half in one instruction; the portable quant::fp16_to_fp32 branches on the exponent, which
// costs more than the integer work of a 32-value block.
inline float fp16_to_fp32(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Signed 8-bit x signed 8-bit, 32 pairs, summed in pairs of 4 into 8 int32 lanes. maddubs wants an unsigned
// first operand, so the sign of x moves onto y; |x| <= 127 keeps the int16 pair sums from saturating.
inline __m256i dot_i8(__m256i x, __m256i y) {
  const __m256i ax = _mm256_sign_epi8(x, x);
  const __m256i sy = _mm256_sign_epi8(y, x);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

// F32 accumulation over 4 x 8 lanes of values that `load` widens to float (F32 as is, F16 through F16C).
template <typename T, typename Load, typename Scalar>
float dot_fma(int64_t n, const T* x, const T* y, Load load, Scalar scalar) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(load(x + i), load(y + i), acc0);
    acc1 = _mm256_fmadd_ps(load(x + i + 8), load(y + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(load(x + i + 16), load(y + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(load(x + i + 24), load(y + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load(x + i), load(y + i), acc0);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += scalar(x[i]) * scalar(y[i]);
  return sum;
}

float dot_f32(int64_t n, const void* w, const void* a) {
  return dot_fma(
      n, static_cast<const float*>(w), static_cast<const float*>(a), [](const float* p) { return _mm256_loadu_ps(p); },
      [](float v) { return v; });
}

float dot_f16(int64_t n, const void* w, const void* a) {
  return dot_fma(
      n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a),
      [](const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); },
      [](uint16_t v) { return fp16_to_fp32(v); });
}

float dot_bf16(int64_t n, const void* w, const void* a) {
  // A bf16 is the top half of a float: widen to 32 bits and shift into place.
  auto load = [](const uint16_t* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  };
  auto scalar = [](uint16_t v) {
    const uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  return dot_fma(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(a), load, scalar);
}

// The kernels below that matter most for MoE models come as `struct { template <int N> static void cols(...) }`:
// one weight row against N activation rows at once (N = 1..4), so the row's blocks are unpacked once for all N.
// Column j's arithmetic is the same instruction sequence for every N, so dot_rows and vec_dot agree bit for bit.
template <typename Kernel>
float dot_one(int64_t n, const void* w, const void* a) {
  float out;
  Kernel::template cols<1>(n, w, static_cast<const uint8_t*>(a), 0, &out);
  return out;
}

template <typename Kernel>
void dot_rows(int64_t n, const void* w, const uint8_t* act, size_t stride, int64_t n_act, float* out) {
  int64_t j = 0;
  for (; j + 4 <= n_act; j += 4) Kernel::template cols<4>(n, w, act + j * stride, stride, out + j);
  switch (n_act - j) {
    case 3:
      Kernel::template cols<3>(n, w, act + j * stride, stride, out + j);
      break;
    case 2:
      Kernel::template cols<2>(n, w, act + j * stride, stride, out + j);
      break;
    case 1:
      Kernel::template cols<1>(n, w, act + j * stride, stride, out + j);
      break;
    default:
      break;
  }
}

// The N activation rows of a cols<N> call as block arrays.
template <typename Block, int N>
struct ActRows {
  const Block* y[N];
  ActRows(const uint8_t* act, size_t stride) {
    for (int j = 0; j < N; ++j) y[j] = reinterpret_cast<const Block*>(act + j * stride);
  }
  const Block* operator[](int j) const { return y[j]; }
};

// Signed 8-bit weights x signed 8-bit activations of a 32-value block, with the weights' sign work done once.
struct SignedWeights {
  __m256i abs_w, w;
  explicit SignedWeights(__m256i q) : abs_w(_mm256_sign_epi8(q, q)), w(q) {}
  __m256i dot(__m256i qy) const {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(qy, w)), _mm256_set1_epi16(1));
  }
};

// Q8_0 and Q5_0 against Q8_0 activations: one scale per 32-value block on both sides.
template <typename Block, typename Values>
struct Blocks32 {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const auto* x = static_cast<const Block*>(w);
    const ActRows<quant::BlockQ8_0, N> y(act, stride);
    __m256 acc[N];
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 32; ++i) {
      const SignedWeights q(Values::get(x[i]));
      const float xd = fp16_to_fp32(x[i].d);
      for (int j = 0; j < N; ++j) {
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].qs));
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(xd * fp16_to_fp32(y[j][i].d)), _mm256_cvtepi32_ps(q.dot(qy)), acc[j]);
      }
    }
    for (int j = 0; j < N; ++j) out[j] = hsum(acc[j]);
  }
};

struct Q8_0Values {
  static __m256i get(const quant::BlockQ8_0& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
};

// 32 nibbles of a Q4_0/IQ4_NL-style block as bytes: element j in the low nibble of qs[j], j+16 in the high one.
inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low4), _mm_and_si128(packed, low4));
}

// The fifth bits of a Q5_0/Q5_1 block as 0x10 per byte: every byte of the 32-bit mask is copied to 8 lanes, and
// each lane tests its own bit.
inline __m256i fifth_bits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof qh);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

float dot_q4_0(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const quant::BlockQ4_0*>(w);
  const auto* y = static_cast<const quant::BlockQ8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / quant::kQK4_0; ++i) {
    const __m256i q = _mm256_sub_epi8(nibbles_32(x[i].qs), _mm256_set1_epi8(8));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)),
                          _mm256_cvtepi32_ps(dot_i8(q, qy)), acc);
  }
  return hsum(acc);
}

// IQ4: each nibble indexes the 16 non-uniform levels; one byte shuffle maps all 32 at once.
inline __m256i iq4_levels() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4NlValues)));
}

float dot_iq4_nl(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const quant::BlockIQ4_NL*>(w);
  const auto* y = static_cast<const quant::BlockQ8_0*>(a);
  const __m256i levels = iq4_levels();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / quant::kQK4_NL; ++i) {
    const __m256i q = _mm256_shuffle_epi8(levels, nibbles_32(x[i].qs));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)),
                          _mm256_cvtepi32_ps(dot_i8(q, qy)), acc);
  }
  return hsum(acc);
}

// IQ4_XS: 8 sub-blocks of 32 per super-block, each with a 6-bit scale (4 low bits in scales_l, 2 high bits in
// scales_h) offset by 32; the values are IQ4 levels as in IQ4_NL.
float dot_iq4_xs(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const quant::BlockIQ4_XS*>(w);
  const auto* y = static_cast<const quant::BlockQ8_K*>(a);
  const __m256i levels = iq4_levels();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    __m256 block = _mm256_setzero_ps();
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((x[i].scales_h >> (2 * ib)) & 3) << 4);
      const __m256i q = _mm256_shuffle_epi8(levels, nibbles_32(x[i].qs + 16 * ib));
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 32 * ib));
      block = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(ls - 32)), _mm256_cvtepi32_ps(dot_i8(q, qy)), block);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), block, acc);
  }
  return hsum(acc);
}

// Q4_1 and Q5_1 store unsigned values with a min; against Q8_1 the min meets the activation block's stored sum s:
// d_w * d_a * sum(q_w * q_a) + m_w * s_a, as ggml computes it.
inline __m256i unsigned_dot(__m256i q, __m256i qy) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, qy), _mm256_set1_epi16(1));
}

float dot_q4_1(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const quant::BlockQ4_1*>(w);
  const auto* y = static_cast<const quant::BlockQ8_1*>(a);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < n / quant::kQK4_1; ++i) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)),
                          _mm256_cvtepi32_ps(unsigned_dot(nibbles_32(x[i].qs), qy)), acc);
    mins += fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  return hsum(acc) + mins;
}

float dot_q5_1(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const quant::BlockQ5_1*>(w);
  const auto* y = static_cast<const quant::BlockQ8_1*>(a);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < n / quant::kQK5_1; ++i) {
    const __m256i q = _mm256_or_si256(nibbles_32(x[i].qs), fifth_bits(x[i].qh));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)),
                          _mm256_cvtepi32_ps(unsigned_dot(q, qy)), acc);
    mins += fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  return hsum(acc) + mins;
}

// Q5_0: 32 values of 4 low bits (elements j and j+16 share a byte) plus a fifth bit each in a 32-bit mask,
// minus 16.
inline __m256i q5_0_values(const quant::BlockQ5_0& b) {
  return _mm256_sub_epi8(_mm256_or_si256(nibbles_32(b.qs), fifth_bits(b.qh)), _mm256_set1_epi8(16));
}

struct Q5_0Values {
  static __m256i get(const quant::BlockQ5_0& b) { return q5_0_values(b); }
};

// Q4_K: 8 groups of 32 with 6-bit scales and mins packed in 12 bytes. The 12 bytes are unpacked with 32-bit word
// operations into 8 scale bytes followed by 8 min bytes, then widened once per super-block: the mins meet the
// activation's group sums in one madd, and each group's scale is broadcast by a byte shuffle instead of a move
// from a general register.
inline __m256i q4k_scales_and_mins(const uint8_t* packed) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_low = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_low;
  u[0] &= kLow6;
  // u[0..1]: scales of groups 0-7; u[2..3]: mins of groups 0-7. Widened: lanes 0-7 scales, 8-15 mins.
  return _mm256_cvtepu8_epi16(
      _mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]), static_cast<int>(u[1]), static_cast<int>(u[0])));
}

// Q4_K and Q5_K share everything but Q5_K's fifth bit: bit 2c of qh[l] for value 64c + l and bit 2c+1 for
// value 64c + 32 + l.
template <typename Block, bool kFifthBit>
struct Q4Q5K {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const auto* x = static_cast<const Block*>(w);
    const ActRows<quant::BlockQ8_K, N> y(act, stride);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[N];
    __m128 acc_min[N];
    for (int j = 0; j < N; ++j) {
      acc[j] = _mm256_setzero_ps();
      acc_min[j] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      const __m256i scales_mins = q4k_scales_and_mins(x[i].scales);
      // Pairs of the 16 activation group sums give the 8 groups of 32; times the mins, summed in 4 int32 lanes.
      __m128i mins_products[N];
      for (int j = 0; j < N; ++j) {
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].bsums));
        const __m128i group_sums = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
        mins_products[j] = _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), group_sums);
      }
      const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(scales_mins));
      __m256i qh = _mm256_setzero_si256();
      if constexpr (kFifthBit) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh));
      __m256i sumi[N];
      for (int j = 0; j < N; ++j) sumi[j] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        // Broadcast the int16 scales of groups 2c and 2c+1 (bytes 4c..4c+3 of each lane).
        const __m256i sc_lo =
            _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>((4 * c + 1) << 8 | 4 * c)));
        const __m256i sc_hi =
            _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>((4 * c + 3) << 8 | (4 * c + 2))));
        const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * c));
        __m256i lo = _mm256_and_si256(q4, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
        if constexpr (kFifthBit) {
          // The shift count comes in a vector register, since c is not a compile-time constant.
          const __m256i bit0 = _mm256_set1_epi8(0x01);
          const __m256i h_lo = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), bit0);
          const __m256i h_hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), bit0);
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(h_lo, 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(h_hi, 4));
        }
        for (int j = 0; j < N; ++j) {
          const __m256i a_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].qs + 64 * c));
          const __m256i a_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].qs + 64 * c + 32));
          sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a_lo), sc_lo));
          sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a_hi), sc_hi));
        }
      }
      const float xd = fp16_to_fp32(x[i].d), xdmin = fp16_to_fp32(x[i].dmin);
      for (int j = 0; j < N; ++j) {
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(y[j][i].d * xd), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
        acc_min[j] = _mm_fmadd_ps(_mm_set1_ps(y[j][i].d * xdmin), _mm_cvtepi32_ps(mins_products[j]), acc_min[j]);
      }
    }
    for (int j = 0; j < N; ++j) {
      __m128 m = _mm_add_ps(acc_min[j], _mm_movehl_ps(acc_min[j], acc_min[j]));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      out[j] = hsum(acc[j]) - _mm_cvtss_f32(m);
    }
  }
};

// Q2_K: 2-bit values, 16 groups of 16 with a 4-bit scale (low nibble) and a 4-bit min (high nibble). Value
// 128n + 32j + l is bits 2j..2j+1 of qs[32n + l]; its group is 8n + 2j + l / 16.
float dot_q2_k(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const quant::BlockQ2_K*>(w);
  const auto* y = static_cast<const quant::BlockQ8_K*>(a);
  const __m256i two_bits = _mm256_set1_epi8(0x03);
  __m256 acc = _mm256_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    const __m256i scales16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(0x0F)));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F)));
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
    const __m256i mins_products = _mm256_madd_epi16(mins16, bsums);
    __m256i sumi = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * half));
      // This half's 8 scales in both lanes; value row j uses scale 2j in its low lane and 2j+1 in its high one.
      const __m256i half_scales =
          half == 0 ? _mm256_permute4x64_epi64(scales16, 0x44) : _mm256_permute4x64_epi64(scales16, 0xEE);
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_and_si256(_mm256_srl_epi16(q2, _mm_cvtsi32_si128(2 * j)), two_bits);
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 128 * half + 32 * j));
        const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>((4 * j + 3) << 8 | (4 * j + 2))),
                                              _mm_set1_epi16(static_cast<int16_t>((4 * j + 1) << 8 | 4 * j)));
        sumi = _mm256_add_epi32(sumi,
                                _mm256_madd_epi16(_mm256_maddubs_epi16(v, av), _mm256_shuffle_epi8(half_scales, pick)));
      }
    }
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = y[i].d * fp16_to_fp32(x[i].dmin);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(mins_products), acc_min);
  }
  return hsum(acc) - hsum(acc_min);
}

// Q3_K: 3-bit values -4..3 as 2 low bits in qs and a high bit in hmask that, when clear, subtracts 4; 16 groups
// of 16 with 6-bit scales offset by 32. Value 128n + 32j + l: bits 2j of qs[32n + l], bit 4n + j of hmask[l].
// The products use v = low | high << 2 (0..7), and the -4 folds in through the activation's group sums.
float dot_q3_k(int64_t n, const void* w, const void* a) {
  const auto* x = static_cast<const quant::BlockQ3_K*>(w);
  const auto* y = static_cast<const quant::BlockQ8_K*>(a);
  const __m256i two_bits = _mm256_set1_epi8(0x03);
  const __m256i bit0 = _mm256_set1_epi8(0x01);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
    constexpr uint32_t kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    uint32_t u[4];
    std::memcpy(u, x[i].scales, 12);
    const uint32_t high = u[2];
    u[2] = ((u[0] >> 4) & kLow4) | (((high >> 4) & kLow2) << 4);
    u[3] = ((u[1] >> 4) & kLow4) | (((high >> 6) & kLow2) << 4);
    u[0] = (u[0] & kLow4) | ((high & kLow2) << 4);
    u[1] = (u[1] & kLow4) | (((high >> 2) & kLow2) << 4);
    const __m128i scales8 = _mm_sub_epi8(
        _mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]), static_cast<int>(u[1]), static_cast<int>(u[0])),
        _mm_set1_epi8(32));
    const __m256i scales16 = _mm256_cvtepi8_epi16(scales8);
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
    __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(scales16, bsums), 2));
    const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].hmask));
    for (int half = 0; half < 2; ++half) {
      const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * half));
      const __m256i half_scales =
          half == 0 ? _mm256_permute4x64_epi64(scales16, 0x44) : _mm256_permute4x64_epi64(scales16, 0xEE);
      for (int j = 0; j < 4; ++j) {
        const __m256i low = _mm256_and_si256(_mm256_srl_epi16(q2, _mm_cvtsi32_si128(2 * j)), two_bits);
        const __m256i hbit = _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_cvtsi32_si128(4 * half + j)), bit0);
        const __m256i v = _mm256_or_si256(low, _mm256_slli_epi16(hbit, 2));
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 128 * half + 32 * j));
        const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>((4 * j + 3) << 8 | (4 * j + 2))),
                                              _mm_set1_epi16(static_cast<int16_t>((4 * j + 1) << 8 | 4 * j)));
        sumi = _mm256_add_epi32(sumi,
                                _mm256_madd_epi16(_mm256_maddubs_epi16(v, av), _mm256_shuffle_epi8(half_scales, pick)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * fp16_to_fp32(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

// Q6_K: 16 groups of 16 with signed 8-bit scales; values are 6-bit unsigned minus 32. The products use the
// unsigned values and the -32 is folded in through the activation's group sums.
struct Q6K {
  template <int N>
  static void cols(int64_t n, const void* w, const uint8_t* act, size_t stride, float* out) {
    const auto* x = static_cast<const quant::BlockQ6_K*>(w);
    const ActRows<quant::BlockQ8_K, N> y(act, stride);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    __m256 acc[N];
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / quant::kQK_K; ++i) {
      const quant::BlockQ6_K& b = x[i];
      // The 16 scales widened once; the -32 offset folds in as 32 * sum(scale * group sum), kept in vector lanes.
      const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
      __m256i sumi[N];
      for (int j = 0; j < N; ++j) {
        const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].bsums));
        sumi[j] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(scales16, bsums), 5));
      }
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = b.ql + 64 * half;
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * half));
        const __m256i rows[4] = {
            _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
            _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45)),
        };
        // This half's 8 scales in both 128-bit lanes; row k uses scale 2k in its low lane and 2k+1 in its high one.
        const __m256i half_scales =
            half == 0 ? _mm256_permute4x64_epi64(scales16, 0x44) : _mm256_permute4x64_epi64(scales16, 0xEE);
        for (int k = 0; k < 4; ++k) {
          const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>((4 * k + 3) << 8 | (4 * k + 2))),
                                                _mm_set1_epi16(static_cast<int16_t>((4 * k + 1) << 8 | 4 * k)));
          const __m256i scales = _mm256_shuffle_epi8(half_scales, pick);
          for (int j = 0; j < N; ++j) {
            const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][i].qs + 128 * half + 32 * k));
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(rows[k], av), scales));
          }
        }
      }
      const float xd = fp16_to_fp32(b.d);
      for (int j = 0; j < N; ++j)
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(y[j][i].d * xd), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
    }
    for (int j = 0; j < N; ++j) out[j] = hsum(acc[j]);
  }
};

}  // namespace

void install(KernelTable& table) {
  using quant::GgmlType;
  // A format with a kernel of its own here drops any multi-row kernel of the tier below (the pair must agree).
  auto set = [&](GgmlType t, VecDotFn fn) {
    table.vec_dot[static_cast<uint32_t>(t)] = fn;
    table.vec_dot_rows[static_cast<uint32_t>(t)] = nullptr;
  };
  auto set_cols = [&]<typename Kernel>(GgmlType t, Kernel) {
    table.vec_dot[static_cast<uint32_t>(t)] = &dot_one<Kernel>;
    table.vec_dot_rows[static_cast<uint32_t>(t)] = &dot_rows<Kernel>;
  };
  set(GgmlType::F32, &dot_f32);
  set(GgmlType::F16, &dot_f16);
  set_cols(GgmlType::Q8_0, Blocks32<quant::BlockQ8_0, Q8_0Values>{});
  set_cols(GgmlType::Q5_0, Blocks32<quant::BlockQ5_0, Q5_0Values>{});
  set(GgmlType::BF16, &dot_bf16);
  set(GgmlType::Q4_0, &dot_q4_0);
  set(GgmlType::Q4_1, &dot_q4_1);
  set(GgmlType::Q5_1, &dot_q5_1);
  set(GgmlType::IQ4_NL, &dot_iq4_nl);
  set(GgmlType::IQ4_XS, &dot_iq4_xs);
  set(GgmlType::Q2_K, &dot_q2_k);
  set(GgmlType::Q3_K, &dot_q3_k);
  set_cols(GgmlType::Q4_K, Q4Q5K<quant::BlockQ4_K, false>{});
  set_cols(GgmlType::Q5_K, Q4Q5K<quant::BlockQ5_K, true>{});
  set_cols(GgmlType::Q6_K, Q6K{});
}

}  // namespace hetmoe::cpu::avx2
