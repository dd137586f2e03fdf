// The CUDA implementation of gpu_kernels/gpu.h.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gpu_kernels/gpu.h"
#include "quant/block_parts.h"
#include "quant/blocks.h"
#include "quant/ggml_type.h"
#include "quant/iq_grids.h"
#include "quant/lowbit.h"

namespace hetmoe::gpu {
namespace {

// A failed call is also the thread's "last error" until someone reads it: cleared here, so that a failure the caller
// handles (an allocation that falls back to the host) is not reported again by the next launch check.
void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s); }

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kTokensPerPass = 8;  // activation rows one warp carries at once

// This thread block's head of a gpu::Heads launch (blockIdx.y): its weight rows, activations and outputs.
__device__ __forceinline__ void select_head(const Heads& heads, int64_t rows, size_t row_bytes, const uint8_t*& w,
                                            const float*& x, float*& y) {
  w += blockIdx.y * rows * row_bytes;
  x += blockIdx.y * heads.x_stride;
  y += blockIdx.y * heads.y_stride;
}

// Each of nt tokens' sums over the warp's lanes, by shuffles, into y[t * ldy] (lane 0 writes).
__device__ __forceinline__ void store_sums(const float (&acc)[kTokensPerPass], int nt, int lane, float* y,
                                           int64_t ldy) {
#pragma unroll
  for (int t = 0; t < kTokensPerPass; ++t) {
    if (t >= nt) break;
    float v = acc[t];
    for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) y[t * ldy] = v;
  }
}

// Token t's activations x[col .. col + 8) into v, by two 16-byte loads where the caller's rows allow them.
__device__ __forceinline__ void load8(const float* x, bool aligned, float (&v)[8]) {
  if (aligned) {
    const float4 a = reinterpret_cast<const float4*>(x)[0], b = reinterpret_cast<const float4*>(x)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    for (int i = 0; i < 8; ++i) v[i] = x[i];
  }
}

// Whether every 8-value run x + h * heads.x_stride + t * ldx + 8k lies on 16 bytes.
bool aligned8(const float* x, int64_t ldx, const Heads& heads) {
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0 && heads.x_stride % 4 == 0;
}

// One warp per weight row, 8 of the row's 32-value units per step: lane l takes part l % 4 (values 8 (l % 4) ..
// + 8) of unit l / 4, so a step reads 8 consecutive units' codes and 256 consecutive activations per token, both
// coalesced. Per part and token it adds d * sum(q x) + m * sum(x) (quant/lowbit.h's d q + m); the lanes' sums meet
// by shuffles. Rows of the low-bit layout are whole groups, and every part starts on 4 bytes.
template <int kBits>
__global__ void lowbit_matmul_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t row_bytes, int group,
                                     const float* x, int64_t ldx, bool aligned, int64_t n, float* y, int64_t ldy,
                                     Heads heads) {
  select_head(heads, rows, row_bytes, w, x, y);
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const uint8_t* base = w + row * row_bytes;
  const auto* words = reinterpret_cast<const uint32_t*>(base);
  const quant::LowBitRowParts parts = quant::lowbit_row_parts(kBits, group, cols);
  const auto* scales = reinterpret_cast<const __half*>(base + parts.scales);
  const auto* offsets = reinterpret_cast<const __half*>(base + parts.offsets);
  const int64_t units = cols / 32;
  const int part = lane % 4;
  for (int64_t t0 = 0; t0 < n; t0 += kTokensPerPass) {
    const int nt = static_cast<int>(n - t0 < kTokensPerPass ? n - t0 : kTokensPerPass);
    float acc[kTokensPerPass] = {};
    for (int64_t u = lane / 4; u < units; u += kWarp / 4) {
      int q[8];
      quant::lowbit_codes8<kBits>(words + u * kBits, part, q);
      const int64_t g = u * 32 / group;
      const float d = __half2float(scales[g]), m = __half2float(offsets[g]);
      const float* xp = x + t0 * ldx + u * 32 + 8 * part;
#pragma unroll
      for (int t = 0; t < kTokensPerPass; ++t) {
        if (t >= nt) break;
        float xv[8];
        load8(xp + t * ldx, aligned, xv);
        float sq = 0, sx = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          sq += static_cast<float>(q[i]) * xv[i];
          sx += xv[i];
        }
        acc[t] += d * sq + m * sx;
      }
    }
    store_sums(acc, nt, lane, y + t0 * ldy + row, ldy);
  }
}

// GGUF block formats against F32 activations, for the dense and shared weights. The per-block kernel (the IQ formats,
// MXFP4, F32 and F16 rows whose width is no multiple of 8): one warp per weight row, lane l takes blocks l, l + 32,
// ... and computes each value from its block as quant/ref does, times the activations of up to kTokensPerPass tokens.
// The blocks are quant/blocks.h's structs (ggml's layouts, pinned there); on the device they sit at even addresses
// (rows of whole blocks from a 256-byte boundary), so their 16-bit fields read directly.
__device__ float half_bits(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// A block's values in order, f(j, value): from quant::BlockParts where the format has them, one part after the
// other (the per-block kernel for other formats, the dequantization of the cuBLAS path). F32 and F16 as blocks of
// one value, so rows of any width run.
template <quant::GgmlType kType>
struct BlockFormat {
  using Parts = quant::BlockParts<kType>;
  static constexpr int kValues = Parts::kValues, kBytes = Parts::kBytes;
  template <typename F>
  __device__ static void values(const uint8_t* p, F f) {
    for (int part = 0; part < kValues / 8; ++part) {
      float v[8];
      Parts::part(p, part, v);
      for (int i = 0; i < 8; ++i) f(8 * part + i, v[i]);
    }
  }
};

template <>
struct BlockFormat<quant::GgmlType::F32> {
  static constexpr int kValues = 1, kBytes = sizeof(float);
  template <typename F>
  __device__ static void values(const uint8_t* b, F f) {
    f(0, *reinterpret_cast<const float*>(b));
  }
};

template <>
struct BlockFormat<quant::GgmlType::F16> {
  static constexpr int kValues = 1, kBytes = sizeof(uint16_t);
  template <typename F>
  __device__ static void values(const uint8_t* b, F f) {
    f(0, half_bits(*reinterpret_cast<const uint16_t*>(b)));
  }
};

// The expert formats of the popular mixes (IQ2_XXS, IQ3_XXS, IQ4_XS, MXFP4). The IQ grids live in global memory
// (lanes index them with different entries; constant memory would serialise that), copied from quant's tables once
// per device before the first launch that needs them.
__device__ uint64_t g_iq2xxs_grid[256];
__device__ uint32_t g_iq3xxs_grid[256];
__device__ const int8_t g_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
__device__ const int8_t g_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 7 stored sign bits and the parity bit that makes the count of negatives even (quant/iq_grids.h).
__device__ uint32_t parity_signs(uint32_t seven) { return seven | (static_cast<uint32_t>(__popc(seven)) & 1u) << 7; }
__device__ float signed_byte(uint64_t entry, int j, uint32_t signs) {
  const auto v = static_cast<float>((entry >> (8 * j)) & 0xff);
  return (signs >> j & 1u) ? -v : v;
}

template <>
struct BlockFormat<quant::GgmlType::IQ2_XXS> {
  using Block = quant::BlockIQ2_XXS;
  static constexpr int kValues = quant::kQK_K, kBytes = sizeof(Block);
  template <typename F>
  __device__ static void values(const uint8_t* p, F f) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    const float d = half_bits(b.d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t* q = b.qs + 4 * ib;  // 4 index bytes, then the sign and scale word (16-bit aligned only)
      const uint32_t aux = q[2] | static_cast<uint32_t>(q[3]) << 16;
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l) {
        const uint64_t entry = g_iq2xxs_grid[(q[l / 2] >> (8 * (l % 2))) & 0xff];
        const uint32_t signs = parity_signs((aux >> (7 * l)) & 127u);
        for (int j = 0; j < 8; ++j) f(32 * ib + 8 * l + j, db * signed_byte(entry, j, signs));
      }
    }
  }
};

template <>
struct BlockFormat<quant::GgmlType::IQ3_XXS> {
  using Block = quant::BlockIQ3_XXS;
  static constexpr int kValues = quant::kQK_K, kBytes = sizeof(Block);
  template <typename F>
  __device__ static void values(const uint8_t* p, F f) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    const float d = half_bits(b.d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* s = b.qs + quant::kQK_K / 4 + 4 * ib;
      const uint32_t aux = s[0] | s[1] << 8 | s[2] << 16 | static_cast<uint32_t>(s[3]) << 24;
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l) {
        const uint32_t signs = parity_signs((aux >> (7 * l)) & 127u);
        const uint64_t entry =
            g_iq3xxs_grid[b.qs[8 * ib + 2 * l]] | static_cast<uint64_t>(g_iq3xxs_grid[b.qs[8 * ib + 2 * l + 1]]) << 32;
        for (int j = 0; j < 8; ++j) f(32 * ib + 8 * l + j, db * signed_byte(entry, j, signs));
      }
    }
  }
};

template <>
struct BlockFormat<quant::GgmlType::IQ4_XS> {
  using Block = quant::BlockIQ4_XS;
  static constexpr int kValues = quant::kQK_K, kBytes = sizeof(Block);
  template <typename F>
  __device__ static void values(const uint8_t* p, F f) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    const float d = half_bits(b.d);
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | ((b.scales_h >> (2 * ib)) & 3) << 4;
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        const uint8_t q = b.qs[16 * ib + j];
        f(32 * ib + j, dl * static_cast<float>(g_iq4nl_values[q & 15]));
        f(32 * ib + 16 + j, dl * static_cast<float>(g_iq4nl_values[q >> 4]));
      }
    }
  }
};

template <>
struct BlockFormat<quant::GgmlType::MXFP4> {
  using Block = quant::BlockMXFP4;
  static constexpr int kValues = quant::kQK_MXFP4, kBytes = sizeof(Block);
  template <typename F>
  __device__ static void values(const uint8_t* p, F f) {
    const Block& b = *reinterpret_cast<const Block*>(p);
    // E8M0 times one half (the codes are E2M1 doubled), as quant::e8m0_to_fp32_half.
    const uint32_t bits = b.e < 2 ? 0x00200000u << b.e : static_cast<uint32_t>(b.e - 1) << 23;
    const float d = __uint_as_float(bits);
    for (int j = 0; j < kValues / 2; ++j) {
      f(j, d * static_cast<float>(g_mxfp4_values[b.qs[j] & 15]));
      f(j + kValues / 2, d * static_cast<float>(g_mxfp4_values[b.qs[j] >> 4]));
    }
  }
};

template <quant::GgmlType kType>
__global__ void block_matmul_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
                                    int64_t ldx, int64_t n, float* y, int64_t ldy, Heads heads) {
  using Format = BlockFormat<kType>;
  select_head(heads, rows, row_bytes, w, x, y);
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const uint8_t* base = w + row * row_bytes;
  const int64_t blocks = cols / Format::kValues;
  for (int64_t t0 = 0; t0 < n; t0 += kTokensPerPass) {
    const int nt = static_cast<int>(n - t0 < kTokensPerPass ? n - t0 : kTokensPerPass);
    float acc[kTokensPerPass] = {};
    for (int64_t blk = lane; blk < blocks; blk += kWarp) {
      const float* xb = x + t0 * ldx + blk * Format::kValues;
      Format::values(base + blk * Format::kBytes, [&](int j, float v) {
        for (int t = 0; t < nt; ++t) acc[t] += v * xb[t * ldx + j];
      });
    }
    store_sums(acc, nt, lane, y + t0 * ldy + row, ldy);
  }
}

// The formats of quant/block_parts.h: one warp per weight row, the lanes sharing blocks. A 256-value block is one
// warp step (lane l decodes part l), a 32-value block a quarter of one (8 blocks a step), so each step reads
// consecutive weight bytes and 256 consecutive activations per token across the warp, and every lane works whatever
// the row's block count (the per-block kernel above left 24 of 32 lanes idle on a 2048-value K-quant row).
template <quant::GgmlType kType>
__global__ void parts_matmul_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
                                    int64_t ldx, bool aligned, int64_t n, float* y, int64_t ldy, Heads heads) {
  using Parts = quant::BlockParts<kType>;
  select_head(heads, rows, row_bytes, w, x, y);
  constexpr int kParts = Parts::kValues / 8, kBlocksPerStep = kWarp / kParts;
  static_assert(kWarp % kParts == 0);
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const uint8_t* base = w + row * row_bytes;
  const int64_t blocks = cols / Parts::kValues;
  const int part = lane % kParts;
  for (int64_t t0 = 0; t0 < n; t0 += kTokensPerPass) {
    const int nt = static_cast<int>(n - t0 < kTokensPerPass ? n - t0 : kTokensPerPass);
    float acc[kTokensPerPass] = {};
    for (int64_t blk = lane / kParts; blk < blocks; blk += kBlocksPerStep) {
      float v[8];
      Parts::part(base + blk * Parts::kBytes, part, v);
      const float* xp = x + t0 * ldx + blk * Parts::kValues + 8 * part;
#pragma unroll
      for (int t = 0; t < kTokensPerPass; ++t) {
        if (t >= nt) break;
        float xv[8];
        load8(xp + t * ldx, aligned, xv);
        float sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) sum += v[i] * xv[i];
        acc[t] += sum;
      }
    }
    store_sums(acc, nt, lane, y + t0 * ldy + row, ldy);
  }
}

// Dequantization into F32 rows for the batched path: one thread per block (GGUF) or per 32-value unit (low-bit).
template <quant::GgmlType kType>
__global__ void dequantize_blocks_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t row_bytes, float* out) {
  using Format = BlockFormat<kType>;
  const int64_t per_row = cols / Format::kValues;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * per_row) return;
  const int64_t r = i / per_row, blk = i % per_row;
  float* o = out + r * cols + blk * Format::kValues;
  Format::values(w + r * row_bytes + blk * Format::kBytes, [&](int j, float v) { o[j] = v; });
}

template <int kBits>
__global__ void dequantize_lowbit_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t row_bytes, int group,
                                         float* out) {
  const int64_t units = cols / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * units) return;
  const int64_t r = i / units, u = i % units;
  const uint8_t* base = w + r * row_bytes;
  const auto* words = reinterpret_cast<const uint32_t*>(base);
  const quant::LowBitRowParts parts = quant::lowbit_row_parts(kBits, group, cols);
  const auto* scales = reinterpret_cast<const __half*>(base + parts.scales);
  const auto* offsets = reinterpret_cast<const __half*>(base + parts.offsets);
  const int64_t g = u * 32 / group;
  const float d = __half2float(scales[g]), m = __half2float(offsets[g]);
  float* o = out + r * cols + u * 32;
  for (int j = 0; j < 32; ++j) {
    const int q = quant::lowbit_code<kBits>(words + u * kBits, j);
    o[j] = d * static_cast<float>(q) + m;
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = gate[i] / (1.0f + __expf(-gate[i])) * up[i];
}

__global__ void add_kernel(const float* x, int64_t n, float* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void add_bias_kernel(const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < width * n_rows) y[i / width * ldy + i % width] += bias[i % width];
}

// One block per row: the mean square by a block reduction (warp shuffles, then the warps' sums in shared memory).
__global__ void rms_norm_kernel(const float* x, int64_t ldx, const float* weight, int64_t width, float eps, float* y,
                                int64_t ldy) {
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  float sum = 0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i] * xr[i];
  __shared__ float warp_sums[32];
  for (int off = kWarp / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = sum;
  __syncthreads();
  float total = 0;
  for (unsigned w = 0; w < blockDim.x / kWarp; ++w) total += warp_sums[w];
  const float scale = rsqrtf(total / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) yr[i] = weight ? xr[i] * scale * weight[i] : xr[i] * scale;
}

// One thread per rotated pair (token, head, pair).
__global__ void rope_kernel(const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride,
                            int64_t head_stride, int n_dims, bool neox) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int half = n_dims / 2;
  if (i >= n_tokens * n_heads * half) return;
  const int pair = static_cast<int>(i % half);
  const int64_t h = i / half % n_heads, t = i / half / n_heads;
  const float c = table[t * n_dims + 2 * pair], sn = table[t * n_dims + 2 * pair + 1];
  float* head = x + t * token_stride + h * head_stride;
  float* a = neox ? head + pair : head + 2 * pair;
  float* b = neox ? head + pair + half : head + 2 * pair + 1;
  const float x0 = *a, x1 = *b;
  *a = x0 * c - x1 * sn;
  *b = x0 * sn + x1 * c;
}

// Causal attention, one block per (head, token): each warp takes every kAttnWarps-th key, scores it (lanes over
// the key's values, then a shuffle sum) and keeps a running softmax (max, sum, weighted values in shared memory);
// the warps' partial results merge at the end. Shared memory: q, each warp's values, maxima and sums.
constexpr int kAttnWarps = 4;

__global__ void attention_kernel(AttentionArgs a, int64_t pos0, float* out) {
  const int64_t t = blockIdx.x;  // tokens on x: a prompt may exceed grid.y's 65535
  const int h = static_cast<int>(blockIdx.y);
  const int g = h / (a.n_head / a.n_head_kv);
  const int lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp;
  extern __shared__ float smem[];
  float* q = smem;
  float* acc = q + a.head_dim_k;
  float* maxima = acc + kAttnWarps * a.head_dim_v;
  float* sums = maxima + kAttnWarps;
  for (int i = threadIdx.x; i < a.head_dim_k; i += blockDim.x)
    q[i] = a.q[t * a.q_token_stride + h * a.q_head_stride + i];
  float* acc_w = acc + w * a.head_dim_v;
  for (int i = lane; i < a.head_dim_v; i += kWarp) acc_w[i] = 0;
  __syncthreads();
  float m = -INFINITY, l = 0;
  const int64_t n_keys = pos0 + t + 1;
  const int64_t first = a.window > 0 && n_keys > a.window ? n_keys - a.window : 0;
  const int32_t* chosen = a.keys ? a.keys + t * a.keys_per_query : nullptr;
  int64_t seen = n_keys - first;
  if (chosen) {
    seen = 0;
    while (seen < a.keys_per_query && chosen[seen] >= 0) ++seen;
  }
  // DeepSeek-V4's compressed entries after the raw keys: all visible ones, or the indexer's.
  const int32_t* picked = a.chosen ? a.chosen + t * a.chosen_per_query : nullptr;
  int64_t n_comp = a.compressed ? (pos0 + t + 1) / a.ratio : 0;
  if (picked) {
    n_comp = 0;
    while (n_comp < a.chosen_per_query && picked[n_comp] >= 0) ++n_comp;
  }
  for (int64_t idx = w; idx < seen + n_comp; idx += kAttnWarps) {
    const float* k;
    const float* v;
    if (idx < seen) {
      int64_t j = chosen ? chosen[idx] : first + idx;
      if (a.ring > 0) j %= a.ring;
      k = a.k + j * a.k_stride + static_cast<int64_t>(g) * a.head_dim_k;
      v = a.v + j * a.v_stride + static_cast<int64_t>(g) * a.head_dim_v;
    } else {
      const int64_t b = picked ? picked[idx - seen] : idx - seen;
      k = v = a.compressed + b * a.compressed_stride;
    }
    float sc = 0;
    for (int i = lane; i < a.head_dim_k; i += kWarp) sc += q[i] * k[i];
    for (int off = kWarp / 2; off > 0; off /= 2) sc += __shfl_xor_sync(0xffffffffu, sc, off);
    sc *= a.scale;
    const float m_new = fmaxf(m, sc);
    const float keep = expf(m - m_new), p = expf(sc - m_new);
    l = l * keep + p;
    for (int i = lane; i < a.head_dim_v; i += kWarp) acc_w[i] = acc_w[i] * keep + p * v[i];
    m = m_new;
  }
  if (lane == 0) {
    maxima[w] = m;
    sums[w] = l;
  }
  __syncthreads();
  float top = a.sinks ? a.sinks[h] : -INFINITY;  // a sink joins the denominator, with no value
  for (int i = 0; i < kAttnWarps; ++i)
    if (sums[i] > 0) top = fmaxf(top, maxima[i]);
  float total = a.sinks ? expf(a.sinks[h] - top) : 0.0f;
  for (int i = 0; i < kAttnWarps; ++i)
    if (sums[i] > 0) total += sums[i] * expf(maxima[i] - top);
  float* o = out + (t * a.n_head + h) * a.head_dim_v;
  for (int c = threadIdx.x; c < a.head_dim_v; c += blockDim.x) {
    float v = 0;
    for (int i = 0; i < kAttnWarps; ++i)
      if (sums[i] > 0) v += acc[i * a.head_dim_v + c] * expf(maxima[i] - top);
    o[c] = total > 0 ? v / total : 0.0f;  // no key and no sink: zeros, as the CPU
  }
}

__device__ float sigmoid_of(float x) { return 1.0f / (1.0f + expf(-x)); }

// cpu::hyper_mix, one thread per token (at most 8 streams: 80 mixes).
constexpr int kMaxStreams = 8;
__global__ void hyper_mix_kernel(HyperArgs a, const float* mix, int64_t ldm, int64_t n, float* coef) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int S = a.n_streams;
  const int nc = a.output_head ? S : (2 + S) * S;
  const float* m = mix + t * ldm;
  float* o = coef + t * nc;
  for (int h = 0; h < S; ++h) {
    const float v = __fmul_rn(m[h], a.scale[0]);
    o[h] = sigmoid_of(__fadd_rn(v, a.base[h])) + a.eps;
  }
  if (a.output_head) return;
  for (int h = 0; h < S; ++h) {
    const float v = __fmul_rn(m[S + h], a.scale[1]);
    o[S + h] = 2.0f * sigmoid_of(__fadd_rn(v, a.base[S + h]));
  }
  float c[kMaxStreams * kMaxStreams];
  for (int k = 0; k < S * S; ++k) c[k] = __fadd_rn(__fmul_rn(m[2 * S + k], a.scale[2]), a.base[2 * S + k]);
  for (int src = 0; src < S; ++src) {
    float top = -INFINITY;
    for (int dst = 0; dst < S; ++dst) top = fmaxf(top, c[dst + S * src]);
    float sum = 0.0f;
    for (int dst = 0; dst < S; ++dst) {
      c[dst + S * src] = expf(c[dst + S * src] - top);
      sum += c[dst + S * src];
    }
    const float inv = 1.0f / sum;
    for (int dst = 0; dst < S; ++dst) c[dst + S * src] = __fadd_rn(__fmul_rn(c[dst + S * src], inv), a.eps);
  }
  for (int it = 0; it < a.sinkhorn_iters; ++it) {
    if (it > 0) {
      for (int src = 0; src < S; ++src) {
        float sum = a.eps;
        for (int dst = 0; dst < S; ++dst) sum += c[dst + S * src];
        const float inv = 1.0f / sum;
        for (int dst = 0; dst < S; ++dst) c[dst + S * src] *= inv;
      }
    }
    for (int dst = 0; dst < S; ++dst) {
      float sum = a.eps;
      for (int src = 0; src < S; ++src) sum += c[dst + S * src];
      const float inv = 1.0f / sum;
      for (int src = 0; src < S; ++src) c[dst + S * src] *= inv;
    }
  }
  for (int k = 0; k < S * S; ++k) o[2 * S + k] = c[k];
}

__global__ void hyper_sum_kernel(int S, int nc, const float* coef, const float* x, int64_t width, int64_t n,
                                 float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t t = i / width, e = i % width;
  const float* c = coef + t * nc;
  float sum = 0.0f;
  for (int h = 0; h < S; ++h) sum = __fadd_rn(sum, __fmul_rn(x[(t * S + h) * width + e], c[h]));
  out[i] = sum;
}

__global__ void hyper_post_kernel(int S, int nc, const float* coef, const float* y, const float* x, int64_t width,
                                  int64_t n, float* x_new) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * S * width) return;
  const int64_t t = i / (S * width), dst = i / width % S, e = i % width;
  const float* post = coef + t * nc + S;
  const float* comb = post + S;
  float sum = __fmul_rn(y[t * width + e], post[dst]);
  for (int src = 0; src < S; ++src) sum = __fadd_rn(sum, __fmul_rn(x[(t * S + src) * width + e], comb[dst + S * src]));
  x_new[i] = sum;
}

// cpu::compress for one token: its row into the state ring (score plus ape), then, when it completes a block, the
// block's entry, a thread per channel.
__global__ void compress_kernel(CompressorArgs a, const float* kv, const float* score, int64_t ld, int64_t t, int64_t p,
                                float* state, float* entry) {
  const int64_t rw = a.overlap ? 2 * a.width : a.width, rows = a.overlap ? 2 * a.ratio : a.ratio;
  float* row = state + (p % rows) * 2 * rw;
  const float* ape = a.ape + (p % a.ratio) * rw;
  for (int64_t j = threadIdx.x; j < rw; j += blockDim.x) {
    row[j] = kv[t * ld + j];
    row[rw + j] = score[t * ld + j] + ape[j];
  }
  if (!entry) return;
  __syncthreads();
  const int64_t r = a.ratio, start = p + 1 - r, n_pos = a.overlap ? 2 * r : r;
  for (int64_t j = threadIdx.x; j < a.width; j += blockDim.x) {
    auto at = [&](int64_t i, float* val) -> float {
      const int64_t q = a.overlap ? start - r + i : start + i;
      if (q < 0) {
        *val = 0.0f;
        return -INFINITY;
      }
      const float* src = state + (q % rows) * 2 * rw;
      const int64_t ch = a.overlap && i >= r ? a.width + j : j;
      *val = src[ch];
      return src[rw + ch];
    };
    float top = -INFINITY, val;
    for (int64_t i = 0; i < n_pos; ++i) top = fmaxf(top, at(i, &val));
    double sum = 0;
    for (int64_t i = 0; i < n_pos; ++i) sum += expf(at(i, &val) - top);
    const float inv = static_cast<float>(1.0 / sum);
    double acc = 0;
    for (int64_t i = 0; i < n_pos; ++i) {
      const float w = expf(at(i, &val) - top);
      acc += __fmul_rn(val, __fmul_rn(w, inv));
    }
    entry[j] = static_cast<float>(acc);
  }
}

// The router's choice, one thread per token, in cpu::select_experts' order of operations (softmax sums in double).
// Selection ties go to the lower id: a scan in id order that replaces its best only on a strictly larger score.
__global__ void select_experts_kernel(SelectionArgs a, float* logits, const float* bias, int64_t n, int32_t* ids,
                                      float* weights) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float* p = logits + t * a.n_expert;
  const int64_t ne = a.n_expert;
  if (a.sigmoid) {
    for (int64_t e = 0; e < ne; ++e) p[e] = 1.0f / (1.0f + expf(-p[e]));
  } else {
    float top = -INFINITY;
    for (int64_t e = 0; e < ne; ++e) top = fmaxf(top, p[e]);
    double sum = 0;
    for (int64_t e = 0; e < ne; ++e) {
      p[e] = expf(p[e] - top);
      sum += p[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t e = 0; e < ne; ++e) p[e] *= inv;
  }
  float sel[kMaxSelectionExperts];
  for (int64_t e = 0; e < ne; ++e) sel[e] = bias ? p[e] + bias[e] : p[e];
  // The k best of v[0 .. count) by the rule above, skipping those already taken (bit i of taken).
  auto best_of = [](const float* v, int64_t count, const uint32_t* taken) {
    int64_t best = -1;
    for (int64_t e = 0; e < count; ++e)
      if (!((taken[e / 32] >> (e % 32)) & 1) && (best < 0 || v[e] > v[best])) best = e;
    return best;
  };
  uint32_t taken[kMaxSelectionExperts / 32] = {};
  if (a.n_group > 1) {
    const int64_t per_group = ne / a.n_group;
    float group_score[64];
    uint32_t none[kMaxSelectionExperts / 32] = {};
    for (int64_t g = 0; g < a.n_group; ++g) {
      const float* s = sel + g * per_group;
      const int64_t first = best_of(s, per_group, none);
      float score = s[first];
      if (per_group > 1) {
        uint32_t one[kMaxSelectionExperts / 32] = {};
        one[first / 32] |= 1u << (first % 32);
        score += s[best_of(s, per_group, one)];
      }
      group_score[g] = score;
    }
    uint32_t kept[2] = {};  // groups chosen so far (at most 64)
    for (int64_t i = 0; i < a.n_group_used; ++i) {
      const int64_t g = best_of(group_score, a.n_group, kept);
      kept[g / 32] |= 1u << (g % 32);
    }
    for (int64_t g = 0; g < a.n_group; ++g)
      if (!((kept[g / 32] >> (g % 32)) & 1))
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) sel[e] = -INFINITY;
  }
  int32_t* id = ids + t * a.n_used;
  float* w = weights + t * a.n_used;
  for (int64_t i = 0; i < a.n_used; ++i) {
    const int64_t e = best_of(sel, ne, taken);
    taken[e / 32] |= 1u << (e % 32);
    id[i] = static_cast<int32_t>(e);
    w[i] = p[e];
  }
  if (a.norm) {
    float sum = 0;
    for (int64_t i = 0; i < a.n_used; ++i) sum += w[i];
    sum = fmaxf(sum, 6.103515625e-5f);
    for (int64_t i = 0; i < a.n_used; ++i) w[i] /= sum;
  }
  if (a.scale != 0.0f && a.scale != 1.0f)
    for (int64_t i = 0; i < a.n_used; ++i) w[i] *= a.scale;
}

__global__ void gather_rows_kernel(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  dst[i] = src[static_cast<int64_t>(rows[i / width]) * width + i % width];
}

__global__ void combine_rows_kernel(const float* src, int64_t width, const int32_t* index, const float* weights,
                                    int64_t n, int64_t k, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t t = i / width, c = i % width;
  float v = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t row = index[t * k + j];
    if (row >= 0) v += weights[t * k + j] * src[static_cast<int64_t>(row) * width + c];
  }
  dst[i] = v;
}

unsigned blocks_for(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return p.name;
}

size_t total_memory(int device) {
  set_device(device);
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total;
}

size_t free_memory(int device) {
  set_device(device);
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

namespace {

// Device memory comes from the device's stream-ordered pool (CUDA 11.2+) where the device has one: released blocks
// stay in the pool (release threshold: never) and serve later requests without a driver allocation or the
// device-wide synchronization of cudaFree. Callers release only memory no queued work uses, so allocation and release
// are ordered on the legacy default stream and waited for. Without pool support: cudaMalloc / cudaFree.
bool uses_pool() {
  int device = 0, supported = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess || !supported) {
    cudaGetLastError();
    return false;
  }
  static std::mutex mutex;
  static std::map<int, bool> configured;
  std::lock_guard lock(mutex);
  if (!configured[device]) {
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
    uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
    configured[device] = true;
  }
  return true;
}

}  // namespace

void* malloc_device(size_t bytes) {
  void* p = nullptr;
  if (!uses_pool()) {
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  check(cudaMallocAsync(&p, bytes, nullptr), "cudaMallocAsync");
  check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
  return p;
}
void free_device(void* ptr) {
  if (!uses_pool()) return check(cudaFree(ptr), "cudaFree");
  // As cudaFree would: nothing queued on any stream may still use the block the pool hands out next.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(cudaFreeAsync(ptr, nullptr), "cudaFreeAsync");
  check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}
void* malloc_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes), "cudaMallocHost");
  return p;
}
void free_pinned(void* ptr) { check(cudaFreeHost(ptr), "cudaFreeHost"); }

Stream create_stream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void destroy_stream(Stream s) { check(cudaStreamDestroy(stream_of(s)), "cudaStreamDestroy"); }
void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(s)), "cudaMemcpyAsync to device");
}
void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream s) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(s)), "cudaMemcpyAsync to host");
}
EventHandle create_event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}
void destroy_event(EventHandle e) { check(cudaEventDestroy(static_cast<cudaEvent_t>(e)), "cudaEventDestroy"); }
void record_event(EventHandle e, Stream s) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(e), stream_of(s)), "cudaEventRecord");
}
void stream_wait_event(Stream s, EventHandle e) {
  check(cudaStreamWaitEvent(stream_of(s), static_cast<cudaEvent_t>(e), 0), "cudaStreamWaitEvent");
}
void event_synchronize(EventHandle e) {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
}
bool event_query(EventHandle e) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(e));
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaEventQuery");
  return true;
}
double event_elapsed(EventHandle from, EventHandle to) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)),
        "cudaEventElapsedTime");
  return ms * 1e-3;
}
void stream_synchronize(Stream s) { check(cudaStreamSynchronize(stream_of(s)), "cudaStreamSynchronize"); }
void launch_host_func(Stream s, void (*fn)(void*), void* arg) {
  check(cudaLaunchHostFunc(stream_of(s), fn, arg), "cudaLaunchHostFunc");
}

namespace {

// Batches of kGemmMinTokens rows or more: the weights are dequantized to F32 in chunks of rows into a workspace of
// the stream and multiplied by cuBLAS SGEMM (the per-row kernels above re-read every weight row once per
// kTokensPerPass tokens). One cuBLAS handle and one workspace per stream.
constexpr int64_t kGemmMinTokens = 16;
constexpr int64_t kWorkspaceFloats = int64_t{32} << 20;  // 128 MB of F32 rows per chunk at most

struct StreamGemm {
  cublasHandle_t handle = nullptr;
  float* workspace = nullptr;
  int64_t floats = 0;
};

StreamGemm& gemm_of(Stream s) {
  static std::mutex mutex;
  static std::map<Stream, StreamGemm> all;
  std::lock_guard lock(mutex);
  StreamGemm& g = all[s];
  if (!g.handle) {
    if (cublasCreate(&g.handle) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuBLAS: cublasCreate failed");
    if (cublasSetStream(g.handle, stream_of(s)) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("cuBLAS: cublasSetStream failed");
  }
  return g;
}

// y[t * ldy + r] = W.row(r) . x[t * ldx ...] through chunks of dequantized rows, for each of heads.count heads (head
// h: rows h * rows .., activations x + h * x_stride, outputs y + h * y_stride); `dequantize(r0, count, out)` queues
// the F32 rows [r0, r0 + count) of the whole matrix into out.
template <typename Dequantize>
void gemm_by_chunks(int64_t rows, int64_t cols, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                    const Heads& heads, Stream s, Dequantize dequantize) {
  StreamGemm& g = gemm_of(s);
  const int64_t chunk = std::max<int64_t>(1, std::min(rows, kWorkspaceFloats / cols));
  if (g.floats < chunk * cols) {
    check(cudaStreamSynchronize(stream_of(s)), "cudaStreamSynchronize");  // the old workspace may be in use
    if (g.workspace) free_device(g.workspace);
    g.workspace = nullptr;
    g.workspace = static_cast<float*>(malloc_device(chunk * cols * sizeof(float)));
    g.floats = chunk * cols;
  }
  const float one = 1.0f, zero = 0.0f;
  for (int64_t h = 0; h < heads.count; ++h)
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t count = std::min(chunk, rows - r0);
      dequantize(h * rows + r0, count, g.workspace);
      // Row-major W (count x cols), x (n x cols), y (n x count) are column-major W^T, x^T, y^T: y^T = W x^T.
      const cublasStatus_t st =
          cublasSgemm(g.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(count), static_cast<int>(n),
                      static_cast<int>(cols), &one, g.workspace, static_cast<int>(cols), x + h * heads.x_stride,
                      static_cast<int>(ldx), &zero, y + h * heads.y_stride + r0, static_cast<int>(ldy));
      if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuBLAS: cublasSgemm failed");
    }
}

}  // namespace

namespace {

// grid.y carries the head: at most 65535 of them.
void check_heads(const Heads& heads) {
  if (heads.count < 0 || heads.count > 65535)
    throw std::runtime_error("matmul over " + std::to_string(heads.count) + " heads: one launch takes 1 to 65535");
}

}  // namespace

void lowbit_matmul(int bits, int group, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
                   int64_t ldx, int64_t n, float* y, int64_t ldy, Stream s, const Heads& heads) {
  if (rows == 0 || n == 0 || heads.count == 0) return;
  check_heads(heads);
  if (bits < 2 || bits > 4) throw std::runtime_error("lowbit_matmul: bits must be 2, 3 or 4");
  const auto* wb = static_cast<const uint8_t*>(w);
  if (n >= kGemmMinTokens) {
    return gemm_by_chunks(rows, cols, x, ldx, n, y, ldy, heads, s, [&](int64_t r0, int64_t count, float* out) {
      const uint8_t* first = wb + r0 * row_bytes;
      const unsigned g = blocks_for(count * (cols / 32), 256);
      if (bits == 2)
        dequantize_lowbit_kernel<2><<<g, 256, 0, stream_of(s)>>>(first, count, cols, row_bytes, group, out);
      if (bits == 3)
        dequantize_lowbit_kernel<3><<<g, 256, 0, stream_of(s)>>>(first, count, cols, row_bytes, group, out);
      if (bits == 4)
        dequantize_lowbit_kernel<4><<<g, 256, 0, stream_of(s)>>>(first, count, cols, row_bytes, group, out);
      check(cudaGetLastError(), "dequantize_lowbit launch");
    });
  }
  const dim3 grid(blocks_for(rows, kWarpsPerBlock), static_cast<unsigned>(heads.count));
  const bool aligned = aligned8(x, ldx, heads);
  const auto launch = [&](auto kernel) {
    kernel<<<grid, kWarp * kWarpsPerBlock, 0, stream_of(s)>>>(wb, rows, cols, row_bytes, group, x, ldx, aligned, n, y,
                                                              ldy, heads);
  };
  if (bits == 2) launch(lowbit_matmul_kernel<2>);
  if (bits == 3) launch(lowbit_matmul_kernel<3>);
  if (bits == 4) launch(lowbit_matmul_kernel<4>);
  check(cudaGetLastError(), "lowbit_matmul launch");
}

namespace {

// f(std::integral_constant<GgmlType, type>{}) for the block formats the kernels take; false for any other type.
template <typename F>
bool with_block_format(quant::GgmlType type, F&& f) {
  using quant::GgmlType;
  switch (type) {
    case GgmlType::F32:
      return f(std::integral_constant<GgmlType, GgmlType::F32>{}), true;
    case GgmlType::F16:
      return f(std::integral_constant<GgmlType, GgmlType::F16>{}), true;
    case GgmlType::Q5_0:
      return f(std::integral_constant<GgmlType, GgmlType::Q5_0>{}), true;
    case GgmlType::Q8_0:
      return f(std::integral_constant<GgmlType, GgmlType::Q8_0>{}), true;
    case GgmlType::Q4_K:
      return f(std::integral_constant<GgmlType, GgmlType::Q4_K>{}), true;
    case GgmlType::Q6_K:
      return f(std::integral_constant<GgmlType, GgmlType::Q6_K>{}), true;
    case GgmlType::IQ2_XXS:
      return f(std::integral_constant<GgmlType, GgmlType::IQ2_XXS>{}), true;
    case GgmlType::IQ3_XXS:
      return f(std::integral_constant<GgmlType, GgmlType::IQ3_XXS>{}), true;
    case GgmlType::IQ4_XS:
      return f(std::integral_constant<GgmlType, GgmlType::IQ4_XS>{}), true;
    case GgmlType::MXFP4:
      return f(std::integral_constant<GgmlType, GgmlType::MXFP4>{}), true;
    default:
      return false;
  }
}

// The IQ grids into the current device's global memory, once per device.
void upload_iq_grids() {
  static std::mutex mutex;
  static bool done[64] = {};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  if (device < 0 || device >= 64) throw std::runtime_error("IQ grid upload: device index out of range");
  if (done[device]) return;
  check(cudaMemcpyToSymbol(g_iq2xxs_grid, quant::iq2xxs_grid, sizeof quant::iq2xxs_grid), "IQ2_XXS grid upload");
  check(cudaMemcpyToSymbol(g_iq3xxs_grid, quant::iq3xxs_grid, sizeof quant::iq3xxs_grid), "IQ3_XXS grid upload");
  // The copies run on the legacy stream, which the non-blocking streams of the kernels do not wait for.
  check(cudaDeviceSynchronize(), "IQ grid upload");
  done[device] = true;
}

}  // namespace

bool block_matmul_supports(quant::GgmlType type) {
  return with_block_format(type, [](auto) {});
}

void block_matmul(quant::GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
                  int64_t ldx, int64_t n, float* y, int64_t ldy, Stream s, const Heads& heads) {
  if (!block_matmul_supports(type)) throw std::runtime_error("block_matmul: a weight type without a kernel");
  if (rows == 0 || n == 0 || heads.count == 0) return;
  check_heads(heads);
  if (type == quant::GgmlType::IQ2_XXS || type == quant::GgmlType::IQ3_XXS) upload_iq_grids();
  const auto* wb = static_cast<const uint8_t*>(w);
  if (n >= kGemmMinTokens) {
    return gemm_by_chunks(rows, cols, x, ldx, n, y, ldy, heads, s, [&](int64_t r0, int64_t count, float* out) {
      const uint8_t* first = wb + r0 * row_bytes;
      with_block_format(type, [&](auto format) {
        constexpr quant::GgmlType kType = decltype(format)::value;
        const int64_t blocks = count * (cols / BlockFormat<kType>::kValues);
        dequantize_blocks_kernel<kType>
            <<<blocks_for(blocks, 256), 256, 0, stream_of(s)>>>(first, count, cols, row_bytes, out);
      });
      check(cudaGetLastError(), "dequantize_blocks launch");
    });
  }
  const dim3 grid(blocks_for(rows, kWarpsPerBlock), static_cast<unsigned>(heads.count));
  const unsigned threads = kWarp * kWarpsPerBlock;
  const bool aligned = aligned8(x, ldx, heads);
  with_block_format(type, [&](auto format) {
    constexpr quant::GgmlType kType = decltype(format)::value;
    if constexpr (quant::kHasBlockParts<kType>) {
      if (cols % quant::BlockParts<kType>::kValues == 0)
        return parts_matmul_kernel<kType>
            <<<grid, threads, 0, stream_of(s)>>>(wb, rows, cols, row_bytes, x, ldx, aligned, n, y, ldy, heads);
    }
    block_matmul_kernel<kType><<<grid, threads, 0, stream_of(s)>>>(wb, rows, cols, row_bytes, x, ldx, n, y, ldy, heads);
  });
  check(cudaGetLastError(), "block_matmul launch");
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out, Stream s) {
  if (n == 0) return;
  silu_mul_kernel<<<blocks_for(n, 256), 256, 0, stream_of(s)>>>(gate, up, n, out);
  check(cudaGetLastError(), "silu_mul launch");
}

void add(const float* x, int64_t n, float* y, Stream s) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256), 256, 0, stream_of(s)>>>(x, n, y);
  check(cudaGetLastError(), "add launch");
}

// One block per row: mean and variance by block reductions, then (x - mean) / sqrt(var + eps) * weight + bias.
__global__ void layer_norm_kernel(const float* x, int64_t ldx, const float* weight, const float* bias, int64_t width,
                                  float eps, float* y, int64_t ldy) {
  const float* xr = x + blockIdx.x * ldx;
  float* yr = y + blockIdx.x * ldy;
  __shared__ float partial[32];
  auto block_sum = [&](float v) {
    for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = v;
    __syncthreads();
    float total = 0;
    for (int i = 0; i < static_cast<int>(blockDim.x / kWarp); ++i) total += partial[i];
    __syncthreads();
    return total;
  };
  float sum = 0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i];
  const float mean = block_sum(sum) / static_cast<float>(width);
  float sq = 0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sq += (xr[i] - mean) * (xr[i] - mean);
  const float inv = rsqrtf(block_sum(sq) / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    yr[i] = (xr[i] - mean) * inv * (weight ? weight[i] : 1.0f) + (bias ? bias[i] : 0.0f);
}

// One block per token: every visible position's score in shared memory, then the top_k one pick at a time, each pick
// a block-wide argmax (the lower position on ties) over the positions not taken yet (taken: -inf). A pick that finds
// nothing left (only non-finite scores) ends the query's list with -1s.
constexpr int kIndexerThreads = 256;

__global__ void indexer_kernel(IndexerArgs a, int64_t pos0, int32_t* selected) {
  const int64_t t = blockIdx.x;
  const int64_t visible = (pos0 + t + 1) / a.ratio;
  extern __shared__ float scores[];
  __shared__ float best_score[kIndexerThreads];
  __shared__ int64_t best_pos[kIndexerThreads];
  for (int64_t p = threadIdx.x; p < visible; p += blockDim.x) {
    float sum = 0;
    for (int h = 0; h < a.n_head; ++h) {
      const float* q = a.q + (t * a.n_head + h) * a.dim;
      const float* k = a.k + p * a.k_stride;
      float qk = 0;
      for (int i = 0; i < a.dim; ++i) qk += q[i] * k[i];
      sum += a.w[t * a.n_head + h] * fmaxf(qk, 0.0f);
    }
    scores[p] = sum * a.w_scale;
  }
  __syncthreads();
  int32_t* out = selected + t * a.top_k;
  const int64_t keep = visible < a.top_k ? visible : a.top_k;
  int64_t r = 0;
  for (; r < keep; ++r) {
    float s = -INFINITY;
    int64_t at = -1;
    for (int64_t p = threadIdx.x; p < visible; p += blockDim.x)
      if (scores[p] > s) {  // strictly larger: the first (lowest) position of a tie within this thread's stride
        s = scores[p];
        at = p;
      }
    best_score[threadIdx.x] = s;
    best_pos[threadIdx.x] = at;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) {
        const float o = best_score[threadIdx.x + half];
        const int64_t op = best_pos[threadIdx.x + half];
        if (op >= 0 && (best_pos[threadIdx.x] < 0 || o > best_score[threadIdx.x] ||
                        (o == best_score[threadIdx.x] && op < best_pos[threadIdx.x]))) {
          best_score[threadIdx.x] = o;
          best_pos[threadIdx.x] = op;
        }
      }
      __syncthreads();
    }
    const int64_t pick = best_pos[0];
    if (pick < 0) break;  // the same in every thread: nothing finite left
    if (threadIdx.x == 0) {
      out[r] = static_cast<int32_t>(pick);
      scores[pick] = -INFINITY;
    }
    __syncthreads();
  }
  for (int64_t i = r + threadIdx.x; i < a.top_k; i += blockDim.x) out[i] = -1;
}

void add_bias(const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy, Stream s) {
  if (width == 0 || n_rows == 0) return;
  add_bias_kernel<<<blocks_for(width * n_rows, 256), 256, 0, stream_of(s)>>>(bias, width, n_rows, y, ldy);
  check(cudaGetLastError(), "add_bias launch");
}

void layer_norm(const float* x, int64_t ldx, const float* weight, const float* bias, int64_t n_rows, int64_t width,
                float eps, float* y, int64_t ldy, Stream s) {
  if (n_rows == 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(n_rows), 256, 0, stream_of(s)>>>(x, ldx, weight, bias, width, eps, y, ldy);
  check(cudaGetLastError(), "layer_norm launch");
}

void indexer_select(const IndexerArgs& a, int64_t n_tokens, int64_t pos0, int32_t* selected, Stream s) {
  if (n_tokens == 0) return;
  const size_t shared = static_cast<size_t>((pos0 + n_tokens) / a.ratio + 1) * sizeof(float);
  // 48 KB per block, less the 3 KB of the pick's reduction arrays.
  if (shared > 45 * 1024)
    throw std::runtime_error("indexer_select: the CUDA kernel scores up to 11520 positions, the context has " +
                             std::to_string(pos0 + n_tokens));
  indexer_kernel<<<static_cast<unsigned>(n_tokens), kIndexerThreads, shared, stream_of(s)>>>(a, pos0, selected);
  check(cudaGetLastError(), "indexer launch");
}

void rms_norm(const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width, float eps, float* y,
              int64_t ldy, Stream s) {
  if (n_rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(n_rows), 256, 0, stream_of(s)>>>(x, ldx, weight, width, eps, y, ldy);
  check(cudaGetLastError(), "rms_norm launch");
}

void rope(const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
          int n_dims, bool neox, Stream s) {
  const int64_t pairs = n_tokens * n_heads * (n_dims / 2);
  if (pairs == 0) return;
  rope_kernel<<<blocks_for(pairs, 256), 256, 0, stream_of(s)>>>(table, x, n_tokens, n_heads, token_stride, head_stride,
                                                                n_dims, neox);
  check(cudaGetLastError(), "rope launch");
}

void attention(const AttentionArgs& a, int64_t n_tokens, int64_t pos0, float* out, Stream s) {
  if (n_tokens == 0) return;
  const size_t shared = (a.head_dim_k + kAttnWarps * a.head_dim_v + 2 * kAttnWarps) * sizeof(float);
  // At most (576 + 4 x 512 + 8) floats (MLA's latent head): 10.5 KB, within the default 48 KB.
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(a.n_head));
  attention_kernel<<<grid, kWarp * kAttnWarps, shared, stream_of(s)>>>(a, pos0, out);
  check(cudaGetLastError(), "attention launch");
}

void hyper_pre(const HyperArgs& a, const float* mix, int64_t ldm, const float* x, int64_t width, int64_t n, float* coef,
               float* out, Stream s) {
  if (n == 0) return;
  if (a.n_streams < 1 || a.n_streams > kMaxStreams) throw std::runtime_error("hyper_pre: 1 to 8 streams");
  const int nc = a.output_head ? a.n_streams : (2 + a.n_streams) * a.n_streams;
  hyper_mix_kernel<<<blocks_for(n, 64), 64, 0, stream_of(s)>>>(a, mix, ldm, n, coef);
  check(cudaGetLastError(), "hyper_mix launch");
  hyper_sum_kernel<<<blocks_for(n * width, 256), 256, 0, stream_of(s)>>>(a.n_streams, nc, coef, x, width, n, out);
  check(cudaGetLastError(), "hyper_pre launch");
}

void hyper_post(const HyperArgs& a, const float* coef, const float* y, const float* x, int64_t width, int64_t n,
                float* x_new, Stream s) {
  if (n == 0) return;
  const int nc = (2 + a.n_streams) * a.n_streams;
  hyper_post_kernel<<<blocks_for(n * a.n_streams * width, 256), 256, 0, stream_of(s)>>>(a.n_streams, nc, coef, y, x,
                                                                                        width, n, x_new);
  check(cudaGetLastError(), "hyper_post launch");
}

void compress(const CompressorArgs& a, const float* kv, const float* score, int64_t ld, int64_t n, int64_t pos0,
              float* state, float* out, Stream s) {
  // One launch per token: a block pools rows that earlier tokens of the batch wrote (a batch completes a block every
  // `ratio` tokens; prefill launches are cheap next to the batch's products).
  int64_t written = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = pos0 + t;
    float* entry = (p + 1) % a.ratio == 0 ? out + (written++) * a.width : nullptr;
    compress_kernel<<<1, 256, 0, stream_of(s)>>>(a, kv, score, ld, t, p, state, entry);
    check(cudaGetLastError(), "compress launch");
  }
}

void select_experts(const SelectionArgs& a, float* logits, const float* bias, int64_t n, int32_t* ids, float* weights,
                    Stream s) {
  if (n == 0) return;
  if (a.n_expert > kMaxSelectionExperts || a.n_group > 64 || a.n_used > a.n_expert)
    throw std::runtime_error("select_experts: at most 512 experts in at most 64 groups");
  select_experts_kernel<<<blocks_for(n, 64), 64, 0, stream_of(s)>>>(a, logits, bias, n, ids, weights);
  check(cudaGetLastError(), "select_experts launch");
}

void copy_rows(const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst, int64_t ldd, Stream s) {
  if (n_rows == 0 || width == 0) return;
  check(cudaMemcpy2DAsync(dst, ldd * sizeof(float), src, lds * sizeof(float), width * sizeof(float), n_rows,
                          cudaMemcpyDeviceToDevice, stream_of(s)),
        "cudaMemcpy2DAsync");
}

void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst, Stream s) {
  if (n * width == 0) return;
  gather_rows_kernel<<<blocks_for(n * width, 256), 256, 0, stream_of(s)>>>(src, width, rows, n, dst);
  check(cudaGetLastError(), "gather_rows launch");
}

void combine_rows(const float* src, int64_t width, const int32_t* index, const float* weights, int64_t n, int64_t k,
                  float* dst, Stream s) {
  if (n * width == 0) return;
  combine_rows_kernel<<<blocks_for(n * width, 256), 256, 0, stream_of(s)>>>(src, width, index, weights, n, k, dst);
  check(cudaGetLastError(), "combine_rows launch");
}

namespace {

// The sum of `v` over a block of up to 1024 threads, on every thread (warp shuffles, then the warps' sums).
__device__ float block_sum(float v, float* warp_sums) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();  // warp_sums may still be read by an earlier call
  if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = v;
  __syncthreads();
  float total = 0;
  for (unsigned w = 0; w < (blockDim.x + kWarp - 1) / kWarp; ++w) total += warp_sums[w];
  return total;
}

constexpr int kMaxConvWidth = 16;

// One thread per channel, the tokens in order; the taps' window lives in registers.
__global__ void short_conv_silu_kernel(const float* weight, int64_t channels, int width, const float* x, int64_t ldx,
                                       int64_t n, float* state, float* y, int64_t ldy) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int back = width - 1;
  float window[kMaxConvWidth];
  for (int r = 0; r < back; ++r) window[r] = state[r * channels + c];
  const float* w = weight + c * width;
  for (int64_t t = 0; t < n; ++t) {
    window[back] = x[t * ldx + c];
    float sum = 0;
    for (int k = 0; k < width; ++k) sum += window[k] * w[k];
    y[t * ldy + c] = sum / (1.0f + expf(-sum));
    for (int k = 0; k < back; ++k) window[k] = window[k + 1];
  }
  for (int r = 0; r < back; ++r) state[r * channels + c] = window[r];
}

// One block per value head, thread j owning row j of the head's state (S[j][i] over key index i).
__global__ void gated_delta_net_kernel(DeltaNetArgs a, int64_t n, float* state, float* out, int64_t ldo) {
  extern __shared__ float shared[];
  const int64_t D = a.head_dim, h = blockIdx.x, kh = h % a.n_k_heads, j = threadIdx.x;
  float* q = shared;
  float* k = q + D;
  float* warp_sums = k + D;
  float* S = state + h * D * D + j * D;
  const float norm_eps = a.eps / static_cast<float>(D), norm_scale = rsqrtf(static_cast<float>(D));
  for (int64_t t = 0; t < n; ++t) {
    const float* row = a.qkv + t * a.ld_qkv;
    const float qj = row[kh * D + j], kj = row[(a.n_k_heads + kh) * D + j];
    const float q_scale = 1.0f / sqrtf(block_sum(qj * qj, warp_sums) / static_cast<float>(D) + norm_eps);
    const float k_scale = 1.0f / sqrtf(block_sum(kj * kj, warp_sums) / static_cast<float>(D) + norm_eps);
    q[j] = qj * q_scale * norm_scale;
    k[j] = kj * k_scale * norm_scale;
    __syncthreads();
    const float beta = 1.0f / (1.0f + expf(-a.beta[t * a.ld_gates + h]));
    const float x = a.alpha[t * a.ld_gates + h] + a.dt_bias[h];
    const float decay = expf((x > 20.0f ? x : logf(1.0f + expf(x))) * a.a[h]);
    float sk = 0;
    for (int64_t i = 0; i < D; ++i) {
      S[i] *= decay;
      sk += S[i] * k[i];
    }
    const float delta = (row[2 * a.n_k_heads * D + h * D + j] - sk) * beta;
    float o = 0;
    for (int64_t i = 0; i < D; ++i) {
      S[i] += k[i] * delta;
      o += S[i] * q[i];
    }
    out[t * ldo + h * D + j] = o * norm_scale;
    __syncthreads();  // q and k are rewritten for the next token
  }
}

// One block per row: rms_norm(x) * weight * silu(z).
__global__ void gated_rms_norm_kernel(const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz,
                                      int64_t width, float eps, float* y, int64_t ldy) {
  __shared__ float warp_sums[32];
  const float* xr = x + blockIdx.x * ldx;
  const float* zr = z + blockIdx.x * ldz;
  float* yr = y + blockIdx.x * ldy;
  float sum = 0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i] * xr[i];
  const float scale = rsqrtf(block_sum(sum, warp_sums) / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float g = zr[i];
    yr[i] = xr[i] * scale * weight[i] * (g / (1.0f + expf(-g)));
  }
}

__global__ void sigmoid_mul_kernel(const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y,
                                   int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * width) return;
  const int64_t r = i / width, c = i % width;
  y[r * ldy + c] *= 1.0f / (1.0f + expf(-gate[r * ldg + c]));
}

}  // namespace

void short_conv_silu(const float* weight, int64_t channels, int width, const float* x, int64_t ldx, int64_t n,
                     float* state, float* y, int64_t ldy, Stream s) {
  if (width < 1 || width > kMaxConvWidth) throw std::runtime_error("short_conv_silu: at most 16 taps");
  if (n == 0 || channels == 0) return;
  short_conv_silu_kernel<<<blocks_for(channels, 128), 128, 0, stream_of(s)>>>(weight, channels, width, x, ldx, n, state,
                                                                              y, ldy);
  check(cudaGetLastError(), "short_conv_silu launch");
}

void gated_delta_net(const DeltaNetArgs& a, int64_t n, float* state, float* out, int64_t ldo, Stream s) {
  if (a.head_dim < kWarp || a.head_dim > 1024 || a.head_dim % kWarp != 0)
    throw std::runtime_error("gated_delta_net: head_dim must be a multiple of 32 up to 1024");
  if (n == 0 || a.n_v_heads == 0) return;
  const size_t shared = (2 * a.head_dim + 32) * sizeof(float);
  gated_delta_net_kernel<<<static_cast<unsigned>(a.n_v_heads), static_cast<unsigned>(a.head_dim), shared,
                           stream_of(s)>>>(a, n, state, out, ldo);
  check(cudaGetLastError(), "gated_delta_net launch");
}

void gated_rms_norm(const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz, int64_t n_rows,
                    int64_t width, float eps, float* y, int64_t ldy, Stream s) {
  if (n_rows == 0) return;
  gated_rms_norm_kernel<<<static_cast<unsigned>(n_rows), 128, 0, stream_of(s)>>>(x, ldx, weight, z, ldz, width, eps, y,
                                                                                 ldy);
  check(cudaGetLastError(), "gated_rms_norm launch");
}

void sigmoid_mul(const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y, int64_t ldy, Stream s) {
  if (n_rows * width == 0) return;
  sigmoid_mul_kernel<<<blocks_for(n_rows * width, 256), 256, 0, stream_of(s)>>>(gate, ldg, n_rows, width, y, ldy);
  check(cudaGetLastError(), "sigmoid_mul launch");
}

}  // namespace hetmoe::gpu
