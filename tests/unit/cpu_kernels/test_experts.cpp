// The batched expert executor against the plain composition it replaces: per item, gate/up/SiLU and down through
// matmul, scaled by the item's weight, summed per token in rank order. Bit for bit, on awkward sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "cpu_kernels/experts.h"
#include "quant/ref.h"

namespace hetmoe::cpu {
namespace {

using quant::GgmlType;

struct Matrix {
  std::vector<uint8_t> bytes;
  WeightMatrix view;
};

Matrix random_matrix(GgmlType type, int64_t n_rows, int64_t n_cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> w(n_rows * n_cols);
  for (float& v : w) v = dist(rng);
  Matrix m;
  const size_t rb = quant::row_bytes(type, n_cols);
  m.bytes.resize(rb * n_rows);
  for (int64_t r = 0; r < n_rows; ++r) quant::quantize_row(type, &w[r * n_cols], m.bytes.data() + r * rb, n_cols);
  m.view = {type, n_cols, n_rows, rb, m.bytes.data()};
  return m;
}

struct Shape {
  int64_t n_embd, n_ff, n_ff_shared;
  GgmlType gate, up, down, shared_gate, shared_up, shared_down;
};

TEST(Experts, BatchedExecutorEqualsPerItemMatmulsAndOrderedSums) {
  // Hidden sizes of 37 and 50 rows and a 97-row output are not multiples of the executor's 32-row units.
  const Shape shapes[] = {
      {256, 37, 64, GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q5_0},
      {97, 37, 50, GgmlType::F16, GgmlType::F16, GgmlType::BF16, GgmlType::BF16, GgmlType::F16, GgmlType::F16},
      // Rows of 2 per page (gate/up) and of 32 rows per page (down): here the NUMA pools below really split every
      // matrix between nodes (page-aligned node boundaries of the shapes above put all rows on one node).
      {1024, 64, 128, GgmlType::F16, GgmlType::F16, GgmlType::F16, GgmlType::F16, GgmlType::F16, GgmlType::F16},
  };
  const int64_t n_routed = 2;
  // 17 tokens take the passes apart (tiles for the experts with enough tokens); 3 the few-token loop, with experts of
  // one, two and three tokens.
  for (const int64_t n_tokens : {int64_t{17}, int64_t{3}})
    for (const Shape& s : shapes) {
      std::vector<Matrix> owned;
      auto expert = [&](GgmlType g, GgmlType u, GgmlType d, int64_t n_ff, uint64_t seed) {
        owned.push_back(random_matrix(g, n_ff, s.n_embd, seed));
        owned.push_back(random_matrix(u, n_ff, s.n_embd, seed + 1));
        owned.push_back(random_matrix(d, s.n_embd, n_ff, seed + 2));
      };
      for (int e = 0; e < 4; ++e) expert(s.gate, s.up, s.down, s.n_ff, 10 * e);
      expert(s.shared_gate, s.shared_up, s.shared_down, s.n_ff_shared, 100);
      auto ffn = [&](int e) {
        return ExpertFfn{.gate = owned[3 * e].view, .up = owned[3 * e + 1].view, .down = owned[3 * e + 2].view};
      };

      // Token 0 goes to experts 0 and 1, the others to 1 and 2 (odd tokens with 2 first); expert 3 gets nothing.
      std::mt19937_64 rng(7);
      std::uniform_real_distribution<float> unit(0.1f, 1.0f);
      std::vector<int> ids(n_tokens * n_routed);
      std::vector<float> weights(n_tokens * n_routed);
      for (int64_t t = 0; t < n_tokens; ++t) {
        ids[t * 2] = t == 0 ? 0 : (t % 2 ? 2 : 1);
        ids[t * 2 + 1] = t == 0 ? 1 : (t % 2 ? 1 : 2);
        weights[t * 2] = unit(rng);
        weights[t * 2 + 1] = unit(rng);
      }
      std::vector<float> x(n_tokens * s.n_embd);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : x) v = normal(rng);

      ExpertBatch batch;
      batch.clear(n_tokens, n_routed + 1);
      for (int e = 0; e < 4; ++e) {
        bool used = false;
        for (int id : ids) used |= id == e;
        if (!used) continue;
        batch.add_expert(ffn(e));
        for (int64_t i = 0; i < n_tokens * n_routed; ++i)
          if (ids[i] == e) batch.add_item(static_cast<int32_t>(i / 2), static_cast<int32_t>(i % 2), weights[i]);
      }
      batch.add_expert(ffn(4));
      for (int64_t t = 0; t < n_tokens; ++t) batch.add_item(static_cast<int32_t>(t), n_routed, 1.0f);

      // The plain way: each expert over its tokens as one batch (swiglu_matmul, then matmul for down; batches of
      // kTileMinActs or more take the same tile paths as the executor), then each token's weighted sum in slot order.
      ThreadPool one(1);
      std::vector<std::vector<float>> expert_out(
          5);  // [expert][token][n_embd], rows of tokens it does not serve unused
      for (int e = 0; e < 5; ++e) {
        std::vector<int64_t> tokens;
        for (int64_t t = 0; t < n_tokens; ++t)
          if (e == 4 || ids[t * 2] == e || ids[t * 2 + 1] == e) tokens.push_back(t);
        expert_out[e].assign(n_tokens * s.n_embd, 0.0f);
        if (tokens.empty()) continue;
        const int64_t m = static_cast<int64_t>(tokens.size());
        const ExpertFfn f = ffn(e);
        std::vector<float> xs(m * s.n_embd), hidden(m * f.gate.n_rows), ys(m * s.n_embd);
        for (int64_t j = 0; j < m; ++j) std::copy_n(&x[tokens[j] * s.n_embd], s.n_embd, &xs[j * s.n_embd]);
        swiglu_matmul(kernels(), one, f.gate, f.up, xs.data(), m, hidden.data());
        matmul(kernels(), one, f.down, hidden.data(), m, ys.data(), s.n_embd);
        for (int64_t j = 0; j < m; ++j) std::copy_n(&ys[j * s.n_embd], s.n_embd, &expert_out[e][tokens[j] * s.n_embd]);
      }
      std::vector<float> want(n_tokens * s.n_embd);
      for (int64_t t = 0; t < n_tokens; ++t) {
        float* o = &want[t * s.n_embd];
        const float* y0 = &expert_out[ids[t * 2]][t * s.n_embd];
        const float* y1 = &expert_out[ids[t * 2 + 1]][t * s.n_embd];
        const float* ys = &expert_out[4][t * s.n_embd];
        for (int64_t r = 0; r < s.n_embd; ++r) o[r] = y0[r] * weights[t * 2];
        for (int64_t r = 0; r < s.n_embd; ++r) o[r] += y1[r] * weights[t * 2 + 1];
        for (int64_t r = 0; r < s.n_embd; ++r) o[r] += ys[r];
      }
      // One token alone (decode): every expert runs on a single row.
      const int64_t lone = std::min<int64_t>(5, n_tokens - 1);
      std::vector<float> want5(s.n_embd), y(s.n_embd);
      auto run_one = [&](int e, const float* xt, float* out) {
        const ExpertFfn f = ffn(e);
        std::vector<float> hidden(f.gate.n_rows);
        swiglu_matmul(kernels(), one, f.gate, f.up, xt, 1, hidden.data());
        matmul(kernels(), one, f.down, hidden.data(), 1, out, s.n_embd);
      };
      run_one(ids[2 * lone], &x[lone * s.n_embd], y.data());
      for (int64_t r = 0; r < s.n_embd; ++r) want5[r] = y[r] * weights[2 * lone];
      run_one(ids[2 * lone + 1], &x[lone * s.n_embd], y.data());
      for (int64_t r = 0; r < s.n_embd; ++r) want5[r] += y[r] * weights[2 * lone + 1];
      run_one(4, &x[lone * s.n_embd], y.data());
      for (int64_t r = 0; r < s.n_embd; ++r) want5[r] += y[r];
      // Plain pools, and pools placed on synthetic NUMA machines (2 nodes of 3 and 1 cores, 4 nodes of 2 cores),
      // where each node's threads take the rows partition_rows gives that node: the result must not change.
      std::vector<std::unique_ptr<ThreadPool>> pools;
      for (int threads : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(threads));
      const Topology uneven = Topology::from_nodes({{0, {0, 1, 2}, {0, 1, 2}, 0}, {1, {3}, {3}, 0}});
      pools.push_back(std::make_unique<ThreadPool>(place_threads(uneven, 4)));
      pools.push_back(
          std::make_unique<ThreadPool>(place_threads(Topology::synthetic("package:4 numa:1 core:2 pu:1"), 8)));
      for (const auto& pool_ptr : pools) {
        ThreadPool& pool = *pool_ptr;
        const int threads = pool.size();
        std::vector<float> got(n_tokens * s.n_embd, -1.0f);
        run_experts(kernels(), pool, batch, x.data(), s.n_embd, got.data());
        EXPECT_EQ(got, want) << "n_embd " << s.n_embd << " threads " << threads << " tokens " << n_tokens;
        // A single token (decode) through the same executor.
        ExpertBatch single;
        single.clear(1, n_routed + 1);
        for (int k = 0; k < 2; ++k) {
          single.add_expert(ffn(ids[2 * lone + k]));
          single.add_item(0, k, weights[2 * lone + k]);
        }
        single.add_expert(ffn(4));
        single.add_item(0, n_routed, 1.0f);
        std::vector<float> got1(s.n_embd);
        run_experts(kernels(), pool, single, &x[lone * s.n_embd], s.n_embd, got1.data());
        EXPECT_EQ(got1, want5);
      }
      // Slots without an item (their expert ran elsewhere) add nothing: token 1 has none and gets zeros, token 0 only
      // its one item; more items than slots is refused, not summed over memory it does not own.
      ExpertBatch sparse;
      sparse.clear(2, 2);
      sparse.add_expert(ffn(0));
      sparse.add_item(0, 1, 1.0f);
      std::vector<float> out(2 * s.n_embd, -1.0f), alone(s.n_embd);
      ThreadPool pool(2);
      run_experts(kernels(), pool, sparse, x.data(), s.n_embd, out.data());
      ExpertBatch one_item;
      one_item.clear(1, 1);
      one_item.add_expert(ffn(0));
      one_item.add_item(0, 0, 1.0f);
      run_experts(kernels(), pool, one_item, x.data(), s.n_embd, alone.data());
      EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + s.n_embd), alone);
      EXPECT_EQ(std::vector<float>(out.begin() + s.n_embd, out.end()), std::vector<float>(s.n_embd, 0.0f));
      // The same for one token alone (decode's expert-by-expert second pass): its empty slots add nothing either.
      ExpertBatch one_sparse;
      one_sparse.clear(1, 3);
      one_sparse.add_expert(ffn(0));
      one_sparse.add_item(0, 1, 1.0f);
      std::vector<float> got_sparse(s.n_embd, -1.0f);
      run_experts(kernels(), pool, one_sparse, x.data(), s.n_embd, got_sparse.data());
      EXPECT_EQ(got_sparse, alone);
      ExpertBatch empty;  // every expert elsewhere: zeros
      empty.clear(2, 3);
      std::fill(out.begin(), out.end(), -1.0f);
      run_experts(kernels(), pool, empty, x.data(), s.n_embd, out.data());
      EXPECT_EQ(out, std::vector<float>(2 * s.n_embd, 0.0f));
      ExpertBatch broken;
      broken.clear(1, 1);
      broken.add_expert(ffn(0));
      broken.add_item(0, 0, 1.0f);
      broken.add_item(0, 0, 1.0f);
      EXPECT_THROW(run_experts(kernels(), pool, broken, x.data(), s.n_embd, out.data()), std::invalid_argument);
    }
}

// A split expert with its residual: gate, up and down each add the residual matrix's product to the
// low-bit part's, before the SiLU and before the weighted sum. Checked against that composition done with
// separate matmuls (the same dot products, added in the same order), for 1 token and for 6 (row path either way).
TEST(Experts, ResidualAddsToEachPartsProduct) {
  const int64_t n_embd = 256, n_ff = 128;
  const Matrix gq = random_matrix(GgmlType::HQ2_G64, n_ff, n_embd, 1),
               uq = random_matrix(GgmlType::HQ2_G64, n_ff, n_embd, 2),
               dq = random_matrix(GgmlType::HQ2_G64, n_embd, n_ff, 3);
  const Matrix gr = random_matrix(GgmlType::Q4_K, n_ff, n_embd, 4), ur = random_matrix(GgmlType::Q4_K, n_ff, n_embd, 5),
               dr = random_matrix(GgmlType::Q8_0, n_embd, n_ff, 6);
  const ExpertFfn split{
      .gate = gq.view, .up = uq.view, .down = dq.view, .gate_r = gr.view, .up_r = ur.view, .down_r = dr.view};
  ThreadPool one(1), two(2);
  for (int64_t n_tokens : {1, 6}) {
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(n_tokens * n_embd);
    for (float& v : x) v = normal(rng);
    ExpertBatch batch;
    batch.clear(n_tokens, 1);
    batch.add_expert(split);
    for (int64_t t = 0; t < n_tokens; ++t) batch.add_item(static_cast<int32_t>(t), 0, 0.5f);
    std::vector<float> got(n_tokens * n_embd);
    run_experts(kernels(), two, batch, x.data(), n_embd, got.data());

    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = &x[t * n_embd];
      std::vector<float> g(n_ff), g2(n_ff), u(n_ff), u2(n_ff), h(n_ff), y(n_embd), y2(n_embd);
      matmul(kernels(), one, gq.view, xt, 1, g.data(), n_ff);
      matmul(kernels(), one, gr.view, xt, 1, g2.data(), n_ff);
      matmul(kernels(), one, uq.view, xt, 1, u.data(), n_ff);
      matmul(kernels(), one, ur.view, xt, 1, u2.data(), n_ff);
      for (int64_t i = 0; i < n_ff; ++i) {
        const float gi = g[i] + g2[i], ui = u[i] + u2[i];
        h[i] = gi / (1 + std::exp(-gi)) * ui;
      }
      matmul(kernels(), one, dq.view, h.data(), 1, y.data(), n_embd);
      matmul(kernels(), one, dr.view, h.data(), 1, y2.data(), n_embd);
      float scale = 0;
      for (int64_t r = 0; r < n_embd; ++r) scale = std::max(scale, std::abs(y[r] + y2[r]));
      for (int64_t r = 0; r < n_embd; ++r)
        ASSERT_NEAR(got[t * n_embd + r], 0.5f * (y[r] + y2[r]), 1e-5f * scale) << "tokens " << n_tokens << " t " << t;
    }
    // Without the residual the result differs by the residual's share: the residual is really added.
    ExpertBatch q_only;
    q_only.clear(n_tokens, 1);
    q_only.add_expert({.gate = gq.view, .up = uq.view, .down = dq.view});
    for (int64_t t = 0; t < n_tokens; ++t) q_only.add_item(static_cast<int32_t>(t), 0, 0.5f);
    std::vector<float> without(n_tokens * n_embd);
    run_experts(kernels(), two, q_only, x.data(), n_embd, without.data());
    EXPECT_NE(without, got);
  }
}

}  // namespace
}  // namespace hetmoe::cpu
