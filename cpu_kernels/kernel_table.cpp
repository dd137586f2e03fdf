#include "cpu_kernels/kernel_table.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cpu_kernels/avx2/kernels_avx2.h"
#include "cpu_kernels/avx512/kernels_avx512.h"
#include "cpu_kernels/ops.h"
#include "quant/ref.h"

namespace hetmoe::cpu {
namespace {

using quant::GgmlType;

template <GgmlType T>
float ref_dot(int64_t n, const void* w, const void* a) {
  return quant::vec_dot(T, n, w, a);
}

template <GgmlType T>
void ref_activation(const float* src, void* dst, int64_t n) {
  quant::quantize_activation(T, src, dst, n);
}

template <GgmlType T>
void set_ref(KernelTable& table) {
  table.vec_dot[kernel_slot(T)] = &ref_dot<T>;
}

// Four independent sums, so that the loop is bound by its loads, not by one chain of adds.
uint64_t ref_stream_sum(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

void ref_axpy(int64_t n, float a, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void ref_dot_heads(int64_t n, int n_heads, const float* q, int64_t q_stride, int64_t n_keys, const float* k,
                   int64_t k_stride, float* scores, int64_t scores_stride) {
  for (int h = 0; h < n_heads; ++h)
    for (int64_t j = 0; j < n_keys; ++j)
      scores[h * scores_stride + j] = quant::vec_dot(GgmlType::F32, n, q + h * q_stride, k + j * k_stride);
}

void ref_sum_heads(int64_t n, int n_heads, int64_t n_keys, const float* p, int64_t p_stride, const float* v,
                   int64_t v_stride, float* out, int64_t out_stride) {
  for (int h = 0; h < n_heads; ++h) {
    float* o = out + h * out_stride;
    std::fill(o, o + n, 0.0f);
    for (int64_t j = 0; j < n_keys; ++j) ref_axpy(n, p[h * p_stride + j], v + j * v_stride, o);
  }
}

void ref_swiglu(int64_t n, const float* gate, const float* up, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu_times(gate[i], up[i]);
}

KernelTable make_ref_table() {
  KernelTable t;
  t.isa = Isa::kRef;
  t.stream_sum = &ref_stream_sum;
  t.axpy = &ref_axpy;
  t.dot_heads = &ref_dot_heads;
  t.sum_heads = &ref_sum_heads;
  t.attention_softmax = &softmax_with_sink;
  t.swiglu = &ref_swiglu;
  set_ref<GgmlType::F32>(t);
  set_ref<GgmlType::F16>(t);
  set_ref<GgmlType::BF16>(t);
  set_ref<GgmlType::Q4_0>(t);
  set_ref<GgmlType::Q4_1>(t);
  set_ref<GgmlType::Q5_0>(t);
  set_ref<GgmlType::Q5_1>(t);
  set_ref<GgmlType::Q8_0>(t);
  set_ref<GgmlType::Q2_K>(t);
  set_ref<GgmlType::Q3_K>(t);
  set_ref<GgmlType::Q4_K>(t);
  set_ref<GgmlType::Q5_K>(t);
  set_ref<GgmlType::Q6_K>(t);
  set_ref<GgmlType::IQ4_NL>(t);
  set_ref<GgmlType::IQ4_XS>(t);
  set_ref<GgmlType::MXFP4>(t);
  set_ref<GgmlType::TQ1_0>(t);
  set_ref<GgmlType::TQ2_0>(t);
  set_ref<GgmlType::IQ1_S>(t);
  set_ref<GgmlType::IQ1_M>(t);
  set_ref<GgmlType::IQ2_XXS>(t);
  set_ref<GgmlType::IQ2_XS>(t);
  set_ref<GgmlType::IQ2_S>(t);
  set_ref<GgmlType::IQ3_XXS>(t);
  set_ref<GgmlType::IQ3_S>(t);
  set_ref<GgmlType::HQ2_G64>(t);
  set_ref<GgmlType::HQ2_G128>(t);
  set_ref<GgmlType::HQ3_G64>(t);
  set_ref<GgmlType::HQ3_G128>(t);
  set_ref<GgmlType::HQ4_G64>(t);
  set_ref<GgmlType::HQ4_G128>(t);
  for (GgmlType a : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K}) {
    QuantizeActivationFn fn = nullptr;
    switch (a) {
      case GgmlType::F32:
        fn = &ref_activation<GgmlType::F32>;
        break;
      case GgmlType::F16:
        fn = &ref_activation<GgmlType::F16>;
        break;
      case GgmlType::BF16:
        fn = &ref_activation<GgmlType::BF16>;
        break;
      case GgmlType::Q8_0:
        fn = &ref_activation<GgmlType::Q8_0>;
        break;
      case GgmlType::Q8_1:
        fn = &ref_activation<GgmlType::Q8_1>;
        break;
      default:
        fn = &ref_activation<GgmlType::Q8_K>;
        break;
    }
    t.quantize_activation[kernel_slot(a)] = fn;
  }
  return t;
}

}  // namespace

void KernelTable::dot_few(GgmlType t, int64_t n, const uint8_t* weight, size_t row_bytes, int64_t n_rows,
                          const uint8_t* act, size_t act_stride, int64_t n_act, float* out, size_t ldo) const {
  if (n_act == 1) return dot_many(t, n, weight, row_bytes, n_rows, act, out);
  const VecDotFewFn few = vec_dot_few[kernel_slot(t)];
  if (few && n_act < kTileMinActs) return few(n, weight, row_bytes, n_rows, act, act_stride, n_act, out, ldo);
  constexpr int64_t kChunk = 16;
  float col[kChunk];
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t j0 = 0; j0 < n_act; j0 += kChunk) {
      const int64_t nj = std::min(kChunk, n_act - j0);
      dot_rows(t, n, weight + static_cast<size_t>(r) * row_bytes, act + static_cast<size_t>(j0) * act_stride,
               act_stride, nj, col);
      for (int64_t j = 0; j < nj; ++j) out[static_cast<size_t>(j0 + j) * ldo + static_cast<size_t>(r)] = col[j];
    }
}

void KernelTable::quantize_row(GgmlType type, const float* src, void* dst, int64_t n) const {
  const QuantizeRowFn fn = quantize_weights[kernel_slot(type)];
  if (!fn) return quant::quantize_row(type, src, dst, n);  // which checks n itself
  quant::check_row_length("quantize_row", type, n);
  fn(src, dst, n);
}

void KernelTable::dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) const {
  const DequantizeRowFn fn = dequantize_weights[kernel_slot(type)];
  if (!fn) return quant::dequantize_row(type, src, dst, n);  // which checks n itself
  quant::check_row_length("dequantize_row", type, n);
  fn(src, dst, n);
}

KernelTable make_kernel_table(Isa isa) {
  KernelTable t = make_ref_table();
  // Each tier starts from the one below: formats without a kernel of their own keep the lower tier's.
  if (isa >= Isa::kAvx2) {
    avx2::install(t);
    avx2::install_swiglu(t);
  }
  if (isa >= Isa::kAvx512) {
    avx512::install(t);
    avx512::install_attention(t);
    avx512::install_quantize(t);
    if (has_avx512_vbmi_bitalg()) avx512::install_iq_vbmi(t);
  }
  if (isa >= Isa::kAmx) avx512::install_amx(t);
  t.isa = isa;
  return t;
}

KernelTable make_emulated_amx_table() {
  KernelTable t = make_kernel_table(Isa::kAvx512);
  avx512::install_amx_emulated(t);
  t.isa = Isa::kAmx;
  return t;
}

const KernelTable& kernels() {
  static const KernelTable table = make_kernel_table(selected_isa());
  return table;
}

}  // namespace hetmoe::cpu
