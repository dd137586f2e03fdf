#include "cpu_kernels/linear_attention.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"

namespace hetmoe::cpu {

void short_conv_silu(const ShortConv& conv, const float* x, int64_t ldx, int64_t n, float* state, float* y,
                     int64_t ldy) {
  const int64_t C = conv.channels;
  const int taps = conv.width, back = taps - 1;
  // The rows the taps read for token t: row t + k of [state; x].
  auto row = [&](int64_t r) { return r < back ? state + r * C : x + (r - back) * ldx; };
  for (int64_t t = 0; t < n; ++t) {
    float* out = y + t * ldy;
    for (int64_t c = 0; c < C; ++c) {
      const float* w = conv.weight + c * taps;
      float sum = 0.0f;
      for (int k = 0; k < taps; ++k) sum += row(t + k)[c] * w[k];
      out[c] = sum / (1.0f + std::exp(-sum));
    }
  }
  // The state becomes the last `back` rows of [state; x], moved oldest first.
  for (int64_t r = 0; r < back; ++r) {
    const int64_t src = n + r;  // row of [state; x]
    if (src < back) {
      std::memmove(state + r * C, state + src * C, C * sizeof(float));
    } else {
      std::memcpy(state + r * C, x + (src - back) * ldx, C * sizeof(float));
    }
  }
}

void gated_delta_net(const DeltaNetShape& shape, const DeltaNetInput& in, int64_t n, float* state, float* out,
                     int64_t ldo, ThreadPool& pool) {
  const int64_t D = shape.head_dim, Hk = shape.n_k_heads, Hv = shape.n_v_heads;
  const VecDotFn dot = kernels().dot_for(quant::GgmlType::F32);
  const float out_scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float norm_eps = shape.eps / static_cast<float>(D), norm_scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Each value head runs its tokens in order; heads are independent.
  pool.parallel_for(Hv, 1, [&](int64_t h0, int64_t h1) {
    std::span<float> work = scratch<float, struct DeltaNetWorkSite>(static_cast<size_t>(3 * D));
    float* q = work.data();
    float* k = q + D;
    float* delta = k + D;
    for (int64_t h = h0; h < h1; ++h) {
      float* S = state + h * D * D;  // S[j * D + i]: value index j, key index i
      const int64_t kh = h % Hk;
      for (int64_t t = 0; t < n; ++t) {
        const float* row = in.qkv + t * in.ld_qkv;
        // L2 norm as llama.cpp writes it: an RMS norm with eps / D, then 1 / sqrt(D).
        rms_norm(row + kh * D, nullptr, q, D, norm_eps);
        rms_norm(row + (Hk + kh) * D, nullptr, k, D, norm_eps);
        for (int64_t i = 0; i < D; ++i) {
          q[i] *= norm_scale;
          k[i] *= norm_scale;
        }
        const float* v = row + 2 * Hk * D + h * D;
        const float beta = 1.0f / (1.0f + std::exp(-in.beta[t * in.ld_gates + h]));
        const float g = softplus(in.alpha[t * in.ld_gates + h] + in.dt_bias[h]) * in.a[h];
        const float decay = std::exp(g);
        for (int64_t e = 0; e < D * D; ++e) S[e] *= decay;
        for (int64_t j = 0; j < D; ++j) delta[j] = (v[j] - dot(D, S + j * D, k)) * beta;
        for (int64_t j = 0; j < D; ++j) {
          float* Sj = S + j * D;
          const float dj = delta[j];
          for (int64_t i = 0; i < D; ++i) Sj[i] += k[i] * dj;
        }
        float* o = out + t * ldo + h * D;
        for (int64_t j = 0; j < D; ++j) o[j] = dot(D, S + j * D, q) * out_scale;
      }
    }
  });
}

void gated_rms_norm(const float* x, const float* w, const float* z, float* y, int64_t n, float eps) {
  rms_norm(x, w, y, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] *= z[i] / (1.0f + std::exp(-z[i]));
}

}  // namespace hetmoe::cpu
