#pragma once

// Checks of a Device's ops shared by the emulated device's unit tests and the CUDA tests.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "cpu_kernels/hyper_connection.h"
#include "cpu_kernels/linear_attention.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/thread_pool.h"
#include "quant/ref.h"
#include "runtime/device/device.h"

namespace hetmoe::test_support {

// The exact product of a dequantized weight row and an activation row (in double) and the sum of |w x| that bounds
// its rounding: the reference of the matmul checks.
struct ExactDot {
  double value = 0, scale = 0;
};
inline ExactDot exact_dot(const float* w, const float* x, int64_t n) {
  ExactDot d;
  for (int64_t i = 0; i < n; ++i) {
    d.value += static_cast<double>(w[i]) * x[i];
    d.scale += std::abs(static_cast<double>(w[i]) * x[i]);
  }
  return d;
}

// matmul of `rows` rows of `cols` values of `type` against n activation rows, then silu_mul of the result with
// itself, on stream s, against the dequantized rows in double: |error| <= rel * sum |w x| per output.
inline void check_matmul_and_silu(device::Device& d, int s, quant::GgmlType type, int64_t cols, int64_t rows, int64_t n,
                                  double rel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  const size_t rb = quant::row_bytes(type, cols);
  std::vector<float> wf(rows * cols), x(n * cols);
  for (float& v : wf) v = dist(rng);
  for (float& v : x) v = dist(rng) * 10;
  std::vector<uint8_t> w(rb * rows);
  for (int64_t r = 0; r < rows; ++r) quant::quantize_row(type, &wf[r * cols], w.data() + r * rb, cols);
  device::DeviceMemory dw(d, w.size()), dx(d, x.size() * 4), dy(d, n * rows * 4), dh(d, n * rows * 4);
  d.copy_to_device(s, dw.get(), w.data(), w.size());
  d.copy_to_device(s, dx.get(), x.data(), x.size() * 4);
  d.matmul(s, {type, cols, rows, rb, dw.get()}, dx.as<float>(), n, dy.as<float>());
  d.silu_mul(s, dy.as<float>(), dy.as<float>(), n * rows, dh.as<float>());
  std::vector<float> y(n * rows), h(n * rows);
  d.copy_to_host(s, y.data(), dy.get(), y.size() * 4);
  d.copy_to_host(s, h.data(), dh.get(), h.size() * 4);
  d.synchronize();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> wr(cols);
    quant::dequantize_row(type, w.data() + r * rb, wr.data(), cols);
    for (int64_t t = 0; t < n; ++t) {
      const ExactDot want = exact_dot(wr.data(), &x[t * cols], cols);
      const float yv = y[t * rows + r];
      ASSERT_NEAR(yv, want.value, rel * want.scale + 1e-6)
          << quant::type_info(type).name << " cols " << cols << " rows " << rows << " n " << n << " r " << r;
      ASSERT_NEAR(h[t * rows + r], yv / (1 + std::exp(-yv)) * yv, 1e-5f + 1e-4f * std::abs(yv * yv));
    }
  }
}

// Host vectors on the device for the op checks: up(), then down() after the ops ran.
class OpHarness {
 public:
  OpHarness(device::Device& d, int s) : d_(d), s_(s) {}
  // The copy is asynchronous: the harness keeps its own copy of v until it is destroyed.
  template <typename T>
  T* up(const std::vector<T>& v) {
    const size_t bytes = v.size() * sizeof(T);
    std::vector<uint8_t>& host = host_.emplace_back(bytes);
    std::memcpy(host.data(), v.data(), bytes);
    mem_.emplace_back(d_, std::max<size_t>(bytes, 1));
    d_.copy_to_device(s_, mem_.back().get(), host.data(), bytes);
    return mem_.back().template as<T>();
  }
  ~OpHarness() { d_.synchronize(); }
  float* zeros(size_t n) { return up(std::vector<float>(n, 0.0f)); }
  std::vector<float> down(const float* p, size_t n) {
    std::vector<float> v(n);
    d_.copy_to_host(s_, v.data(), p, n * sizeof(float));
    d_.synchronize();
    return v;
  }

 private:
  device::Device& d_;
  int s_;
  std::deque<std::vector<uint8_t>> host_;
  std::deque<device::DeviceMemory> mem_;
};

inline std::vector<float> random_values(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max |got - want| / max(max |want|, 1e-6): the op harness's normalised error.
inline double normalised_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  return err / scale;
}

// DeepSeek-V4's ops: the hyper-connections (a sub-block's and the output head's), the KV compressor over two batches
// (its state ring carries over; overlapping and not), the indexer over compressed blocks and the attention over a
// window's ring plus compressed entries (all visible ones, and a chosen list).
inline void check_deepseek4_ops(device::Device& d, int s, double tol) {
  OpHarness h(d, s);
  cpu::ThreadPool pool(1);
  {
    const int S = 4;
    const int64_t width = 37, n = 3;
    const std::vector<float> scale = {0.9f, 1.1f, 1.05f}, base = random_values((2 + S) * S, 30, 0.5f);
    for (const bool head : {false, true}) {
      cpu::HyperConnection hc{
          .n_streams = S, .sinkhorn_iters = 20, .output_head = head, .eps = 1e-6f, .scale = h.up(scale)};
      hc.base = h.up(base);
      const int64_t ldm = hc.n_mix() + 2;
      const std::vector<float> mix = random_values(n * ldm, 31, 0.3f), x = random_values(n * S * width, 32),
                               y = random_values(n * width, 33);
      float* dcoef = h.zeros(n * hc.n_coef());
      float* dout = h.zeros(n * width);
      const float* dx = h.up(x);
      d.hyper_pre(s, hc, h.up(mix), ldm, dx, width, n, dcoef, dout);
      cpu::HyperConnection host = hc;
      host.scale = scale.data();
      host.base = base.data();
      std::vector<float> coef(n * hc.n_coef()), out(n * width);
      cpu::hyper_pre(host, mix.data(), ldm, x.data(), width, n, coef.data(), out.data(), pool);
      EXPECT_LT(normalised_error(h.down(dcoef, coef.size()), coef), tol) << "hyper_pre coefficients, head " << head;
      EXPECT_LT(normalised_error(h.down(dout, out.size()), out), tol) << "hyper_pre, head " << head;
      if (head) continue;
      float* dnew = h.zeros(n * S * width);
      d.hyper_post(s, hc, dcoef, h.up(y), dx, width, n, dnew);
      std::vector<float> x_new(n * S * width);
      cpu::hyper_post(host, coef.data(), y.data(), x.data(), width, n, x_new.data(), pool);
      EXPECT_LT(normalised_error(h.down(dnew, x_new.size()), x_new), tol) << "hyper_post";
    }
  }
  for (const bool overlap : {true, false}) {
    const int64_t width = 24, ratio = overlap ? 4 : 8, n1 = 11, n2 = 6, ld = 2 * width + 5;
    cpu::Compressor c{.width = width, .ratio = ratio, .overlap = overlap};
    const std::vector<float> ape = random_values(ratio * c.row_width(), 34), kv = random_values((n1 + n2) * ld, 35),
                             score = random_values((n1 + n2) * ld, 36);
    c.ape = h.up(ape);
    const int64_t blocks = (n1 + n2) / ratio;
    float* dstate = h.zeros(c.state_floats());
    float* dout = h.zeros(blocks * width);
    const float* dkv = h.up(kv);
    const float* dscore = h.up(score);
    d.compress(s, c, dkv, dscore, ld, n1, 0, dstate, dout);
    d.compress(s, c, dkv + n1 * ld, dscore + n1 * ld, ld, n2, n1, dstate, dout + (n1 / ratio) * width);
    cpu::Compressor host = c;
    host.ape = ape.data();
    std::vector<float> state(c.state_floats(), 0.0f), out(blocks * width);
    cpu::compress(host, kv.data(), score.data(), ld, n1 + n2, 0, state.data(), out.data(), pool);
    EXPECT_LT(normalised_error(h.down(dout, out.size()), out), tol) << "compress, overlap " << overlap;
    EXPECT_LT(normalised_error(h.down(dstate, state.size()), state), tol) << "compress state, overlap " << overlap;
  }
  {  // the indexer over blocks of 4: the early queries see none or fewer than top_k
    const int heads = 3, dim = 16;
    const int64_t pos0 = 2, n = 14, top_k = 2, n_blocks = (pos0 + n) / 4, stride = dim + 5;
    const std::vector<float> q = random_values(n * heads * dim, 37), w = random_values(n * heads, 38),
                             k = random_values(n_blocks * stride, 39);
    cpu::IndexerInput in{.q = h.up(q),
                         .w = h.up(w),
                         .w_scale = 0.25f,
                         .k = h.up(k) + 5,
                         .k_stride = stride,
                         .n_head = heads,
                         .dim = dim,
                         .top_k = top_k,
                         .ratio = 4};
    auto* dsel = reinterpret_cast<int32_t*>(h.zeros(n * top_k));
    d.indexer_select(s, in, n, pos0, dsel);
    const std::vector<float> got_bits = h.down(reinterpret_cast<float*>(dsel), static_cast<size_t>(n * top_k));
    std::vector<int32_t> got(got_bits.size()), want(got_bits.size());
    std::memcpy(got.data(), got_bits.data(), got.size() * sizeof(int32_t));
    in.q = q.data();
    in.w = w.data();
    in.k = k.data() + 5;
    cpu::indexer_select(in, n, pos0, want.data(), nullptr, pool);
    EXPECT_EQ(got, want) << "indexer_select over compressed blocks";
  }
  for (const bool chosen : {false, true}) {  // window ring plus compressed entries, with sinks
    const int H = 3, D = 16;
    const int64_t window = 5, ring = 9, pos0 = 13, n = 4, ratio = 4, n_blocks = (pos0 + n) / ratio;
    const int64_t stride = D + 3, per_query = 2;
    const std::vector<float> q = random_values(n * H * D, 40), kv = random_values(ring * D, 41),
                             blocks = random_values(n_blocks * stride, 42), sinks = random_values(H, 43);
    const std::vector<int32_t> picks = {1, 3, 0, -1, 2, 1, 3, 0};
    std::vector<float> pick_bits(picks.size());
    std::memcpy(pick_bits.data(), picks.data(), picks.size() * sizeof(int32_t));
    cpu::AttentionShape shape{H, 1, D, D, 0.25f};
    shape.window = window;
    shape.sinks = h.up(sinks);
    float* dkv = h.up(kv);
    cpu::AttentionInput in{h.up(q), H * D, D, dkv, D, dkv, D};
    in.ring = ring;
    in.compressed = h.up(blocks);
    in.compressed_stride = stride;
    in.ratio = ratio;
    in.chosen = chosen ? reinterpret_cast<const int32_t*>(h.up(pick_bits)) : nullptr;
    in.chosen_per_query = chosen ? per_query : 0;
    float* dout = h.zeros(n * H * D);
    d.attention(s, shape, in, n, pos0, dout);
    std::vector<float> want(n * H * D);
    shape.sinks = sinks.data();
    in.q = q.data();
    in.k = in.v = kv.data();
    in.compressed = blocks.data();
    in.chosen = chosen ? picks.data() : nullptr;
    cpu::causal_attention(shape, in, n, pos0, want.data(), pool);
    EXPECT_LT(normalised_error(h.down(dout, want.size()), want), tol)
        << "attention with compressed entries, chosen " << chosen;
  }
}

// Every layer op of the Device interface on `d` against the CPU reference (cpu_kernels/ops.h and plain loops), on
// odd sizes and strides, each within its normalised error threshold `tol` (1e-5 to 1e-4 for float rounding).
inline void check_layer_ops(device::Device& d, int s, double tol) {
  OpHarness h(d, s);
  {  // rms_norm on strided rows, with and without a weight
    const int64_t rows = 5, width = 67, ld = 80;
    const std::vector<float> x = random_values(rows * ld, 1), w = random_values(width, 2);
    float* dx = h.up(x);
    float* dw = h.up(w);
    float* dy = h.zeros(rows * ld);
    d.rms_norm(s, dx, ld, dw, rows, width, 1e-6f, dy, ld);
    d.rms_norm(s, dx, ld, nullptr, rows, width, 1e-6f, dx, ld);  // in place, no weight
    std::vector<float> want(rows * ld, 0.0f), want_inplace = x;
    for (int64_t r = 0; r < rows; ++r) {
      cpu::rms_norm(&x[r * ld], w.data(), &want[r * ld], width, 1e-6f);
      cpu::rms_norm(&x[r * ld], nullptr, &want_inplace[r * ld], width, 1e-6f);
    }
    EXPECT_LT(normalised_error(h.down(dy, want.size()), want), tol) << "rms_norm";
    EXPECT_LT(normalised_error(h.down(dx, want.size()), want_inplace), tol) << "rms_norm in place";
  }
  {  // add_bias on strided rows: the bias on each row's first `width` values, the rest untouched
    const int64_t rows = 4, width = 37, ld = 45;
    const std::vector<float> y = random_values(rows * ld, 3), b = random_values(width, 4);
    float* dy = h.up(y);
    d.add_bias(s, h.up(b), width, rows, dy, ld);
    std::vector<float> want = y;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < width; ++i) want[r * ld + i] += b[i];
    EXPECT_LT(normalised_error(h.down(dy, want.size()), want), tol) << "add_bias";
  }
  {  // layer_norm on strided rows, with weight and bias, and in place without them
    const int64_t rows = 3, width = 70, ld = 75;
    const std::vector<float> x = random_values(rows * ld, 8), w = random_values(width, 9), b = random_values(width, 10);
    float* dx = h.up(x);
    float* dy = h.zeros(rows * ld);
    d.layer_norm(s, dx, ld, h.up(w), h.up(b), rows, width, 1e-6f, dy, ld);
    d.layer_norm(s, dx, ld, nullptr, nullptr, rows, width, 1e-6f, dx, ld);
    std::vector<float> want(rows * ld, 0.0f), want_inplace = x;
    for (int64_t r = 0; r < rows; ++r) {
      cpu::layer_norm(&x[r * ld], w.data(), b.data(), &want[r * ld], width, 1e-6f);
      cpu::layer_norm(&x[r * ld], nullptr, nullptr, &want_inplace[r * ld], width, 1e-6f);
    }
    EXPECT_LT(normalised_error(h.down(dy, want.size()), want), tol) << "layer_norm";
    EXPECT_LT(normalised_error(h.down(dx, want.size()), want_inplace), tol) << "layer_norm in place";
  }
  {  // DeepSeek-V3.2's indexer: the early queries see fewer positions than top_k, the later ones choose
    const int heads = 3, dim = 16;
    const int64_t pos0 = 4, n = 5, top_k = 6, n_pos = pos0 + n;
    const std::vector<float> q = random_values(n * heads * dim, 11), w = random_values(n * heads, 12),
                             k = random_values(n_pos * dim, 13);
    const cpu::IndexerInput in{.q = h.up(q),
                               .w = h.up(w),
                               .w_scale = 0.5f,
                               .k = h.up(k),
                               .k_stride = dim,
                               .n_head = heads,
                               .dim = dim,
                               .top_k = top_k};
    auto* dsel = reinterpret_cast<int32_t*>(h.zeros(n * top_k));
    d.indexer_select(s, in, n, pos0, dsel);
    const std::vector<float> got_bits = h.down(reinterpret_cast<float*>(dsel), static_cast<size_t>(n * top_k));
    std::vector<int32_t> got(got_bits.size()), want(got_bits.size());
    std::memcpy(got.data(), got_bits.data(), got.size() * sizeof(int32_t));
    cpu::ThreadPool pool(1);
    cpu::IndexerInput host = in;
    host.q = q.data();
    host.w = w.data();
    host.k = k.data();
    cpu::indexer_select(host, n, pos0, want.data(), nullptr, pool);
    EXPECT_EQ(got, want) << "indexer_select";
  }
  {  // attention over explicit key lists (the indexer's selection), one of them shorter than the others
    const int H = 2, D = 8;
    const int64_t pos0 = 3, n = 2, n_pos = pos0 + n, per_query = 3;
    const std::vector<float> q = random_values(n * H * D, 14), kv = random_values(n_pos * D, 15);
    const std::vector<int32_t> keys = {4, 0, -1, 2, 4, 1};
    std::vector<float> keys_bits(keys.size());
    std::memcpy(keys_bits.data(), keys.data(), keys.size() * sizeof(int32_t));
    float* dq = h.up(q);
    float* dkv = h.up(kv);
    float* dout = h.zeros(n * H * D);
    cpu::AttentionShape shape{H, 1, D, D, 0.4f};
    shape.keys = reinterpret_cast<const int32_t*>(h.up(keys_bits));
    shape.keys_per_query = per_query;
    d.attention(s, shape, {dq, H * D, D, dkv, D, dkv, D}, n, pos0, dout);
    std::vector<float> want(n * H * D);
    cpu::ThreadPool pool(1);
    shape.keys = keys.data();
    cpu::causal_attention(shape, {q.data(), H * D, D, kv.data(), D, kv.data(), D}, n, pos0, want.data(), pool);
    EXPECT_LT(normalised_error(h.down(dout, want.size()), want), tol) << "attention over selected keys";
  }
  for (const bool neox : {false, true}) {  // rope on heads with a stride, YaRN table from the host
    cpu::RopeParams p{.n_dims = 16,
                      .neox = neox,
                      .freq_base = 10000.0f,
                      .freq_scale = 0.25f,
                      .ext_factor = 1.0f,
                      .attn_factor = 1.0f,
                      .beta_fast = 32.0f,
                      .beta_slow = 1.0f,
                      .n_ctx_orig = 64};
    const int64_t n = 3, heads = 4, head_stride = 24, token_stride = heads * head_stride + 5;
    std::vector<float> table(n * p.n_dims);
    for (int64_t t = 0; t < n; ++t) cpu::rope_cache(p, 7 + t, &table[t * p.n_dims]);
    std::vector<float> x = random_values(n * token_stride, 3);
    float* dt = h.up(table);
    float* dx = h.up(x);
    d.rope(s, dt, dx, n, heads, token_stride, head_stride, p.n_dims, neox);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t hd = 0; hd < heads; ++hd)
        cpu::rope_apply(p, &table[t * p.n_dims], &x[t * token_stride + hd * head_stride]);
    EXPECT_LT(normalised_error(h.down(dx, x.size()), x), tol) << "rope neox " << neox;
  }
  // Attention: grouped heads (GQA) and one wide shared latent head (MLA's absorbed form: values are a prefix of the
  // keys), a batch of tokens after earlier positions.
  // gpt-oss's sinks and sliding window too.
  struct Case {
    int n_head, n_head_kv, dk, dv;
    bool latent;
    bool sinks = false;
    int64_t window = 0;
  };
  for (const Case c : {Case{4, 2, 24, 16, false}, Case{3, 1, 72, 64, true}, Case{4, 2, 24, 16, false, true, 3}}) {
    const int64_t pos0 = 5, n = 4, n_pos = pos0 + n;
    const int64_t q_stride = c.n_head * (c.dk + 3), k_stride = c.n_head_kv * c.dk + 1;
    const int64_t v_stride = c.latent ? k_stride : c.n_head_kv * c.dv;
    const std::vector<float> q = random_values(n * q_stride, 4), k = random_values(n_pos * k_stride, 5),
                             v = random_values(n_pos * v_stride, 6);
    float* dq = h.up(q);
    float* dk = h.up(k);
    float* dv = c.latent ? dk : h.up(v);
    float* dout = h.zeros(n * c.n_head * c.dv);
    const std::vector<float> sinks = random_values(c.n_head, 7);
    cpu::AttentionShape shape{c.n_head, c.n_head_kv, c.dk, c.dv, 0.3f};
    shape.window = c.window;
    shape.sinks = c.sinks ? h.up(sinks) : nullptr;
    d.attention(s, shape, {dq, q_stride, c.dk + 3, dk, k_stride, dv, v_stride}, n, pos0, dout);
    std::vector<float> want(n * c.n_head * c.dv);
    cpu::ThreadPool pool(1);
    shape.sinks = c.sinks ? sinks.data() : nullptr;
    cpu::causal_attention(shape,
                          {q.data(), q_stride, c.dk + 3, k.data(), k_stride, c.latent ? k.data() : v.data(), v_stride},
                          n, pos0, want.data(), pool);
    EXPECT_LT(normalised_error(h.down(dout, want.size()), want), tol)
        << "attention heads " << c.n_head << " sinks " << c.sinks << " window " << c.window;
  }
  // The router's selection: plain softmax top-k, and DeepSeek-V3's sigmoid with bias, groups, norm and scale.
  for (const cpu::ExpertSelection& p :
       {cpu::ExpertSelection{.n_expert = 32, .n_used = 4}, cpu::ExpertSelection{.n_expert = 32,
                                                           .n_used = 4,
                                                           .sigmoid = true,
                                                           .norm = true,
                                                           .scale = 2.5f,
                                                           .n_group = 4,
                                                           .n_group_used = 2}}) {
    const int64_t n = 5;
    std::vector<float> logits = random_values(n * p.n_expert, 11);
    const std::vector<float> bias = random_values(p.n_expert, 12, 0.1f);
    float* dl = h.up(logits);
    const float* db = p.sigmoid ? h.up(bias) : nullptr;
    int32_t* dids = h.up(std::vector<int32_t>(n * p.n_used, -1));
    float* dw = h.zeros(n * p.n_used);
    d.select_experts(s, p, dl, db, n, dids, dw);
    std::vector<int32_t> ids(n * p.n_used), want_ids(n * p.n_used);
    std::vector<float> want_w(n * p.n_used);
    for (int64_t t = 0; t < n; ++t)
      cpu::select_experts(p, &logits[t * p.n_expert], p.sigmoid ? bias.data() : nullptr, &want_ids[t * p.n_used],
                          &want_w[t * p.n_used]);
    EXPECT_LT(normalised_error(h.down(dw, want_w.size()), want_w), tol) << "select_experts weights";
    EXPECT_LT(normalised_error(h.down(dl, logits.size()), logits), tol) << "select_experts probabilities";
    d.copy_to_host(s, ids.data(), dids, ids.size() * sizeof(int32_t));
    d.synchronize();
    EXPECT_EQ(ids, want_ids) << "select_experts ids";
  }
  {  // copy_rows, gather_rows, combine_rows
    const int64_t width = 13;
    const std::vector<float> src = random_values(6 * 20, 7);
    float* dsrc = h.up(src);
    float* dcopy = h.zeros(4 * 16);
    d.copy_rows(s, dsrc + 2, 20, 4, width, dcopy, 16);
    std::vector<float> want_copy(4 * 16, 0.0f);
    for (int64_t r = 0; r < 4; ++r) std::copy_n(&src[r * 20 + 2], width, &want_copy[r * 16]);
    EXPECT_EQ(h.down(dcopy, want_copy.size()), want_copy) << "copy_rows";

    const std::vector<int32_t> rows{5, 0, 3, 3};
    float* dg = h.zeros(rows.size() * 20);
    d.gather_rows(s, dsrc, 20, h.up(rows), static_cast<int64_t>(rows.size()), dg);
    std::vector<float> want_gather;
    for (int32_t r : rows) want_gather.insert(want_gather.end(), &src[r * 20], &src[r * 20 + 20]);
    EXPECT_EQ(h.down(dg, want_gather.size()), want_gather) << "gather_rows";

    const int64_t n = 3, k = 3;
    const std::vector<int32_t> index{0, 4, -1, -1, -1, -1, 2, 2, 5};
    const std::vector<float> weights{0.5f, 0.25f, 9.0f, 1.0f, 1.0f, 1.0f, 0.1f, 0.2f, -1.0f};
    float* dc = h.up(random_values(n * 20, 8));  // overwritten, even the token without rows
    d.combine_rows(s, dsrc, 20, h.up(index), h.up(weights), n, k, dc);
    std::vector<float> want_combine(n * 20, 0.0f);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (index[t * k + j] >= 0)
          for (int64_t c = 0; c < 20; ++c)
            want_combine[t * 20 + c] += weights[t * k + j] * src[index[t * k + j] * 20 + c];
    EXPECT_LT(normalised_error(h.down(dc, want_combine.size()), want_combine), tol) << "combine_rows";
  }
  {  // strided matmul: one head's slice of a wider row, written into a wider output row
    const int64_t cols = 64, rows = 6, n = 3, ldx = 100, ldy = 9;
    const std::vector<float> w = random_values(rows * cols, 9), x = random_values(n * ldx, 10);
    std::vector<uint8_t> wb(w.size() * sizeof(float));
    std::memcpy(wb.data(), w.data(), wb.size());
    device::DeviceMemory dw(d, wb.size());
    d.copy_to_device(s, dw.get(), wb.data(), wb.size());
    float* dx = h.up(x);
    float* dy = h.zeros(n * ldy);
    d.matmul(s, {quant::GgmlType::F32, cols, rows, cols * sizeof(float), dw.get()}, dx + 7, ldx, n, dy + 1, ldy);
    std::vector<float> want(n * ldy, 0.0f);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0;
        for (int64_t i = 0; i < cols; ++i) acc += static_cast<double>(w[r * cols + i]) * x[t * ldx + 7 + i];
        want[t * ldy + 1 + r] = static_cast<float>(acc);
      }
    EXPECT_LT(normalised_error(h.down(dy, want.size()), want), tol) << "strided matmul";
  }
  {  // Qwen3.5's Gated DeltaNet: the convolution and the delta rule over two batches (the states carry over), the
     // gated norm and the sigmoid gate on strided rows
    const int64_t Hk = 2, Hv = 4, D = 32, C = 2 * Hk * D + Hv * D, n1 = 5, n2 = 3, ld = C + 3;
    const int width = 4;
    const std::vector<float> x = random_values((n1 + n2) * ld, 14), w = random_values(C * width, 15, 0.3f),
                             gates = random_values((n1 + n2) * 2 * Hv, 16), a = random_values(Hv, 17, 0.5f),
                             dt = random_values(Hv, 18, 0.5f);
    const cpu::ShortConv conv{.channels = C, .width = width, .weight = h.up(w)};
    const cpu::DeltaNetShape shape{.n_k_heads = Hk, .n_v_heads = Hv, .head_dim = D, .eps = 1e-6f};
    float* dx = h.up(x);
    float* d_conv_state = h.zeros((width - 1) * C);
    float* d_conv = h.zeros((n1 + n2) * C);
    float* d_state = h.zeros(cpu::delta_net_state_floats(shape));
    float* d_out = h.zeros((n1 + n2) * Hv * D);
    float* d_gates = h.up(gates);
    const float* d_a = h.up(a);
    const float* d_dt = h.up(dt);
    for (const auto& [t0, n] : {std::pair<int64_t, int64_t>{0, n1}, {n1, n2}}) {
      d.short_conv_silu(s, conv, dx + t0 * ld, ld, n, d_conv_state, d_conv + t0 * C, C);
      const cpu::DeltaNetInput in{.qkv = d_conv + t0 * C,
                                  .ld_qkv = C,
                                  .alpha = d_gates + t0 * 2 * Hv,
                                  .beta = d_gates + t0 * 2 * Hv + Hv,
                                  .ld_gates = 2 * Hv,
                                  .a = d_a,
                                  .dt_bias = d_dt};
      d.gated_delta_net(s, shape, in, n, d_state, d_out + t0 * Hv * D, Hv * D);
    }
    // The CPU's own functions, in one batch.
    cpu::ThreadPool pool(1);
    std::vector<float> conv_state((width - 1) * C, 0.0f), want_conv((n1 + n2) * C), state(Hv * D * D, 0.0f),
        want_out((n1 + n2) * Hv * D);
    cpu::short_conv_silu({.channels = C, .width = width, .weight = w.data()}, x.data(), ld, n1 + n2, conv_state.data(),
                         want_conv.data(), C);
    cpu::gated_delta_net(shape,
                         {.qkv = want_conv.data(),
                          .ld_qkv = C,
                          .alpha = gates.data(),
                          .beta = gates.data() + Hv,
                          .ld_gates = 2 * Hv,
                          .a = a.data(),
                          .dt_bias = dt.data()},
                         n1 + n2, state.data(), want_out.data(), Hv * D, pool);
    EXPECT_LT(normalised_error(h.down(d_conv, want_conv.size()), want_conv), tol) << "short_conv_silu";
    EXPECT_LT(normalised_error(h.down(d_conv_state, conv_state.size()), conv_state), tol) << "short_conv_silu state";
    EXPECT_LT(normalised_error(h.down(d_out, want_out.size()), want_out), 10 * tol) << "gated_delta_net";
    EXPECT_LT(normalised_error(h.down(d_state, state.size()), state), 10 * tol) << "gated_delta_net state";

    const int64_t rows = 6, cols = 40, ldg = 47;
    const std::vector<float> y = random_values(rows * ldg, 19), z = random_values(rows * ldg, 20),
                             nw = random_values(cols, 21);
    float* dy = h.up(y);
    float* dn = h.zeros(rows * cols);
    const float* dz = h.up(z);
    d.gated_rms_norm(s, dy, ldg, h.up(nw), dz, ldg, rows, cols, 1e-6f, dn, cols);
    d.sigmoid_mul(s, dz + 2, ldg, rows, cols, dy, ldg);
    std::vector<float> want_norm(rows * cols), want_gated = y;
    for (int64_t r = 0; r < rows; ++r) {
      cpu::gated_rms_norm(&y[r * ldg], nw.data(), &z[r * ldg], &want_norm[r * cols], cols, 1e-6f);
      for (int64_t i = 0; i < cols; ++i) want_gated[r * ldg + i] *= 1.0f / (1.0f + std::exp(-z[r * ldg + 2 + i]));
    }
    EXPECT_LT(normalised_error(h.down(dn, want_norm.size()), want_norm), tol) << "gated_rms_norm";
    EXPECT_LT(normalised_error(h.down(dy, want_gated.size()), want_gated), tol) << "sigmoid_mul";
  }
  check_deepseek4_ops(d, s, tol);
}

}  // namespace hetmoe::test_support
