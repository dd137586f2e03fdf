#pragma once

#include <array>
#include <cstdint>

#include "cpu_kernels/isa.h"
#include "quant/ggml_type.h"

namespace hetmoe::cpu {

// Dot product of one weight row of n elements with an activation already in the weight type's vec_dot_type.
using VecDotFn = float (*)(int64_t n, const void* weight_row, const void* activation);
// One weight row against n_act activation rows (act + j * act_stride), into out[j]; out[j] equals, bit for bit,
// the table's vec_dot of the same row and activation, so batched and token-by-token evaluation agree.
using VecDotRowsFn = void (*)(int64_t n, const void* weight_row, const uint8_t* act, size_t act_stride, int64_t n_act,
                              float* out);
// n_rows consecutive weight rows (weight + r * row_bytes) against one activation, into out[r]; out[r] equals, bit for
// bit, the table's vec_dot of that row. Decode's matrices go through it: one call per block of rows instead of one
// per row, the kernel's setup and its call done once for the block.
using VecDotManyFn = void (*)(int64_t n, const uint8_t* weight, size_t row_bytes, int64_t n_rows, const void* act,
                              float* out);
// n_rows consecutive weight rows against a few activation rows (act + j * act_stride, n_act of them: a verification
// step's k + 1 tokens, a few sequences decoded together), into out[j * ldo + r]; each equals, bit for bit, the table's
// vec_dot of that row and activation. One call per block of rows, as VecDotManyFn, each row unpacked once for all
// the activations.
using VecDotFewFn = void (*)(int64_t n, const uint8_t* weight, size_t row_bytes, int64_t n_rows, const uint8_t* act,
                             size_t act_stride, int64_t n_act, float* out, size_t ldo);
// A tile of kTileRows weight rows (weight + r * row_bytes) against n_act activation rows: out[j * ldo + r]. Agrees
// with vec_dot to float rounding, not bit for bit (the sums run in another order), so callers use it only for
// batches of at least kTileMinActs activation rows: decode and small batches stay on vec_dot / dot_few.
using GemmTileFn = void (*)(int64_t n, const uint8_t* weight, size_t row_bytes, const uint8_t* act, size_t act_stride,
                            int64_t n_act, float* out, size_t ldo);
inline constexpr int64_t kTileRows = 16;
// Below it, dot_few: a whole verification step of the 8-layer V2-Lite bench model at 2 threads took 36-38 ms with 4
// tokens against 44-45 through the tiles, about the same with 6, and 73 against 67 with 8 (one sitting, alternating).
inline constexpr int64_t kTileMinActs = 6;
// The sum of the n 64-bit words at p: the bandwidth probe's reads, with the loads that read the most of the memory
// (the x86 tiers: 32 bytes each; the bench VM's Zen 4 read 3-16 % more with them than with 16-byte loads, per-round
// median +11 %, and about as much as with 64-byte loads, which varied more).
using StreamSumFn = uint64_t (*)(const uint64_t* p, size_t n);
// y[i] += a * x[i] for i < n.
using AxpyFn = void (*)(int64_t n, float a, const float* x, float* y);
// Attention of the heads that share one key head, one query token: scores[h * scores_stride + j] = q_h . k_j for
// n_heads queries (q + h * q_stride) and n_keys cached rows (k + j * k_stride) of n floats. Each score is the same
// arithmetic whichever heads and keys share its call, so a token's scores do not depend on the batch around it.
using DotHeadsFn = void (*)(int64_t n, int n_heads, const float* q, int64_t q_stride, int64_t n_keys, const float* k,
                            int64_t k_stride, float* scores, int64_t scores_stride);
// out_h = sum over j of p[h * p_stride + j] * v_j for n_heads outputs (out + h * out_stride) of n floats and n_keys
// value rows (v + j * v_stride), equal bit for bit to the table's axpy applied key by key from zero (each key row is
// read once for all the heads).
using SumHeadsFn = void (*)(int64_t n, int n_heads, int64_t n_keys, const float* p, int64_t p_stride, const float* v,
                            int64_t v_stride, float* out, int64_t out_stride);
// The attention's softmax over one query's n scores, in place, with `sink` joining the denominator only (-inf: none):
// cpu::softmax_with_sink's rule (sums in double). The SIMD tiers take e^x from a polynomial within a few ulp of expf,
// as ggml's own softmax does; the reference tier is softmax_with_sink itself.
using SoftmaxFn = void (*)(float* x, int64_t n, float sink);
// out[i] = cpu::silu_times(gate[i], up[i]) for i < n, bit for bit; out may alias gate or up.
using SwigluFn = void (*)(int64_t n, const float* gate, const float* up, float* out);
// n activation floats to a vec_dot_type.
using QuantizeActivationFn = void (*)(const float* src, void* dst, int64_t n);
// A row of n floats to a weight type, byte for byte quant::quantize_row's (model conversion: hetmoe split).
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);
// A row of a weight type to n floats, each quant::dequantize_row's (model conversion).
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);

// A type's index in the tables below: ggml's ids as they are, hetmoe's HQ split types (ids 1020..1041) after them.
inline constexpr size_t kKernelSlots = 46;
constexpr size_t kernel_slot(quant::GgmlType t) {
  const uint32_t id = static_cast<uint32_t>(t);
  return id < 40 ? id : 40 + (id - 1020) / 10 * 2 + id % 10;
}

// The kernels for one ISA tier, filled once; everything else calls through it (no ISA checks in the hot path).
// Entries the tier has no fast version of hold the scalar reference, so every slot is callable.
struct KernelTable {
  Isa isa = Isa::kRef;
  std::array<VecDotFn, kKernelSlots> vec_dot{};                          // by kernel_slot(weight type)
  std::array<VecDotRowsFn, kKernelSlots> vec_dot_rows{};                 // by kernel_slot(type); null: vec_dot per row
  std::array<VecDotManyFn, kKernelSlots> vec_dot_many{};                 // by kernel_slot(type); null: vec_dot per row
  std::array<VecDotFewFn, kKernelSlots> vec_dot_few{};                   // by kernel_slot(type); null: dot_rows per row
  std::array<GemmTileFn, kKernelSlots> gemm_tile{};                      // by kernel_slot(type); null: none
  std::array<QuantizeActivationFn, kKernelSlots> quantize_activation{};  // by kernel_slot(vec_dot_type)
  std::array<QuantizeRowFn, kKernelSlots> quantize_weights{};            // by kernel_slot(type); null: the reference
  std::array<DequantizeRowFn, kKernelSlots> dequantize_weights{};        // by kernel_slot(type); null: the reference
  StreamSumFn stream_sum = nullptr;
  AxpyFn axpy = nullptr;
  DotHeadsFn dot_heads = nullptr;
  SumHeadsFn sum_heads = nullptr;
  SoftmaxFn attention_softmax = nullptr;
  SwigluFn swiglu = nullptr;

  VecDotFn dot_for(quant::GgmlType t) const { return vec_dot[kernel_slot(t)]; }
  // vec_dot_rows where the tier has it (the weight row is unpacked once for all activations), else vec_dot.
  void dot_rows(quant::GgmlType t, int64_t n, const void* weight_row, const uint8_t* act, size_t act_stride,
                int64_t n_act, float* out) const {
    if (const VecDotRowsFn rows = vec_dot_rows[kernel_slot(t)]) return rows(n, weight_row, act, act_stride, n_act, out);
    const VecDotFn dot = dot_for(t);
    for (int64_t j = 0; j < n_act; ++j) out[j] = dot(n, weight_row, act + static_cast<size_t>(j) * act_stride);
  }
  // vec_dot_many where the tier has it, else vec_dot row by row.
  void dot_many(quant::GgmlType t, int64_t n, const uint8_t* weight, size_t row_bytes, int64_t n_rows, const void* act,
                float* out) const {
    if (const VecDotManyFn many = vec_dot_many[kernel_slot(t)]) return many(n, weight, row_bytes, n_rows, act, out);
    const VecDotFn dot = dot_for(t);
    for (int64_t r = 0; r < n_rows; ++r) out[r] = dot(n, weight + static_cast<size_t>(r) * row_bytes, act);
  }
  // Rows against a few activation rows (any count; kernels of their own below kTileMinActs): vec_dot_many for one,
  // vec_dot_few where the tier has it, else dot_rows row by row.
  void dot_few(quant::GgmlType t, int64_t n, const uint8_t* weight, size_t row_bytes, int64_t n_rows,
               const uint8_t* act, size_t act_stride, int64_t n_act, float* out, size_t ldo) const;
  GemmTileFn tile_for(quant::GgmlType t) const { return gemm_tile[kernel_slot(t)]; }
  // n floats to `type`'s blocks (quant::quantize_row's bytes), with the tier's quantizer where it has one.
  void quantize_row(quant::GgmlType type, const float* src, void* dst, int64_t n) const;
  // `type`'s blocks to n floats (quant::dequantize_row's), with the tier's version where it has one.
  void dequantize_row(quant::GgmlType type, const void* src, float* dst, int64_t n) const;
  QuantizeActivationFn activation_for(quant::GgmlType vec_dot_type) const {
    return quantize_activation[kernel_slot(vec_dot_type)];
  }
  // n floats converted for a dot product with weights of `weight_type` (its vec_dot_type; F32 is a copy), into
  // quant::activation_row_bytes(weight_type, n) bytes at dst.
  void to_activation(quant::GgmlType weight_type, const float* src, void* dst, int64_t n) const {
    activation_for(quant::type_info(weight_type).vec_dot_type)(src, dst, n);
  }
};

// The table of the selected tier (selected_isa()), built on first use.
const KernelTable& kernels();
// The table of a given tier; tests use it to compare every tier the host has with the reference.
KernelTable make_kernel_table(Isa isa);
// The AMX tier's table with its tile instructions emulated in scalar code, for tests on AVX-512 hosts without AMX
// (detect_isa() >= Isa::kAvx512): the AMX kernels' packing and scaling are checked, the instructions are not.
KernelTable make_emulated_amx_table();

}  // namespace hetmoe::cpu
