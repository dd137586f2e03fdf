#include "cpu_kernels/hyper_connection.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "cpu_kernels/scratch.h"

namespace hetmoe::cpu {
namespace {

float sigmoid_of(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Sinkhorn's two passes over comb[dst + S src]: each src's entries (summed over dst), or each dst's (over src), divided
// by their sum plus eps; sums in float, in index order, starting from eps, as llama.cpp's fused op.
void normalise_src(float* c, int S, float eps) {
  for (int src = 0; src < S; ++src) {
    float sum = eps;
    for (int dst = 0; dst < S; ++dst) sum += c[dst + S * src];
    const float inv = 1.0f / sum;
    for (int dst = 0; dst < S; ++dst) c[dst + S * src] *= inv;
  }
}
void normalise_dst(float* c, int S, float eps) {
  for (int dst = 0; dst < S; ++dst) {
    float sum = eps;
    for (int src = 0; src < S; ++src) sum += c[dst + S * src];
    const float inv = 1.0f / sum;
    for (int src = 0; src < S; ++src) c[dst + S * src] *= inv;
  }
}

}  // namespace

void hyper_mix(const HyperConnection& hc, const float* mix, float* coef) {
  const int S = hc.n_streams;
  for (int h = 0; h < S; ++h) {
    const float v = mix[h] * hc.scale[0];
    coef[h] = sigmoid_of(v + hc.base[h]) + hc.eps;
  }
  if (hc.output_head) return;
  for (int h = 0; h < S; ++h) {
    const float v = mix[S + h] * hc.scale[1];
    coef[S + h] = 2.0f * sigmoid_of(v + hc.base[S + h]);
  }
  float* c = coef + 2 * S;
  for (int k = 0; k < S * S; ++k) {
    const float v = mix[2 * S + k] * hc.scale[2];
    c[k] = v + hc.base[2 * S + k];
  }
  // Softmax over dst for each src, plus eps.
  for (int src = 0; src < S; ++src) {
    float* col = c + S * src;
    float top = -std::numeric_limits<float>::infinity();
    for (int dst = 0; dst < S; ++dst) top = std::max(top, col[dst]);
    float sum = 0.0f;
    for (int dst = 0; dst < S; ++dst) {
      col[dst] = std::exp(col[dst] - top);
      sum += col[dst];
    }
    const float inv = 1.0f / sum;
    for (int dst = 0; dst < S; ++dst) col[dst] = col[dst] * inv + hc.eps;
  }
  normalise_dst(c, S, hc.eps);
  for (int i = 1; i < hc.sinkhorn_iters; ++i) {
    normalise_src(c, S, hc.eps);
    normalise_dst(c, S, hc.eps);
  }
}

void hyper_pre(const HyperConnection& hc, const float* mix, int64_t ldm, const float* x, int64_t width, int64_t n,
               float* coef, float* out, ThreadPool& pool) {
  const int S = hc.n_streams, nc = hc.n_coef();
  pool.parallel_for(n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* c = coef + t * nc;
      hyper_mix(hc, mix + t * ldm, c);
      const float* xt = x + t * S * width;
      float* o = out + t * width;
      for (int64_t e = 0; e < width; ++e) {
        float sum = 0.0f;
        for (int h = 0; h < S; ++h) sum += xt[h * width + e] * c[h];
        o[e] = sum;
      }
    }
  });
}

void hyper_post(const HyperConnection& hc, const float* coef, const float* y, const float* x, int64_t width, int64_t n,
                float* x_new, ThreadPool& pool) {
  const int S = hc.n_streams, nc = hc.n_coef();
  pool.parallel_for(n * S, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / S;
      const int dst = static_cast<int>(i % S);
      const float* post = coef + t * nc + S;
      const float* comb = post + S;
      const float* xt = x + t * S * width;
      const float* yt = y + t * width;
      float* o = x_new + i * width;
      for (int64_t e = 0; e < width; ++e) {
        float sum = yt[e] * post[dst];
        for (int src = 0; src < S; ++src) sum += xt[src * width + e] * comb[dst + S * src];
        o[e] = sum;
      }
    }
  });
}

void compress(const Compressor& c, const float* kv, const float* score, int64_t ld, int64_t n, int64_t pos0,
              float* state, float* out, ThreadPool& pool) {
  const int64_t rw = c.row_width(), rows = c.state_rows(), W = c.width, r = c.ratio;
  // The positions a block pools and, for each, the channel offset it reads: block b's own positions with channels
  // [W, 2W) when overlapping (else [0, W)), the previous block's with [0, W).
  const int64_t n_pos = c.overlap ? 2 * r : r;
  int64_t written = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = pos0 + t;
    float* row = state + (p % rows) * 2 * rw;
    const float* ape = c.ape + (p % r) * rw;
    std::copy_n(kv + t * ld, rw, row);
    for (int64_t j = 0; j < rw; ++j) row[rw + j] = score[t * ld + j] + ape[j];
    if ((p + 1) % r != 0) continue;
    const int64_t start = p + 1 - r;  // the block's first position
    float* entry = out + written * W;
    ++written;
    pool.parallel_for(W, 64, [&](int64_t j0, int64_t j1) {
      std::span<float> w = scratch<float, struct CompressWeightsSite>(static_cast<size_t>(2 * n_pos));
      float* val = w.data() + n_pos;
      for (int64_t j = j0; j < j1; ++j) {
        // Values and scores of the pooled positions, in position order (the previous block first).
        for (int64_t i = 0; i < n_pos; ++i) {
          const int64_t q = c.overlap ? start - r + i : start + i;
          const bool own = !c.overlap || i >= r;
          if (q < 0) {
            val[i] = 0.0f;
            w[i] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* src = state + (q % rows) * 2 * rw;
          const int64_t ch = c.overlap && own ? W + j : j;
          val[i] = src[ch];
          w[i] = src[rw + ch];
        }
        // softmax (sum in double, then one float scale) and the weighted sum (float products, double sum).
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < n_pos; ++i) top = std::max(top, w[i]);
        double sum = 0;
        for (int64_t i = 0; i < n_pos; ++i) {
          w[i] = std::exp(w[i] - top);
          sum += w[i];
        }
        const auto inv = static_cast<float>(1.0 / sum);
        double acc = 0;
        for (int64_t i = 0; i < n_pos; ++i) acc += static_cast<float>(val[i] * (w[i] * inv));
        entry[j] = static_cast<float>(acc);
      }
    });
  }
}

}  // namespace hetmoe::cpu
