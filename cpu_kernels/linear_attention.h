#pragma once

// Qwen3.5's Gated DeltaNet blocks (linear attention): the short causal convolution in front of them and the gated
// delta rule with its recurrent state, in F32 and in the order of operations of llama.cpp's CPU backend.

#include <cmath>
#include <cstdint>

#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {

// A causal depthwise convolution of `width` taps over `channels` channels, followed by SiLU:
// y[t][c] = silu(sum over k < width of weight[c][k] * in(t - (width - 1) + k)[c]), where in(t) is x's row t for
// t >= 0 and the state's rows before it. The state holds the last width - 1 inputs, [width - 1][channels], oldest
// first (zeros for a fresh sequence); it is updated to the last width - 1 inputs of the batch. y must not overlap x
// or the state.
struct ShortConv {
  int64_t channels = 0;
  int width = 0;
  const float* weight =
      nullptr;  // [channels][width], the current token's tap last (GGUF's ssm_conv1d {width, channels})
};
void short_conv_silu(const ShortConv& conv, const float* x, int64_t ldx, int64_t n, float* state, float* y,
                     int64_t ldy);

// The gated delta rule over a batch of n tokens, each after the one before. Per token, the input row holds the
// conv's output [q: n_k_heads * head_dim | k: n_k_heads * head_dim | v: n_v_heads * head_dim]; value head h uses
// query/key head h mod n_k_heads. q and k are L2-normalised per head (x / sqrt(sum x^2 + eps)); per value head
// beta = sigmoid(beta_raw), g = a * softplus(alpha_raw + dt_bias), and with the head's state S (head_dim x head_dim,
// key index i, value index j):
//   S = exp(g) S;  d[j] = beta (v[j] - sum_i S[i][j] k[i]);  S[i][j] += k[i] d[j];  o[j] = sum_i S[i][j] q[i] /
//   sqrt(head_dim).
// The state is [n_v_heads][j][i] (a value index's row of keys contiguous); out: [n][n_v_heads * head_dim].
struct DeltaNetShape {
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;  // a multiple of n_k_heads
  int64_t head_dim = 0;   // of keys and values alike
  float eps = 1e-6f;      // of the L2 norm
};
struct DeltaNetInput {
  const float* qkv = nullptr;  // token t at qkv + t * ld_qkv
  int64_t ld_qkv = 0;
  const float* alpha = nullptr;  // [n][n_v_heads] at alpha + t * ld_gates
  const float* beta = nullptr;   // [n][n_v_heads] at beta + t * ld_gates
  int64_t ld_gates = 0;
  const float* a = nullptr;        // [n_v_heads] (GGUF's ssm_a: -exp(A_log))
  const float* dt_bias = nullptr;  // [n_v_heads]
};
void gated_delta_net(const DeltaNetShape& shape, const DeltaNetInput& in, int64_t n, float* state, float* out,
                     int64_t ldo, ThreadPool& pool);
// Floats of one sequence's delta-rule state.
inline int64_t delta_net_state_floats(const DeltaNetShape& s) { return s.n_v_heads * s.head_dim * s.head_dim; }

// y = rms_norm(x) * w * silu(z) over n values (the output norm of a Gated DeltaNet head); y may alias x.
void gated_rms_norm(const float* x, const float* w, const float* z, float* y, int64_t n, float eps);

}  // namespace hetmoe::cpu
