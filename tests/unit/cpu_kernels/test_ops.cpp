// The layer ops of cpu_kernels/ops.h and linear_attention.h against plain double-precision formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu_kernels/linear_attention.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {
namespace {

std::vector<float> normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// An attention case: heads and key heads, key and value widths, a batch of n tokens after pos0 cached positions,
// sinks or not, values inside the keys (MLA's latent rows) or apart.
struct AttentionCase {
  int H, KV, dk, dv;
  int64_t pos0, n;
  bool sinks, values_in_keys;
};

// gpt-oss's attention: per head a sink logit that joins the softmax denominator without a value, and a sliding
// window (a query at position p sees keys p - window + 1 .. p), with GQA groups and a batch after earlier positions.
TEST(Ops, AttentionWithSinksAndSlidingWindowMatchesTheFormula) {
  const int H = 4, KV = 2, D = 16;
  const int64_t pos0 = 6, n = 5, n_pos = pos0 + n;
  const std::vector<float> q = normal(n * H * D, 1), k = normal(n_pos * KV * D, 2), v = normal(n_pos * KV * D, 3),
                           sinks = normal(H, 4);
  ThreadPool pool(2);
  for (const int64_t window : {int64_t{0}, int64_t{3}, int64_t{8}})
    for (const bool with_sinks : {false, true}) {
      SCOPED_TRACE(testing::Message() << "window " << window << " sinks " << with_sinks);
      AttentionShape shape{H, KV, D, D, 0.25f};
      shape.window = window;
      shape.sinks = with_sinks ? sinks.data() : nullptr;
      std::vector<float> out(n * H * D);
      causal_attention(shape, {q.data(), H * D, D, k.data(), KV * D, v.data(), KV * D}, n, pos0, out.data(), pool);
      for (int64_t t = 0; t < n; ++t)
        for (int h = 0; h < H; ++h) {
          const int g = h / (H / KV);
          const int64_t p = pos0 + t;
          const int64_t first = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
          std::vector<double> s;
          double top = with_sinks ? sinks[h] : -INFINITY;
          for (int64_t j = first; j <= p; ++j) {
            double dot = 0;
            for (int i = 0; i < D; ++i) dot += static_cast<double>(q[(t * H + h) * D + i]) * k[(j * KV + g) * D + i];
            s.push_back(dot * 0.25);
            top = std::max(top, s.back());
          }
          double sum = with_sinks ? std::exp(sinks[h] - top) : 0.0;
          for (double& x : s) sum += (x = std::exp(x - top));
          for (int i = 0; i < D; ++i) {
            double want = 0;
            for (size_t j = 0; j < s.size(); ++j) want += s[j] / sum * v[((first + j) * KV + g) * D + i];
            ASSERT_NEAR(out[(t * H + h) * D + i], want, 1e-5) << "token " << t << " head " << h;
          }
        }
    }
}

// out against the formula (scores and softmax in double) for case c, values v with v_stride between positions.
void expect_formula(const AttentionCase& c, const std::vector<float>& q, const std::vector<float>& k, const float* v,
                    int64_t v_stride, const std::vector<float>& sinks, float scale, const std::vector<float>& out) {
  for (int64_t t = 0; t < c.n; ++t)
    for (int h = 0; h < c.H; ++h) {
      const int g = h / (c.H / c.KV);
      const int64_t p = c.pos0 + t;
      std::vector<double> s;
      double top = c.sinks ? sinks[h] : -INFINITY;
      for (int64_t j = 0; j <= p; ++j) {
        double dot = 0;
        for (int i = 0; i < c.dk; ++i)
          dot += static_cast<double>(q[(t * c.H + h) * c.dk + i]) * k[(j * c.KV + g) * c.dk + i];
        s.push_back(dot * scale);
        top = std::max(top, s.back());
      }
      double sum = c.sinks ? std::exp(sinks[h] - top) : 0.0;
      for (double& x : s) sum += (x = std::exp(x - top));
      for (int i = 0; i < c.dv; ++i) {
        double want = 0;
        for (size_t j = 0; j < s.size(); ++j) want += s[j] / sum * v[static_cast<int64_t>(j) * v_stride + g * c.dv + i];
        ASSERT_NEAR(out[(t * c.H + h) * c.dv + i], want, 2e-5) << "token " << t << " head " << h << " value " << i;
      }
    }
}

// A prompt's attention (16 tokens or more) runs as matrix products over blocks of queries: it must give what the
// formula gives, for GQA groups, sinks, a batch after cached positions (blocks of every key count, a last block cut
// short), and MLA's layout (one key head whose values are the first floats of the key rows, longer keys than values).
TEST(Ops, PromptAttentionAsMatrixProductsMatchesTheFormula) {
  ThreadPool pool(2);
  for (const AttentionCase& c :
       {AttentionCase{8, 2, 16, 16, 0, 70, false, false}, AttentionCase{4, 4, 24, 8, 9, 40, true, false},
        AttentionCase{16, 1, 40, 32, 5, 33, false, true}}) {
    SCOPED_TRACE(testing::Message() << "heads " << c.H << "/" << c.KV << " pos0 " << c.pos0 << " n " << c.n);
    const int64_t n_pos = c.pos0 + c.n;
    const std::vector<float> q = normal(c.n * c.H * c.dk, 11), k = normal(n_pos * c.KV * c.dk, 12),
                             v0 = normal(n_pos * c.KV * c.dv, 13), sinks = normal(c.H, 14);
    // MLA: the values are the first dv floats of each (single-head) key row.
    const float* v = c.values_in_keys ? k.data() : v0.data();
    const int64_t v_stride = c.values_in_keys ? c.dk : c.KV * c.dv;
    AttentionShape shape{c.H, c.KV, c.dk, c.dv, 0.2f};
    shape.sinks = c.sinks ? sinks.data() : nullptr;
    std::vector<float> out(c.n * c.H * c.dv);
    causal_attention(shape, {q.data(), c.H * c.dk, c.dk, k.data(), c.KV * c.dk, v, v_stride}, c.n, c.pos0, out.data(),
                     pool);
    expect_formula(c, q, k, v, v_stride, sinks, 0.2f, out);
  }
}

// Decode over a long cache with fewer query groups than threads takes passes split by keys (scores and weighted sums
// by key pieces, softmax by heads, the pieces added in order) instead of head slices: bit for bit the same output as
// the one-thread path, and what the formula gives, for MLA's one latent key head (values inside the keys), GQA groups
// with sinks, and a short cache (below the split's threshold) alike; runs of 301 to 602 keys (eight pieces, a last
// one longer than the others).
TEST(Ops, DecodeAttentionSplitByKeysEqualsTheHeadSlices) {
  ThreadPool one(1), three(3);
  for (const AttentionCase& c :
       {AttentionCase{16, 1, 72, 64, 300, 1, false, true}, AttentionCase{4, 2, 40, 40, 511, 1, true, false},
        AttentionCase{16, 1, 72, 64, 600, 2, false, true}, AttentionCase{8, 1, 24, 16, 40, 1, true, false}}) {
    SCOPED_TRACE(testing::Message() << "heads " << c.H << "/" << c.KV << " pos0 " << c.pos0 << " n " << c.n);
    const int64_t n_pos = c.pos0 + c.n;
    const std::vector<float> q = normal(c.n * c.H * c.dk, 21), k = normal(n_pos * c.KV * c.dk, 22),
                             v0 = normal(n_pos * c.KV * c.dv, 23), sinks = normal(c.H, 24);
    const float* v = c.values_in_keys ? k.data() : v0.data();
    const int64_t v_stride = c.values_in_keys ? c.dk : c.KV * c.dv;
    AttentionShape shape{c.H, c.KV, c.dk, c.dv, 0.1f};
    shape.sinks = c.sinks ? sinks.data() : nullptr;
    const AttentionInput in{q.data(), c.H * c.dk, c.dk, k.data(), c.KV * c.dk, v, v_stride};
    std::vector<float> want(c.n * c.H * c.dv), got(want.size());
    causal_attention(shape, in, c.n, c.pos0, want.data(), one);
    causal_attention(shape, in, c.n, c.pos0, got.data(), three);
    EXPECT_EQ(got, want);
    expect_formula(c, q, k, v, v_stride, sinks, 0.1f, got);
  }
}

TEST(Ops, FirstArgmaxIsTheFirstLargestWithNanAsMinusInfinity) {
  // The definition: NaN as -inf, the highest value, ties to the lower index.
  auto reference = [](const std::vector<float>& x) {
    int64_t best = 0;
    auto value = [&](int64_t i) { return std::isnan(x[i]) ? -INFINITY : x[i]; };
    for (int64_t i = 1; i < static_cast<int64_t>(x.size()); ++i)
      if (value(i) > value(best)) best = i;
    return best;
  };
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 33, 1000, 102403}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    EXPECT_EQ(first_argmax(x.data(), n), reference(x)) << n;
    // Ties: the largest twice, the first one wins wherever the two fall (same block of 16, or not).
    const int64_t a = n / 3, b = n - 1;
    const float top = *std::max_element(x.begin(), x.end()) + 1.0f;
    x[b] = top;
    EXPECT_EQ(first_argmax(x.data(), n), b) << n;
    x[a] = top;
    EXPECT_EQ(first_argmax(x.data(), n), a) << n;
    // NaN is never the largest, also before or beside it.
    x[0] = NAN;
    if (n > 1) x[n / 2] = NAN;
    EXPECT_EQ(first_argmax(x.data(), n), reference(x)) << n;
    // Nothing above -inf (all -inf or NaN): 0, as the sampler's argmax of its candidates gives.
    std::fill(x.begin(), x.end(), -INFINITY);
    x[n - 1] = NAN;
    EXPECT_EQ(first_argmax(x.data(), n), 0) << n;
    std::fill(x.begin(), x.end(), NAN);
    EXPECT_EQ(first_argmax(x.data(), n), 0) << n;
  }
}

TEST(Ops, LayerNormMatchesTheFormula) {
  const std::vector<float> x = normal(37, 5), w = normal(37, 6), b = normal(37, 7);
  std::vector<float> y(37);
  layer_norm(x.data(), w.data(), b.data(), y.data(), 37, 1e-6f);
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= 37;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= 37;
  for (int i = 0; i < 37; ++i) EXPECT_NEAR(y[i], (x[i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i], 1e-5) << i;
}

// DeepSeek-V3.2's indexer: scores sum_h w_h relu(q_h . k_s) * scale over the visible positions; the top_k by score
// (ties: lower position), all of them while a query sees no more than top_k; -1 after the last.
TEST(Ops, IndexerSelectsTheBestVisiblePositions) {
  const int heads = 2, dim = 8;
  const int64_t pos0 = 3, n = 4, top_k = 4, n_pos = pos0 + n;
  const std::vector<float> q = normal(n * heads * dim, 8), w = normal(n * heads, 9), k = normal(n_pos * dim, 10);
  std::vector<int32_t> selected(n * top_k);
  std::vector<float> scores(n * n_pos, 0.0f);
  ThreadPool pool(2);
  indexer_select({.q = q.data(),
                  .w = w.data(),
                  .w_scale = 0.25f,
                  .k = k.data(),
                  .k_stride = dim,
                  .n_head = heads,
                  .dim = dim,
                  .top_k = top_k},
                 n, pos0, selected.data(), scores.data(), pool);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t visible = pos0 + t + 1;
    std::vector<std::pair<double, int32_t>> want;
    for (int64_t s = 0; s < visible; ++s) {
      double sum = 0;
      for (int h = 0; h < heads; ++h) {
        double qk = 0;
        for (int i = 0; i < dim; ++i) qk += static_cast<double>(q[(t * heads + h) * dim + i]) * k[s * dim + i];
        sum += w[t * heads + h] * std::max(qk, 0.0);
      }
      EXPECT_NEAR(scores[t * n_pos + s], sum * 0.25, 1e-5) << "token " << t << " position " << s;
      want.emplace_back(-sum, static_cast<int32_t>(s));
    }
    std::sort(want.begin(), want.end());
    for (int64_t i = 0; i < top_k; ++i) {
      const int32_t expected = i < visible ? want[static_cast<size_t>(i)].second : -1;
      EXPECT_EQ(selected[t * top_k + i], expected) << "token " << t << " rank " << i;
    }
  }
}

// Qwen3.5's Gated DeltaNet: the convolution and the delta rule against the formulas in double (reference README
// 10.4.2), a batch of 7 tokens after 4 earlier ones (the states carry over), with value head h on key head h mod 2.
TEST(Ops, GatedDeltaNetMatchesTheFormula) {
  const int64_t Hk = 2, Hv = 4, D = 16, C = 2 * Hk * D + Hv * D, n = 11, first = 4;
  const int width = 4;
  const std::vector<float> x = normal(n * C, 30), w = normal(C * width, 31), alpha = normal(n * Hv, 32),
                           beta = normal(n * Hv, 33), a = normal(Hv, 34), dt = normal(Hv, 35);
  std::vector<float> conv_state((width - 1) * C, 0.0f), conv(n * C), state(Hv * D * D, 0.0f), out(n * Hv * D);
  ThreadPool pool(2);
  const DeltaNetShape shape{.n_k_heads = Hk, .n_v_heads = Hv, .head_dim = D, .eps = 1e-6f};
  for (const auto& [t0, count] : {std::pair<int64_t, int64_t>{0, first}, {first, n - first}}) {
    short_conv_silu({.channels = C, .width = width, .weight = w.data()}, x.data() + t0 * C, C, count, conv_state.data(),
                    conv.data() + t0 * C, C);
    gated_delta_net(shape,
                    {.qkv = conv.data() + t0 * C,
                     .ld_qkv = C,
                     .alpha = alpha.data() + t0 * Hv,
                     .beta = beta.data() + t0 * Hv,
                     .ld_gates = Hv,
                     .a = a.data(),
                     .dt_bias = dt.data()},
                    count, state.data(), out.data() + t0 * Hv * D, Hv * D, pool);
  }
  // The formulas.
  std::vector<double> ref_conv(n * C), S(Hv * D * D, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int k = 0; k < width; ++k) {
        const int64_t src = t - (width - 1) + k;
        if (src >= 0) sum += static_cast<double>(x[src * C + c]) * w[c * width + k];
      }
      ref_conv[t * C + c] = sum / (1 + std::exp(-sum));
      ASSERT_NEAR(conv[t * C + c], ref_conv[t * C + c], 1e-5) << "conv t " << t << " c " << c;
    }
  for (int64_t c = 0; c < C; ++c)
    for (int r = 0; r < width - 1; ++r) ASSERT_EQ(conv_state[r * C + c], x[(n - (width - 1) + r) * C + c]);
  auto l2 = [&](const double* v) {
    double sum = 0;
    for (int64_t i = 0; i < D; ++i) sum += v[i] * v[i];
    std::vector<double> r(D);
    for (int64_t i = 0; i < D; ++i) r[i] = v[i] / std::sqrt(sum + 1e-6);
    return r;
  };
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t kh = h % Hk;
      const std::vector<double> q = l2(&ref_conv[t * C + kh * D]), k = l2(&ref_conv[t * C + (Hk + kh) * D]);
      const double* v = &ref_conv[t * C + 2 * Hk * D + h * D];
      const double b = 1 / (1 + std::exp(-static_cast<double>(beta[t * Hv + h])));
      const double g = a[h] * std::log1p(std::exp(static_cast<double>(alpha[t * Hv + h]) + dt[h]));
      double* Sh = &S[h * D * D];  // Sh[i * D + j]: key i, value j
      for (int64_t e = 0; e < D * D; ++e) Sh[e] *= std::exp(g);
      std::vector<double> d(D);
      for (int64_t j = 0; j < D; ++j) {
        double sk = 0;
        for (int64_t i = 0; i < D; ++i) sk += Sh[i * D + j] * k[i];
        d[j] = b * (v[j] - sk);
      }
      for (int64_t i = 0; i < D; ++i)
        for (int64_t j = 0; j < D; ++j) Sh[i * D + j] += k[i] * d[j];
      for (int64_t j = 0; j < D; ++j) {
        double o = 0;
        for (int64_t i = 0; i < D; ++i) o += Sh[i * D + j] * q[i];
        o /= std::sqrt(static_cast<double>(D));
        ASSERT_NEAR(out[t * Hv * D + h * D + j], o, 1e-4 * (1 + std::abs(o))) << "t " << t << " h " << h << " j " << j;
      }
    }
  }
  for (int64_t h = 0; h < Hv; ++h)
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < D; ++j)
        ASSERT_NEAR(state[h * D * D + j * D + i], S[h * D * D + i * D + j], 1e-4) << "state h " << h;
}

// IMROPE for text: pairs in the sectors of the fourth component do not rotate; sections summing to half the rotated
// dimensions with the fourth 0 rotate every pair, as plain rope.
TEST(Ops, ImropeRotatesThePairsOfItsSections) {
  RopeParams plain{.n_dims = 16, .neox = true, .freq_base = 1e7f};
  RopeParams all = plain, partial = plain;
  all.sections[0] = 3, all.sections[1] = 3, all.sections[2] = 2;
  partial.sections[0] = 8;  // sectors 1, 2, 4, 5, 7 fall to the fourth component
  std::vector<float> want(16), got_all(16), got_partial(16);
  rope_cache(plain, 9, want.data());
  rope_cache(all, 9, got_all.data());
  rope_cache(partial, 9, got_partial.data());
  EXPECT_EQ(got_all, want);
  for (int pair = 0; pair < 8; ++pair) {
    const bool rotates = pair % 3 == 0;
    EXPECT_EQ(got_partial[2 * pair], rotates ? want[2 * pair] : 1.0f) << pair;
    EXPECT_EQ(got_partial[2 * pair + 1], rotates ? want[2 * pair + 1] : 0.0f) << pair;
  }
}

}  // namespace
}  // namespace hetmoe::cpu
