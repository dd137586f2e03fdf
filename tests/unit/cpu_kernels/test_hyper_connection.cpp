// DeepSeek-V4's ops against their formulas in double: the hyper-connections' coefficients (Sinkhorn), the streams'
// mixes, the KV compressor and the attention over a window's ring plus compressed entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu_kernels/hyper_connection.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {
namespace {

std::vector<float> normal(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// pre and post by their formulas; comb doubly stochastic after Sinkhorn (every src's and every dst's entries sum to
// 1 up to the eps terms), and equal to a double-precision Sinkhorn of the same start; the streams mixed by them.
TEST(HyperConnection, CoefficientsAndMixesMatchTheFormulas) {
  const int S = 4;
  const int64_t width = 29, n = 3;
  const std::vector<float> scale = {0.8f, 1.2f, 0.9f}, base = normal((2 + S) * S, 1, 0.5f);
  const HyperConnection hc{
      .n_streams = S, .sinkhorn_iters = 20, .eps = 1e-6f, .scale = scale.data(), .base = base.data()};
  const std::vector<float> mix = normal(n * hc.n_mix(), 2, 0.5f), x = normal(n * S * width, 3),
                           y = normal(n * width, 4);
  std::vector<float> coef(n * hc.n_coef()), xin(n * width), x_new(n * S * width);
  ThreadPool pool(2);
  hyper_pre(hc, mix.data(), hc.n_mix(), x.data(), width, n, coef.data(), xin.data(), pool);
  hyper_post(hc, coef.data(), y.data(), x.data(), width, n, x_new.data(), pool);
  for (int64_t t = 0; t < n; ++t) {
    const float* m = &mix[t * hc.n_mix()];
    const float* c = &coef[t * hc.n_coef()];
    double comb[S * S];
    for (int h = 0; h < S; ++h) {
      EXPECT_NEAR(c[h], sigmoid(m[h] * scale[0] + base[h]) + 1e-6, 1e-6);
      EXPECT_NEAR(c[S + h], 2 * sigmoid(m[S + h] * scale[1] + base[S + h]), 1e-6);
    }
    for (int k = 0; k < S * S; ++k) comb[k] = m[2 * S + k] * static_cast<double>(scale[2]) + base[2 * S + k];
    for (int src = 0; src < S; ++src) {  // softmax over dst
      double top = -INFINITY, sum = 0;
      for (int dst = 0; dst < S; ++dst) top = std::max(top, comb[dst + S * src]);
      for (int dst = 0; dst < S; ++dst) sum += (comb[dst + S * src] = std::exp(comb[dst + S * src] - top));
      for (int dst = 0; dst < S; ++dst) comb[dst + S * src] = comb[dst + S * src] / sum + 1e-6;
    }
    for (int it = 0; it < 20; ++it) {
      if (it > 0)
        for (int src = 0; src < S; ++src) {
          double sum = 1e-6;
          for (int dst = 0; dst < S; ++dst) sum += comb[dst + S * src];
          for (int dst = 0; dst < S; ++dst) comb[dst + S * src] /= sum;
        }
      for (int dst = 0; dst < S; ++dst) {
        double sum = 1e-6;
        for (int src = 0; src < S; ++src) sum += comb[dst + S * src];
        for (int src = 0; src < S; ++src) comb[dst + S * src] /= sum;
      }
    }
    for (int dst = 0; dst < S; ++dst) {
      double over_src = 0, over_dst = 0;
      for (int o = 0; o < S; ++o) {
        EXPECT_NEAR(c[2 * S + dst + S * o], comb[dst + S * o], 1e-6);
        over_src += c[2 * S + dst + S * o];
        over_dst += c[2 * S + o + S * dst];
      }
      EXPECT_NEAR(over_src, 1.0, 1e-5);
      EXPECT_NEAR(over_dst, 1.0, 1e-3) << "Sinkhorn has nearly converged after 20 iterations";
    }
    for (int64_t e = 0; e < width; ++e) {
      double want = 0;
      for (int h = 0; h < S; ++h) want += static_cast<double>(c[h]) * x[(t * S + h) * width + e];
      EXPECT_NEAR(xin[t * width + e], want, 1e-5);
      for (int dst = 0; dst < S; ++dst) {
        double next = static_cast<double>(y[t * width + e]) * c[S + dst];
        for (int src = 0; src < S; ++src)
          next += static_cast<double>(x[(t * S + src) * width + e]) * c[2 * S + dst + S * src];
        EXPECT_NEAR(x_new[(t * S + dst) * width + e], next, 1e-5);
      }
    }
  }
  // The output head: pre alone, from the first S mixes and one scale.
  const HyperConnection head{
      .n_streams = S, .output_head = true, .eps = 1e-6f, .scale = scale.data(), .base = base.data()};
  std::vector<float> head_coef(S);
  hyper_mix(head, mix.data(), head_coef.data());
  for (int h = 0; h < S; ++h) EXPECT_NEAR(head_coef[h], sigmoid(mix[h] * scale[0] + base[h]) + 1e-6, 1e-6);
}

// Each block's entry: per channel, the softmax of the pooled positions' scores (plus ape) weighting their values;
// with overlap the previous block's positions read the first half of the channels and the block's own the second,
// the first block's previous positions counting as nothing. Fed in batches of any split, the state ring gives the
// same entries as one batch.
TEST(Compressor, EntriesMatchTheFormulaWhateverTheBatches) {
  ThreadPool pool(2);
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap);
    const int64_t W = 12, r = overlap ? 4 : 8, n = 35, rw = overlap ? 2 * W : W;
    Compressor c{.width = W, .ratio = r, .overlap = overlap};
    const std::vector<float> ape = normal(r * rw, 5), kv = normal(n * rw, 6), score = normal(n * rw, 7);
    c.ape = ape.data();
    const int64_t blocks = n / r;
    std::vector<float> state(c.state_floats(), 0.0f), one(blocks * W);
    compress(c, kv.data(), score.data(), rw, n, 0, state.data(), one.data(), pool);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t j = 0; j < W; ++j) {
        std::vector<double> s, v;
        for (int64_t p = overlap ? (b - 1) * r : b * r; p < (b + 1) * r; ++p) {
          if (p < 0) continue;
          const int64_t ch = overlap && p >= b * r ? W + j : j;
          s.push_back(static_cast<double>(score[p * rw + ch]) + ape[(p % r) * rw + ch]);
          v.push_back(kv[p * rw + ch]);
        }
        const double top = *std::max_element(s.begin(), s.end());
        double sum = 0, acc = 0;
        for (double& x : s) sum += (x = std::exp(x - top));
        for (size_t i = 0; i < s.size(); ++i) acc += s[i] / sum * v[i];
        EXPECT_NEAR(one[b * W + j], acc, 1e-5) << "block " << b << " channel " << j;
      }
    for (const std::vector<int64_t>& split : {std::vector<int64_t>{3, 1, 1, 9, 21}, std::vector<int64_t>{17, 18}}) {
      std::vector<float> st(c.state_floats(), 0.0f), parts(blocks * W);
      int64_t pos = 0;
      for (const int64_t len : split) {
        compress(c, kv.data() + pos * rw, score.data() + pos * rw, rw, len, pos, st.data(),
                 parts.data() + c.first_block(pos) * W, pool);
        pos += len;
      }
      EXPECT_EQ(parts, one);
      EXPECT_EQ(st, state);
    }
  }
}

// DeepSeek-V4's attention: a query at position p sees the raw keys p - window + 1 .. p, read from a ring (row j mod
// ring), then the compressed entries b < (p + 1) / ratio (all, or its chosen ones), keys and values alike, with a
// sink logit per head.
TEST(Ops, AttentionOverARingAndCompressedEntriesMatchesTheFormula) {
  const int H = 2, D = 8;
  const int64_t window = 4, ring = 7, pos0 = 9, n = 3, ratio = 4, stride = D + 2, per_query = 2;
  const int64_t n_blocks = (pos0 + n) / ratio;
  const std::vector<float> q = normal(n * H * D, 8), kv = normal(ring * D, 9), blocks = normal(n_blocks * stride, 10),
                           sinks = normal(H, 11);
  const std::vector<int32_t> picks = {1, -1, 2, 0, 0, 2};
  ThreadPool pool(2);
  for (const bool chosen : {false, true}) {
    SCOPED_TRACE(chosen);
    AttentionShape shape{H, 1, D, D, 0.3f};
    shape.window = window;
    shape.sinks = sinks.data();
    AttentionInput in{q.data(), H * D, D, kv.data(), D, kv.data(), D};
    in.ring = ring;
    in.compressed = blocks.data();
    in.compressed_stride = stride;
    in.ratio = ratio;
    in.chosen = chosen ? picks.data() : nullptr;
    in.chosen_per_query = chosen ? per_query : 0;
    std::vector<float> out(n * H * D);
    causal_attention(shape, in, n, pos0, out.data(), pool);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = pos0 + t;
      std::vector<const float*> keys;
      for (int64_t j = p - window + 1; j <= p; ++j) keys.push_back(&kv[(j % ring) * D]);
      if (chosen) {
        for (int64_t i = 0; i < per_query && picks[t * per_query + i] >= 0; ++i)
          keys.push_back(&blocks[picks[t * per_query + i] * stride]);
      } else {
        for (int64_t b = 0; b < (p + 1) / ratio; ++b) keys.push_back(&blocks[b * stride]);
      }
      for (int h = 0; h < H; ++h) {
        std::vector<double> s;
        double top = sinks[h];
        for (const float* k : keys) {
          double dot = 0;
          for (int i = 0; i < D; ++i) dot += static_cast<double>(q[(t * H + h) * D + i]) * k[i];
          s.push_back(dot * 0.3);
          top = std::max(top, s.back());
        }
        double sum = std::exp(sinks[h] - top);
        for (double& x : s) sum += (x = std::exp(x - top));
        for (int i = 0; i < D; ++i) {
          double want = 0;
          for (size_t j = 0; j < keys.size(); ++j) want += s[j] / sum * keys[j][i];
          ASSERT_NEAR(out[(t * H + h) * D + i], want, 1e-5) << "token " << t << " head " << h;
        }
      }
    }
  }
}

// DeepSeek-V4's router: sqrt(softplus) scores, a fixed (hash) choice taken as given, and the weights of the chosen
// normalised and scaled.
TEST(Ops, SqrtSoftplusRoutingAndHashChoice) {
  const ExpertSelection p{.n_expert = 8, .n_used = 2, .sqrt_softplus = true, .norm = true, .scale = 1.5f};
  std::vector<float> logits = {-3.0f, 0.5f, 25.0f, 1.0f, -0.5f, 2.0f, 0.0f, 3.0f};
  const std::vector<float> raw = logits, bias = {0, 0, -10.0f, 0, 0, 0, 0, 0};
  int32_t ids[2];
  float w[2];
  select_experts(p, logits.data(), bias.data(), ids, w);
  for (int e = 0; e < 8; ++e) {
    const double sp = raw[e] > 20 ? raw[e] : std::log1p(std::exp(static_cast<double>(raw[e])));
    EXPECT_NEAR(logits[e], std::sqrt(sp), 1e-5);
  }
  EXPECT_EQ(ids[0], 7) << "expert 2 scores highest but its bias drops it";
  EXPECT_EQ(ids[1], 5);
  EXPECT_NEAR(w[0], 1.5 * logits[7] / (logits[7] + logits[5]), 1e-6);
  std::vector<float> again = raw;
  const int32_t fixed[2] = {4, 2};
  select_experts(p, again.data(), bias.data(), ids, w, nullptr, nullptr, fixed);
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(w[1], 1.5 * again[2] / (again[4] + again[2]), 1e-6);
}

}  // namespace
}  // namespace hetmoe::cpu
