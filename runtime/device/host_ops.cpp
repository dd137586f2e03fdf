#include "runtime/device/host_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "cpu_kernels/kernel_table.h"

namespace hetmoe::device::host_ops {

void matmul(cpu::ThreadPool& pool, const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
            int64_t ldy) {
  if (ldx == w.n_cols) return cpu::matmul(cpu::kernels(), pool, as_weights(w), x, n, y, ldy);
  cpu::matmul_heads(
      cpu::kernels(), pool, as_weights(w),
      {.n_heads = 1, .x_token_stride = ldx, .x_head_stride = 0, .y_token_stride = ldy, .y_head_stride = 0}, x, n, y);
}

void matmul_heads(cpu::ThreadPool& pool, const DeviceMatrix& w, const cpu::HeadsLayout& layout, const float* x,
                  int64_t n, float* y) {
  cpu::matmul_heads(cpu::kernels(), pool, as_weights(w), layout, x, n, y);
}

void matmuls(cpu::ThreadPool& pool, std::span<const Device::MatmulOutput> outs, const float* x, int64_t n) {
  // As cpu matrices, as many at a time as one cpu::matmuls loop takes (a layer's projections: all of them).
  std::array<cpu::MatmulOutput, cpu::kMaxFused> cpu_outs;
  for (size_t first = 0; first < outs.size(); first += cpu::kMaxFused) {
    const size_t count = std::min(cpu::kMaxFused, outs.size() - first);
    for (size_t i = 0; i < count; ++i) {
      const Device::MatmulOutput& o = outs[first + i];
      cpu_outs[i] = {as_weights(o.w), o.y, o.w.n_rows};
    }
    cpu::matmuls(cpu::kernels(), pool, {cpu_outs.data(), count}, x, n);
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) { cpu::swiglu(gate, up, out, n); }

void add(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void add_bias(const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) add(bias, width, y + r * ldy);
}

void layer_norm(const float* x, int64_t ldx, const float* weight, const float* bias, int64_t n_rows, int64_t width,
                float eps, float* y, int64_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) cpu::layer_norm(x + r * ldx, weight, bias, y + r * ldy, width, eps);
}

void rms_norm(const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width, float eps, float* y,
              int64_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) cpu::rms_norm(x + r * ldx, weight, y + r * ldy, width, eps);
}

void gated_rms_norm(const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz, int64_t n_rows,
                    int64_t width, float eps, float* y, int64_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) cpu::gated_rms_norm(x + r * ldx, weight, z + r * ldz, y + r * ldy, width, eps);
}

void sigmoid_mul(const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y, int64_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* g = gate + r * ldg;
    float* row = y + r * ldy;
    for (int64_t i = 0; i < width; ++i) row[i] *= 1.0f / (1.0f + std::exp(-g[i]));
  }
}

void rope(const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
          int n_dims, bool neox) {
  // rope_apply reads only the pairing and the width: the table carries the rest (frequencies, YaRN, magnitude).
  const cpu::RopeParams p{.n_dims = n_dims, .neox = neox};
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_heads; ++h)
      cpu::rope_apply(p, table + t * n_dims, x + t * token_stride + h * head_stride);
}

void copy_rows(const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst, int64_t ldd) {
  if (src == dst && lds == ldd) return;
  for (int64_t r = 0; r < n_rows; ++r) std::memmove(dst + r * ldd, src + r * lds, width * sizeof(float));
}

void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * width, src + rows[i] * width, width * sizeof(float));
}

void combine_rows(const float* src, int64_t width, const int32_t* index, const float* weights, int64_t n, int64_t k,
                  float* dst) {
  for (int64_t t = 0; t < n; ++t) {
    float* d = dst + t * width;
    std::fill(d, d + width, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t row = index[t * k + j];
      if (row < 0) continue;
      const float w = weights[t * k + j];
      for (int64_t c = 0; c < width; ++c) d[c] += w * src[row * width + c];
    }
  }
}

void select_experts(const cpu::ExpertSelection& p, float* logits, const float* bias, int64_t n, int32_t* ids,
                    float* weights) {
  for (int64_t t = 0; t < n; ++t)
    cpu::select_experts(p, logits + t * p.n_expert, bias, ids + t * p.n_used, weights + t * p.n_used);
}

}  // namespace hetmoe::device::host_ops
