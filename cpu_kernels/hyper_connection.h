#pragma once

// DeepSeek-V4's hyper-connections and KV compressor, in F32 and in the order of operations of llama.cpp's fused CPU
// ops (DSV4_HC_PRE / _COMB / _POST) and its compressor graph.

#include <cstdint>

#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {

// The residual stream of a hyper-connected model is n_streams copies of the hidden state, X = [X_0 .. X_{S-1}] (S
// rows of `width`). Around each sub-block (attention, FFN) a token's mixes m = fn . rms(flatten(X)) (n_mix() values,
// computed by the caller) become its coefficients:
//   pre[h]  = sigmoid(m[h] s0 + b[h]) + eps                       the sub-block's input  x = sum_h pre[h] X_h
//   post[h] = 2 sigmoid(m[S + h] s1 + b[S + h])                   and the new state
//   comb[dst + S src] = m[2S + k] s2 + b[2S + k], k = dst + S src X'_dst = post[dst] y + sum_src comb[dst + S src]
//   X_src
// comb goes through a softmax over dst for each src (+ eps), then Sinkhorn: columns (each dst summed over src)
// normalised, then sinkhorn_iters - 1 times rows (each src over dst) and columns, every sum starting from eps.
// The output head has pre only, with a single scale: n_mix() = S, and the head's input is sum_h pre[h] X_h.
struct HyperConnection {
  int n_streams = 0;
  int sinkhorn_iters = 0;
  bool output_head = false;
  float eps = 0.0f;              // hyper_connection.epsilon (not the RMS norm's)
  const float* scale = nullptr;  // [3] (s0, s1, s2); the head: [1]
  const float* base = nullptr;   // [n_mix()]
  int n_mix() const { return output_head ? n_streams : (2 + n_streams) * n_streams; }
  // A token's coefficients: pre [S], post [S], comb [S * S]; the head: pre [S].
  int n_coef() const { return n_mix(); }
};
// One token's mixes [n_mix()] to its coefficients [n_coef()].
void hyper_mix(const HyperConnection& hc, const float* mix, float* coef);
// For n tokens: the mixes (token t's at mix + t * ldm) to the coefficients coef [n][n_coef()], and the sub-block's
// input out [n][width] = sum over h ascending of pre[h] * X_h from the state x [n][n_streams * width].
void hyper_pre(const HyperConnection& hc, const float* mix, int64_t ldm, const float* x, int64_t width, int64_t n,
               float* coef, float* out, ThreadPool& pool);
// For n tokens: the new state x_new [n][S * width], X'_dst = y * post[dst] + sum over src ascending of
// X_src * comb[dst + S src], from the sub-block's output y [n][width], the state x and the coefficients; x_new must
// not overlap x.
void hyper_post(const HyperConnection& hc, const float* coef, const float* y, const float* x, int64_t width, int64_t n,
                float* x_new, ThreadPool& pool);

// DeepSeek-V4's KV compressor. Every position brings a row of values kv and scores (gate . x plus the positional
// bias ape[pos mod ratio]); every `ratio` positions give one compressed entry of `width` channels: per channel, a
// softmax over the block's positions of the scores weights a sum of the values. Overlapping (ratio 4 in the CSA
// layers): rows hold 2 * width channels and block b pools 2 * ratio positions, the previous block's with channels
// [0, width) and its own with [width, 2 width); block 0's previous positions count as value 0, score -inf.
// The rows a later block still needs are kept between calls in a state ring: state_rows() rows of [kv | score]
// (row_width() floats each), position p at row p mod state_rows(); zeros for a fresh sequence.
struct Compressor {
  int64_t width = 0;
  int64_t ratio = 0;
  bool overlap = false;
  const float* ape = nullptr;  // [ratio][row_width()]
  int64_t row_width() const { return overlap ? 2 * width : width; }
  int64_t state_rows() const { return overlap ? 2 * ratio : ratio; }
  int64_t state_floats() const { return state_rows() * 2 * row_width(); }
  // The blocks positions [pos0, pos0 + n) complete: first_block(pos0) .. end_block(pos0 + n) - 1.
  int64_t first_block(int64_t pos0) const { return pos0 / ratio; }
  int64_t end_block(int64_t end) const { return end / ratio; }
};
// Tokens at positions pos0 .. pos0 + n - 1, their rows at kv + t * ld and score + t * ld, in order: each row (its
// score plus ape) goes into the state, and a token that completes a block writes the block's entry to the next row
// of out ([blocks completed][width]).
void compress(const Compressor& c, const float* kv, const float* score, int64_t ld, int64_t n, int64_t pos0,
              float* state, float* out, ThreadPool& pool);

}  // namespace hetmoe::cpu
