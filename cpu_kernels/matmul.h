#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/thread_pool.h"
#include "quant/ggml_type.h"

namespace hetmoe::cpu {

// A matrix of GGUF rows used where it lies (usually the mmap'd file): n_rows rows of n_cols elements of `type`,
// row r at data + r * row_bytes. One expert of a 3-D expert tensor is such a matrix too.
struct WeightMatrix {
  quant::GgmlType type = quant::GgmlType::F32;
  int64_t n_cols = 0;
  int64_t n_rows = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;

  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  WeightMatrix rows(int64_t first, int64_t count) const { return {type, n_cols, count, row_bytes, row(first)}; }
};

// y[t * ldy + r] = W.row(r) . x[t * n_cols ...] for every token t < n_tokens and row r.
// Each activation row is first converted to the weight's vec_dot_type, as ggml does, so quantized models agree
// with llama.cpp; the rows of W are split across the pool's threads and each row is read once for all tokens.
// The converted activations live in a per-thread scratch buffer that keeps its capacity (no allocation once warm).
// Batches of kTileMinActs tokens or more take the tier's tile kernel where it has one for the type, and F32 weights
// take oneDNN where the build has it: equal to the token-by-token result to rounding, not bit for bit.
void matmul(const KernelTable& k, ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
            int64_t ldy);

// One output of matmuls: y[t * ldy + r] = w.row(r) . x_t.
struct MatmulOutput {
  WeightMatrix w;
  float* y = nullptr;
  int64_t ldy = 0;
};
// Matrices with the same input rows (MLA's q and kv_a, GQA's q, k and v), each output as matmul computes it, bit for
// bit, in one parallel loop over all their rows with the activation converted once: a decode step pays one hand-over
// and one conversion where a matmul per matrix pays each per matrix (and the last pieces of the small ones). More
// than kMaxFused matrices, matrices of different widths or activation types, and F32 ones that a batch sends to
// oneDNN go one matmul each.
constexpr size_t kMaxFused = 4;
void matmuls(const KernelTable& k, ThreadPool& pool, std::span<const MatmulOutput> outs, const float* x,
             int64_t n_tokens);

// Rows r .. r + kTileRows of w against n_act activation rows (act + j * act_row) into dst[j * kTileRows + i]: through
// `tile` when given, else row by row (dot_rows), i.e. the path matmul takes for those rows.
void block_dots(const KernelTable& k, GemmTileFn tile, const WeightMatrix& w, int64_t r, const uint8_t* act,
                size_t act_row, int64_t n_act, float* dst);

// Per-head matrices in one pass (MLA's attn_k_b / attn_v_b): w holds n_heads blocks of rows; for head h and token t,
// y[t * y_token_stride + h * y_head_stride + r] = w.row(h * rows + r) . x[t * x_token_stride + h * x_head_stride ...].
// One activation conversion and one parallel loop for all heads, where a matmul per head would pay both per head.
struct HeadsLayout {
  int64_t n_heads = 0;
  int64_t x_token_stride = 0, x_head_stride = 0;
  int64_t y_token_stride = 0, y_head_stride = 0;
};
void matmul_heads(const KernelTable& k, ThreadPool& pool, const WeightMatrix& w, const HeadsLayout& layout,
                  const float* x, int64_t n_tokens, float* y);

// The first half of a SwiGLU FFN in one pass: out[t * n_rows + r] = silu(gate.row(r) . x_t) * (up.row(r) . x_t).
// Each thread takes a range of rows of both matrices, so the SiLU product is formed while both results are in
// registers and the activation is converted once for both (once per type when they differ).
// A matrix that matmul would send to oneDNN (F32 in a batch) goes there here too, unfused.
void swiglu_matmul(const KernelTable& k, ThreadPool& pool, const WeightMatrix& gate, const WeightMatrix& up,
                   const float* x, int64_t n_tokens, float* out);

}  // namespace hetmoe::cpu
