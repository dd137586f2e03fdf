#pragma once

// The Device ops computed on the CPU, synchronously, on host memory: the host device runs them on the caller's thread
// with the model's pool, the emulated device on a stream's worker thread with a pool of one. One definition each, so
// the two devices cannot drift apart.

#include <cstdint>
#include <span>

#include "cpu_kernels/linear_attention.h"
#include "cpu_kernels/matmul.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/thread_pool.h"
#include "runtime/device/device.h"

namespace hetmoe::device::host_ops {

inline cpu::WeightMatrix as_weights(const DeviceMatrix& w) {
  return {w.type, w.n_cols, w.n_rows, w.row_bytes, static_cast<const uint8_t*>(w.data)};
}

// The threaded kernel-table matmul on the rows where they lie (tiles, oneDNN and NUMA partition as cpu::matmul
// chooses); strided activations go through cpu::matmul_heads as one head.
void matmul(cpu::ThreadPool& pool, const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
            int64_t ldy);
void matmul_heads(cpu::ThreadPool& pool, const DeviceMatrix& w, const cpu::HeadsLayout& layout, const float* x,
                  int64_t n, float* y);
// Device::matmuls as cpu::matmuls computes it: one loop for all the matrices.
void matmuls(cpu::ThreadPool& pool, std::span<const Device::MatmulOutput> outs, const float* x, int64_t n);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void add(const float* x, int64_t n, float* y);
void add_bias(const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy);
void layer_norm(const float* x, int64_t ldx, const float* weight, const float* bias, int64_t n_rows, int64_t width,
                float eps, float* y, int64_t ldy);
void rms_norm(const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width, float eps, float* y,
              int64_t ldy);
void rope(const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
          int n_dims, bool neox);
void gated_rms_norm(const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz, int64_t n_rows,
                    int64_t width, float eps, float* y, int64_t ldy);
void sigmoid_mul(const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y, int64_t ldy);
void copy_rows(const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst, int64_t ldd);
void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst);
void combine_rows(const float* src, int64_t width, const int32_t* index, const float* weights, int64_t n, int64_t k,
                  float* dst);
void select_experts(const cpu::ExpertSelection& p, float* logits, const float* bias, int64_t n, int32_t* ids,
                    float* weights);

}  // namespace hetmoe::device::host_ops
