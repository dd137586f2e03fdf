#pragma once

#include <cstdint>

namespace hetmoe::cpu {

// oneDNN's f32 matmul, where the build has oneDNN: it measured 3.5x the project's F32 dot products for batches
// of 4 or more tokens (tests/bench/bench_onednn, one core). matmul() sends F32 weight matrices there for batches.
bool onednn_available();

// y[t * ldy + r] = w_row(r) . x[t * n_cols ...] for r < n_rows, t < n_tokens, where row r of the weights starts
// at w + r * w_row_stride (floats): the GGUF rows are read in place, no copy or relayout. Runs on the calling
// thread only (oneDNN's OpenMP team is held to one thread per caller, so the pool's threads each run their own
// slice). A primitive per shape is created once per thread and kept.
void onednn_matmul_f32(const float* w, int64_t n_rows, int64_t n_cols, int64_t w_row_stride, const float* x,
                       int64_t n_tokens, float* y, int64_t ldy);
// The same with the weights the other way round: element (c, r) of the n_cols x n_rows matrix at
// w + c * w_col_stride + r, so y[t][r] = sum_c x[t][c] * w[c][r] (attention's probabilities times the value rows).
// x has rows ldx apart.
void onednn_matmul_f32_kn(const float* w, int64_t n_rows, int64_t n_cols, int64_t w_col_stride, const float* x,
                          int64_t ldx, int64_t n_tokens, float* y, int64_t ldy);

}  // namespace hetmoe::cpu
