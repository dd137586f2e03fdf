// The layer ops of cpu_kernels/ops.h against plain double-precision formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace hetmoe::cpu
