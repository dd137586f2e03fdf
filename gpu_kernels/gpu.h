#pragma once

// The CUDA side of hetmoe as a plain C++ API (no CUDA types here, so the adapter compiles without nvcc): device
// memory, pinned staging memory, streams, events, host callbacks, and the kernels the GPU tier runs. Knows nothing
// of models or of the Device interface (runtime/device/cuda_device.cpp adapts it); takes the weight layouts from
// quant/. Built only when a CUDA toolkit is found, into the shared library loaded at run time for --device cuda.
// Every call fails with std::runtime_error carrying CUDA's message.

#include <cstddef>
#include <cstdint>
#include <string>

#include "quant/ggml_type.h"

namespace hetmoe::gpu {

// Number of CUDA devices this process can use (0 when there is no driver or no GPU).
int device_count();
std::string device_name(int device);
// Bytes of device memory in total and free now.
size_t total_memory(int device);
size_t free_memory(int device);
void set_device(int device);

// From the device's memory pool where it has one (released blocks are kept for reuse), else cudaMalloc.
void* malloc_device(size_t bytes);
void free_device(void* ptr);
// Page-locked host memory: copies from it run asynchronously at full link speed.
void* malloc_pinned(size_t bytes);
void free_pinned(void* ptr);

using Stream = void*;
using EventHandle = void*;
Stream create_stream();
void destroy_stream(Stream s);
void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream s);
void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream s);
EventHandle create_event();
void destroy_event(EventHandle e);
void record_event(EventHandle e, Stream s);
void stream_wait_event(Stream s, EventHandle e);
void event_synchronize(EventHandle e);
// Whether the event has been reached (cudaEventQuery), without waiting.
bool event_query(EventHandle e);
// Seconds between two recorded events (both reached).
double event_elapsed(EventHandle from, EventHandle to);
void stream_synchronize(Stream s);
// fn(arg) on a host thread once the stream's earlier work is done; later work on the stream waits for it.
void launch_host_func(Stream s, void (*fn)(void*), void* arg);

// Several products of one call (MLA's attn_k_b / attn_v_b, cpu::matmul_heads): head h (h < count, at most 65535)
// takes the `rows` rows from w + h * rows * row_bytes, its activations from x + h * x_stride and writes y + h *
// y_stride. Below 16 tokens one launch runs them all; from 16, each head is its own cuBLAS product.
struct Heads {
  int64_t count = 1;
  int64_t x_stride = 0, y_stride = 0;
};

// Batches of 16 rows or more dequantize the weights to F32 in chunks and multiply with cuBLAS SGEMM.
// y[t][r] = W^Q row r . x[t] for t < n, r < rows: W^Q in a low-bit layout of quant/lowbit.h (bits 2-4, group 64 or
// 128) with `row_bytes` per row of `cols` values; x [n][cols] and y [n][rows] floats in device memory.
// Token t's activations at x + t * ldx, its outputs at y + t * ldy; `heads` as above.
void lowbit_matmul(int bits, int group, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
                   int64_t ldx, int64_t n, float* y, int64_t ldy, Stream s, const Heads& heads = {});
// The same for GGUF block rows (dense and shared weights), computed from quant/blocks.h's blocks as quant/ref
// dequantizes them, against F32 activations: F32, F16, Q5_0, Q8_0, Q4_K, Q6_K.
bool block_matmul_supports(quant::GgmlType type);
void block_matmul(quant::GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
                  int64_t ldx, int64_t n, float* y, int64_t ldy, Stream s, const Heads& heads = {});
// out[i] = silu(gate[i]) * up[i]; y[i] += x[i].
void silu_mul(const float* gate, const float* up, int64_t n, float* out, Stream s);
void add(const float* x, int64_t n, float* y, Stream s);
void add_bias(const float* bias, int64_t width, int64_t n_rows, float* y, int64_t ldy, Stream s);
void layer_norm(const float* x, int64_t ldx, const float* weight, const float* bias, int64_t n_rows, int64_t width,
                float eps, float* y, int64_t ldy, Stream s);
// cpu::IndexerInput / cpu::indexer_select, one block per token.
struct IndexerArgs {
  const float* q;
  const float* w;
  float w_scale;
  const float* k;
  int64_t k_stride;
  int n_head, dim;
  int64_t top_k;
  int64_t ratio;  // query t sees keys s < (pos0 + t + 1) / ratio
};
void indexer_select(const IndexerArgs& a, int64_t n_tokens, int64_t pos0, int32_t* selected, Stream s);

// The layer ops of runtime/device/device.h (the Device interface documents each), on device memory.
void rms_norm(const float* x, int64_t ldx, const float* weight, int64_t n_rows, int64_t width, float eps, float* y,
              int64_t ldy, Stream s);
void rope(const float* table, float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
          int n_dims, bool neox, Stream s);
// Qwen3.5's Gated DeltaNet (cpu_kernels/linear_attention.h): the short convolution, one thread per channel running
// the batch's tokens in order; the delta rule, one block per value head with a thread per value index (head_dim a
// multiple of 32 up to 1024); the gated output norm; and a gated attention's sigmoid gate.
void short_conv_silu(const float* weight, int64_t channels, int width, const float* x, int64_t ldx, int64_t n,
                     float* state, float* y, int64_t ldy, Stream s);
struct DeltaNetArgs {
  int64_t n_k_heads, n_v_heads, head_dim;
  float eps;
  const float* qkv;
  int64_t ld_qkv;
  const float* alpha;
  const float* beta;
  int64_t ld_gates;
  const float* a;
  const float* dt_bias;
};
void gated_delta_net(const DeltaNetArgs& a, int64_t n, float* state, float* out, int64_t ldo, Stream s);
void gated_rms_norm(const float* x, int64_t ldx, const float* weight, const float* z, int64_t ldz, int64_t n_rows,
                    int64_t width, float eps, float* y, int64_t ldy, Stream s);
void sigmoid_mul(const float* gate, int64_t ldg, int64_t n_rows, int64_t width, float* y, int64_t ldy, Stream s);
// cpu::AttentionShape and cpu::AttentionInput in one (this header includes nothing of the CPU side).
struct AttentionArgs {
  int n_head, n_head_kv, head_dim_k, head_dim_v;
  float scale;
  const float* q;
  int64_t q_token_stride, q_head_stride;
  const float* k;
  int64_t k_stride;
  const float* v;
  int64_t v_stride;
  const float* sinks;   // [n_head] or null
  int64_t window;       // 0: none
  const int32_t* keys;  // [n_tokens][keys_per_query] selected key positions (-1: none), or null
  int64_t keys_per_query;
  int64_t ring;  // rows of position j at row j mod ring; 0: row j
  // DeepSeek-V4's compressed entries (cpu::AttentionInput): key and value alike, after the raw keys.
  const float* compressed;
  int64_t compressed_stride, ratio;
  const int32_t* chosen;
  int64_t chosen_per_query;
};
void attention(const AttentionArgs& a, int64_t n_tokens, int64_t pos0, float* out, Stream s);
// DeepSeek-V4's hyper-connections (cpu_kernels/hyper_connection.h): the coefficients, one thread per token, then the
// mixes of the streams, a thread per value.
struct HyperArgs {
  int n_streams, sinkhorn_iters;
  bool output_head;
  float eps;
  const float* scale;
  const float* base;
};
void hyper_pre(const HyperArgs& a, const float* mix, int64_t ldm, const float* x, int64_t width, int64_t n, float* coef,
               float* out, Stream s);
void hyper_post(const HyperArgs& a, const float* coef, const float* y, const float* x, int64_t width, int64_t n,
                float* x_new, Stream s);
// cpu::compress: the batch's tokens in order (each block pools the rows of positions before it), a thread per
// channel of one block.
struct CompressorArgs {
  int64_t width, ratio;
  bool overlap;
  const float* ape;
};
void compress(const CompressorArgs& a, const float* kv, const float* score, int64_t ld, int64_t n, int64_t pos0,
              float* state, float* out, Stream s);
// cpu::ExpertSelection in one; select_experts is cpu::select_experts for n tokens, one thread per token.
struct SelectionArgs {
  int64_t n_expert, n_used;
  bool sigmoid, norm;
  float scale;
  int64_t n_group, n_group_used;
};
constexpr int64_t kMaxSelectionExperts = 512;
void select_experts(const SelectionArgs& a, float* logits, const float* bias, int64_t n, int32_t* ids, float* weights,
                    Stream s);
void copy_rows(const float* src, int64_t lds, int64_t n_rows, int64_t width, float* dst, int64_t ldd, Stream s);
void gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst, Stream s);
void combine_rows(const float* src, int64_t width, const int32_t* index, const float* weights, int64_t n, int64_t k,
                  float* dst, Stream s);

}  // namespace hetmoe::gpu
