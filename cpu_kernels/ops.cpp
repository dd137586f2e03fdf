#include "cpu_kernels/ops.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <utility>
#include <vector>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/onednn.h"
#include "cpu_kernels/scratch.h"

namespace hetmoe::cpu {

int64_t first_argmax(const float* x, int64_t n) {
  // The largest value, in 16 independent lanes (a NaN is never greater, so it never enters).
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  for (float& v : lane) v = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  float best = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  for (const float v : lane) best = v > best ? v : best;
  if (best == -std::numeric_limits<float>::infinity()) return 0;
  // Its first place: a block's compares folded into one flag, then the block that has it value by value.
  for (i = 0; i + kLanes <= n; i += kLanes) {
    int hit = 0;
    for (int64_t j = 0; j < kLanes; ++j) hit |= x[i + j] == best ? 1 : 0;
    if (hit) break;
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // not reached: best is one of the values
}

// The squares are summed in double, as llama.cpp does, but in eight running sums added at the end rather than one
// chain, and the scaling goes eight values at a time: a row of 2048 took 2.0-2.6 us as one chain of dependent double
// adds and scalar products, 0.66-0.8 us now (one thread, alternating). It runs on the calling thread between two
// loops, about 25 times a decode step (`HETMOE_PROFILE`'s rest, the norms and residual adds: 0.09-0.12 -> 0.07 ms a
// step). The order moves the double sum by a rounding or two, which the float mean almost never shows.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  constexpr int64_t kSums = 8;
  double sums[kSums] = {};
  int64_t i = 0;
  for (; i + kSums <= n; i += kSums)
#pragma GCC unroll 8
    for (int64_t k = 0; k < kSums; ++k) sums[k] += static_cast<double>(x[i + k] * x[i + k]);
  double sum = 0.0;
  for (const double part : sums) sum += part;
  for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  // Eight values at a time through a local copy: y may alias x, which otherwise keeps the compiler to one at a time.
  int64_t j = 0;
  for (; j + kSums <= n; j += kSums) {
    float scaled[kSums];
#pragma GCC unroll 8
    for (int64_t k = 0; k < kSums; ++k) scaled[k] = w ? (x[j + k] * scale) * w[j + k] : x[j + k] * scale;
#pragma GCC unroll 8
    for (int64_t k = 0; k < kSums; ++k) y[j + k] = scaled[k];
  }
  for (; j < n; ++j) y[j] = w ? (x[j] * scale) * w[j] : x[j] * scale;
}

// A sink of -inf adds exp(-inf) = 0 to the sum: the plain softmax, to the bit.
void softmax(float* x, int64_t n) { softmax_with_sink(x, n, -std::numeric_limits<float>::infinity()); }

void softmax_with_sink(float* x, int64_t n, float sink) {
  float max = sink;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  double sum = std::exp(static_cast<double>(sink - max));
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void sigmoid(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

// An exponent of all ones is NaN or infinity. Integer tests ORed over blocks of 16 with no early exit: the compiler
// vectorizes them, where a test and a branch per value (or std::isfinite in a loop) stay scalar.
bool all_finite(const float* x, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr int kBlock = 16;
  uint32_t bad = 0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int l = 0; l < kBlock; ++l)
      bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(x[i + l]) & kExponent) == kExponent);
  for (; i < n; ++i) bad |= static_cast<uint32_t>((std::bit_cast<uint32_t>(x[i]) & kExponent) == kExponent);
  return bad == 0;
}

float silu_exp(float x) {
  using E = SiluExp;
  x = std::min(std::max(x, E::kLow), E::kHigh);  // a NaN stays NaN
  // t rounded to an integer k sits in the low mantissa bits of t + kRound; k's bits are read from there (no float to
  // int conversion, which a NaN would make undefined).
  const float shifted = x * E::kLog2e + E::kRound;
  const float k = shifted - E::kRound;
  const uint32_t k_bits = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(E::kRound);
  float r = x - k * E::kLn2Hi;
  r = r - k * E::kLn2Lo;
  float p = E::kP0;
  p = p * r + E::kP1;
  p = p * r + E::kP2;
  p = p * r + E::kP3;
  p = p * r + E::kP4;
  p = p * r + E::kP5;
  p = p * (r * r) + (r + 1.0f);
  return p * std::bit_cast<float>((k_bits + 127u) << 23);
}

float silu_times(float g, float u) { return (g / (1.0f + silu_exp(-g))) * u; }

void swiglu(const float* gate, const float* up, float* out, int64_t n) { kernels().swiglu(n, gate, up, out); }

namespace {

float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * std::numbers::pi_v<float>)) / (2 * std::log(base));
}

}  // namespace

void rope_cache(const RopeParams& p, int64_t pos, float* cache) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / p.n_dims);
  float corr0 = 0, corr1 = 0;
  if (p.ext_factor != 0.0f) {
    corr0 = std::max(0.0f, std::floor(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    corr1 = std::min(static_cast<float>(p.n_dims - 1),
                     std::ceil(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base)));
  }
  float theta_extrap = static_cast<float>(pos);
  for (int i0 = 0; i0 < p.n_dims; i0 += 2) {
    const float theta_pair = p.rotates_pair(i0 / 2) ? theta_extrap : 0.0f;
    const float theta_interp = p.freq_scale * theta_pair;
    float theta = theta_interp;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
      const int pair = i0 / 2;
      const float y = (static_cast<float>(pair) - corr0) / std::max(0.001f, corr1 - corr0);
      const float ramp_mix = (1 - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
      theta = theta_interp * (1 - ramp_mix) + theta_pair * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
    }
    cache[i0] = std::cos(theta) * mscale;
    cache[i0 + 1] = std::sin(theta) * mscale;
    theta_extrap *= theta_scale;
  }
}

void rope_apply(const RopeParams& p, const float* cache, float* x) {
  const int half = p.n_dims / 2;
  for (int i0 = 0; i0 < p.n_dims; i0 += 2) {
    const float c = cache[i0], s = cache[i0 + 1];
    float* a = p.neox ? &x[i0 / 2] : &x[i0];
    float* b = p.neox ? &x[i0 / 2 + half] : &x[i0 + 1];
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
  }
}

namespace {

// Query rows (tokens times the heads of a group) per block of the blocked path, and the batches that take it. A
// block's probabilities take rows x keys floats: 256 x 32k positions = 32 MB per thread.
constexpr int64_t kBlockRows = 256;
constexpr int64_t kBlockedMinTokens = 16;

struct BlockedQueriesSite;
struct BlockedScoresSite;
struct BlockedOutputSite;

// A prompt's attention as matrix products: per key head and block of query tokens, the scores of all the block's
// queries (its tokens times the heads of the group) against every key its last token sees in one oneDNN matmul,
// the causal mask and the softmax per row, then the probabilities times the value rows in a second one; the cache's
// rows are read in place. Per query it is the same arithmetic as the row path below, summed in another order. The
// blocks of the latest tokens (the most keys) go first, taken from a shared counter, so the threads finish together.
void blocked_causal_attention(const AttentionShape& shape, const AttentionInput& in, int64_t n_tokens, int64_t pos0,
                              float* out, ThreadPool& pool) {
  const int64_t group = shape.n_head / shape.n_head_kv, dk = shape.head_dim_k, dv = shape.head_dim_v;
  const int64_t block = std::max<int64_t>(4, kBlockRows / group);  // query tokens per block
  const int64_t n_blocks = (n_tokens + block - 1) / block, units = n_blocks * shape.n_head_kv;
  const int64_t out_stride = static_cast<int64_t>(shape.n_head) * dv;
  const KernelTable& k = kernels();
  std::atomic<int64_t> next{0};
  pool.parallel_for(pool.size(), 1, [&](int64_t, int64_t) {
    const int64_t max_rows = block * group, max_keys = pos0 + n_tokens;
    std::span<float> q = scratch<float, BlockedQueriesSite>(static_cast<size_t>(max_rows * dk));
    std::span<float> p = scratch<float, BlockedScoresSite>(static_cast<size_t>(max_rows * max_keys));
    std::span<float> o = scratch<float, BlockedOutputSite>(static_cast<size_t>(max_rows * dv));
    for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      const int64_t b = n_blocks - 1 - u / shape.n_head_kv, g = u % shape.n_head_kv;
      const int64_t t0 = b * block, t1 = std::min(n_tokens, t0 + block);
      const int64_t n_keys = pos0 + t1, rows = (t1 - t0) * group;
      // Row (t - t0) * group + h: token t's query of head g * group + h.
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = 0; h < group; ++h)
          std::memcpy(q.data() + ((t - t0) * group + h) * dk,
                      in.q + t * in.q_token_stride + (g * group + h) * in.q_head_stride,
                      static_cast<size_t>(dk) * sizeof(float));
      onednn_matmul_f32(in.k + g * dk, n_keys, dk, in.k_stride, q.data(), rows, p.data(), n_keys);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = p.data() + r * n_keys;
        const int64_t t = t0 + r / group, seen = pos0 + t + 1;
        for (int64_t j = 0; j < seen; ++j) row[j] *= shape.scale;
        k.attention_softmax(row, seen,
                            shape.sinks ? shape.sinks[g * group + r % group] : -std::numeric_limits<float>::infinity());
        std::fill(row + seen, row + n_keys, 0.0f);
      }
      onednn_matmul_f32_kn(in.v + g * dv, dv, n_keys, in.v_stride, p.data(), n_keys, rows, o.data(), dv);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(out + (t0 + r / group) * out_stride + (g * group + r % group) * dv, o.data() + r * dv,
                    static_cast<size_t>(dv) * sizeof(float));
    }
  });
}

// Decode over a long run of cached rows with fewer query groups than threads (MLA: one latent key head for all heads,
// one token), so that every thread reads only part of the cache: the scores and then the weighted sums of the key
// pieces (value_piece) that each thread owns, between them the softmax by heads, after them the pieces' sums added in
// order. Each score, probability and output float is the same arithmetic as in the head-slice path below (dot_heads
// per score, sum_heads per piece of keys, the pieces added in order), so the choice between the two changes no bit;
// the head slices made each thread read every cached row twice.
constexpr int64_t kSplitMinKeys = 256;

// The weighted sums over a run of at least kSplitMinKeys cached rows go in kValuePieces pieces of whole 16-key steps:
// each piece's sums from zero, then the pieces' sums added in order (a shorter run is one piece, key by key from
// zero). The pieces depend on the run's length only, so every path and thread count gives the same floats, and the
// split path's threads sum the rows they scored instead of each reading a slice of every row's columns (1 KB of each
// 2.3 KB latent row; two threads after the scores, harness: 159-173 us against 88-93 by pieces at 1050 keys, 631
// against 305 at 4096). Eight pieces keep two, four or eight threads even.
constexpr int64_t kValuePieces = 8;

int64_t value_pieces(int64_t n_keys) { return n_keys >= kSplitMinKeys ? kValuePieces : 1; }

// Keys [first, second) of piece p of a run of n_keys in `pieces` pieces.
std::pair<int64_t, int64_t> value_piece(int64_t n_keys, int64_t pieces, int64_t p) {
  const int64_t steps = n_keys / 16;
  return {16 * (p * steps / pieces), p + 1 == pieces ? n_keys : 16 * ((p + 1) * steps / pieces)};
}

struct SplitScoresSite;
struct SplitPiecesSite;

void split_decode_attention(const KernelTable& k, const AttentionShape& shape, const AttentionInput& in,
                            int64_t n_tokens, int64_t pos0, float* out, ThreadPool& pool) {
  const int64_t group = shape.n_head / shape.n_head_kv, dk = shape.head_dim_k, dv = shape.head_dim_v;
  const int64_t groups = n_tokens * shape.n_head_kv, max_keys = pos0 + n_tokens;
  const int64_t out_stride = static_cast<int64_t>(shape.n_head) * dv;
  // Row (unit, h) of the scores: unit = t * n_head_kv + g.
  std::span<float> scores = scratch<float, SplitScoresSite>(static_cast<size_t>(groups * group * max_keys));
  const auto row = [&](int64_t unit, int64_t h) { return scores.data() + (unit * group + h) * max_keys; };
  // The sums of piece p of unit u: [group][dv] at pieces[(u * kValuePieces + p) * group * dv].
  std::span<float> pieces = scratch<float, SplitPiecesSite>(static_cast<size_t>(groups * kValuePieces * group * dv));
  const auto piece_sums = [&](int64_t unit, int64_t p) {
    return pieces.data() + (unit * kValuePieces + p) * group * dv;
  };
  // Every key run here has kSplitMinKeys keys or more (pos0 + 1 >= kSplitMinKeys): kValuePieces pieces.
  const auto keys_of = [&](int64_t unit, int64_t p) {
    return value_piece(pos0 + unit / shape.n_head_kv + 1, kValuePieces, p);
  };
  // Pass 1: the scores of each unit's pieces.
  pool.parallel_for_balanced(groups * kValuePieces, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t unit = i / kValuePieces;
      const int64_t t = unit / shape.n_head_kv, g = unit % shape.n_head_kv;
      const auto [j0, j1] = keys_of(unit, i % kValuePieces);
      float* s0 = row(unit, 0);
      k.dot_heads(dk, static_cast<int>(group), in.q + t * in.q_token_stride + g * group * in.q_head_stride,
                  in.q_head_stride, j1 - j0, in.k + j0 * in.k_stride + g * dk, in.k_stride, s0 + j0, max_keys);
      for (int64_t h = 0; h < group; ++h)
        for (int64_t j = j0; j < j1; ++j) s0[h * max_keys + j] *= shape.scale;
    }
  });
  // Pass 2: one softmax per head.
  pool.parallel_for(groups * group, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t unit = i / group, h = i % group, t = unit / shape.n_head_kv, g = unit % shape.n_head_kv;
      k.attention_softmax(row(unit, h), pos0 + t + 1,
                          shape.sinks ? shape.sinks[g * group + h] : -std::numeric_limits<float>::infinity());
    }
  });
  // Pass 3: each piece's weighted sums, on the thread that scored it (the same split of the same items); with more
  // threads than pieces, a piece's columns in slices of whole 16-float steps as well.
  const int64_t items = groups * kValuePieces;
  const int64_t slices = std::min((pool.size() + items - 1) / items, std::max<int64_t>(1, dv / 16));
  const auto columns = [&](int64_t c) {
    const int64_t steps = (dv + 15) / 16;
    return std::pair{std::min(dv, 16 * (c * steps / slices)), std::min(dv, 16 * ((c + 1) * steps / slices))};
  };
  pool.parallel_for_balanced(items * slices, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t unit = i / (kValuePieces * slices), p = i / slices % kValuePieces, g = unit % shape.n_head_kv;
      const auto [j0, j1] = keys_of(unit, p);
      const auto [c0, c1] = columns(i % slices);
      k.sum_heads(c1 - c0, static_cast<int>(group), j1 - j0, row(unit, 0) + j0, max_keys,
                  in.v + j0 * in.v_stride + g * dv + c0, in.v_stride, piece_sums(unit, p) + c0, dv);
    }
  });
  // Pass 4: the pieces' sums added in order, head by head (axpy by 1: each add the plain add's).
  pool.parallel_for(groups * group, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t unit = i / group, h = i % group, t = unit / shape.n_head_kv, g = unit % shape.n_head_kv;
      float* o = out + t * out_stride + (g * group + h) * dv;
      std::copy_n(piece_sums(unit, 0) + h * dv, dv, o);
      for (int64_t p = 1; p < kValuePieces; ++p) k.axpy(dv, 1.0f, piece_sums(unit, p) + h * dv, o);
    }
  });
}

}  // namespace

void causal_attention(const AttentionShape& shape, const AttentionInput& in, int64_t n_tokens, int64_t pos0, float* out,
                      ThreadPool& pool) {
  if (n_tokens >= kBlockedMinTokens && onednn_available() && !shape.keys && shape.window == 0 && in.ring == 0 &&
      !in.compressed)
    return blocked_causal_attention(shape, in, n_tokens, pos0, out, pool);
  const int group = shape.n_head / shape.n_head_kv;
  // The heads that share a key/value head run together, so each cached row is read once per group instead of once
  // per head (MLA: one latent row for all 16 heads): keys in one run of rows through the kernel table's dot_heads and
  // sum_heads (several heads and keys per step, SIMD where the CPU has it), the indexer's picks, a ring buffer's and
  // compressed entries key by key with its F32 dot and axpy.
  const KernelTable& k = kernels();
  if (n_tokens * shape.n_head_kv < pool.size() && pos0 + 1 >= kSplitMinKeys && !shape.keys && shape.window == 0 &&
      in.ring == 0 && !in.compressed)
    return split_decode_attention(k, shape, in, n_tokens, pos0, out, pool);
  const VecDotFn dot = k.dot_for(quant::GgmlType::F32);
  const int64_t out_stride = static_cast<int64_t>(shape.n_head) * shape.head_dim_v;
  // Units of (token, key head, slice of its heads): whole groups when there are enough of them to keep the threads
  // busy (prefill), slices of a group when not (decode: one token, MLA: one key head).
  const int64_t groups = n_tokens * shape.n_head_kv;
  const int64_t slices = groups >= 2 * pool.size() ? 1 : std::min<int64_t>(group, pool.size());
  const int64_t slice_heads = (group + slices - 1) / slices;
  pool.parallel_for(groups * slices, 1, [&](int64_t i0, int64_t i1) {
    const int64_t max_keys = pos0 + n_tokens + in.max_compressed(pos0, n_tokens);
    std::span<float> scores = scratch<float, struct AttentionScoresSite>(static_cast<size_t>(slice_heads * max_keys));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / (shape.n_head_kv * slices);
      const int g = static_cast<int>(i / slices % shape.n_head_kv);
      const int h0 = static_cast<int>(i % slices * slice_heads);
      const int nh = static_cast<int>(std::min<int64_t>(slice_heads, group - h0));
      if (nh <= 0) continue;
      const int64_t n_keys = pos0 + t + 1;
      const int64_t first = shape.window > 0 ? std::max<int64_t>(0, n_keys - shape.window) : 0;
      // The key positions this query sees: a range, or the indexer's selection.
      const int32_t* chosen = shape.keys ? shape.keys + t * shape.keys_per_query : nullptr;
      int64_t seen = n_keys - first;
      if (chosen) {
        seen = 0;
        while (seen < shape.keys_per_query && chosen[seen] >= 0) ++seen;
      }
      auto key_pos = [&](int64_t idx) {
        const int64_t j = chosen ? static_cast<int64_t>(chosen[idx]) : first + idx;
        return in.ring > 0 ? j % in.ring : j;
      };
      // DeepSeek-V4's compressed entries after the raw keys: all visible ones, or the indexer's.
      const int64_t visible = in.compressed ? (pos0 + t + 1) / in.ratio : 0;
      const int32_t* picked = in.chosen ? in.chosen + t * in.chosen_per_query : nullptr;
      int64_t n_comp = visible;
      if (picked) {
        n_comp = 0;
        while (n_comp < in.chosen_per_query && picked[n_comp] >= 0) ++n_comp;
      }
      auto entry = [&](int64_t idx) {
        return in.compressed + (picked ? static_cast<int64_t>(picked[idx]) : idx) * in.compressed_stride;
      };
      const int64_t total = seen + n_comp;
      float* o = out + t * out_stride + static_cast<int64_t>(g * group + h0) * shape.head_dim_v;
      // Keys in one run of cache rows go through the head-group kernels, which read each row once for all the heads.
      const bool one_run = !chosen && in.ring == 0 && n_comp == 0;
      if (one_run) {
        k.dot_heads(shape.head_dim_k, nh, in.q + t * in.q_token_stride + (g * group + h0) * in.q_head_stride,
                    in.q_head_stride, seen, in.k + first * in.k_stride + static_cast<int64_t>(g) * shape.head_dim_k,
                    in.k_stride, scores.data(), max_keys);
        for (int hh = 0; hh < nh; ++hh)
          for (int64_t idx = 0; idx < seen; ++idx) scores[hh * max_keys + idx] *= shape.scale;
      } else {
        auto key_row = [&](int64_t idx) {
          return idx < seen ? in.k + key_pos(idx) * in.k_stride + static_cast<int64_t>(g) * shape.head_dim_k
                            : entry(idx - seen);
        };
        for (int64_t idx = 0; idx < total; ++idx) {
          const float* key = key_row(idx);
          for (int hh = 0; hh < nh; ++hh) {
            const float* q = in.q + t * in.q_token_stride + (g * group + h0 + hh) * in.q_head_stride;
            scores[hh * max_keys + idx] = dot(shape.head_dim_k, q, key) * shape.scale;
          }
        }
      }
      for (int hh = 0; hh < nh; ++hh)
        k.attention_softmax(scores.data() + hh * max_keys, total,
                            shape.sinks ? shape.sinks[g * group + h0 + hh] : -std::numeric_limits<float>::infinity());
      if (one_run) {
        // By value_piece's pieces, as the split path sums them.
        const int64_t dv = shape.head_dim_v, pieces = value_pieces(seen);
        std::span<float> piece =
            scratch<float, struct AttentionPieceSite>(pieces > 1 ? static_cast<size_t>(nh * dv) : 0);
        for (int64_t p = 0; p < pieces; ++p) {
          const auto [j0, j1] = value_piece(seen, pieces, p);
          k.sum_heads(dv, nh, j1 - j0, scores.data() + j0, max_keys,
                      in.v + (first + j0) * in.v_stride + static_cast<int64_t>(g) * dv, in.v_stride,
                      p == 0 ? o : piece.data(), dv);
          if (p > 0)  // axpy by 1, as the split path adds them
            for (int hh = 0; hh < nh; ++hh) k.axpy(dv, 1.0f, piece.data() + hh * dv, o + hh * dv);
        }
        continue;
      }
      std::fill(o, o + static_cast<int64_t>(nh) * shape.head_dim_v, 0.0f);
      for (int64_t idx = 0; idx < total; ++idx) {
        const float* v = idx < seen ? in.v + key_pos(idx) * in.v_stride + static_cast<int64_t>(g) * shape.head_dim_v
                                    : entry(idx - seen);
        for (int hh = 0; hh < nh; ++hh)
          k.axpy(shape.head_dim_v, scores[hh * max_keys + idx], v, o + static_cast<int64_t>(hh) * shape.head_dim_v);
      }
    }
  });
}

void layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t n, float eps) {
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<double>(n);
  const auto inv = static_cast<float>(1.0 / std::sqrt(var + eps));
  const auto m = static_cast<float>(mean);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * inv * (weight ? weight[i] : 1.0f) + (bias ? bias[i] : 0.0f);
}

void indexer_select(const IndexerInput& in, int64_t n_tokens, int64_t pos0, int32_t* selected, float* scores,
                    ThreadPool& pool) {
  const VecDotFn dot = kernels().dot_for(quant::GgmlType::F32);
  const int64_t n_pos = pos0 + n_tokens;
  pool.parallel_for(n_tokens, 1, [&](int64_t t0, int64_t t1) {
    std::span<float> s = scratch<float, struct IndexerScoreSite>(static_cast<size_t>(n_pos));
    std::span<int32_t> order = scratch<int32_t, struct IndexerOrderSite>(static_cast<size_t>(n_pos));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t visible = (pos0 + t + 1) / in.ratio;
      for (int64_t p = 0; p < visible; ++p) {
        float sum = 0;
        for (int h = 0; h < in.n_head; ++h) {
          const float qk = dot(in.dim, in.q + (t * in.n_head + h) * in.dim, in.k + p * in.k_stride);
          sum += in.w[t * in.n_head + h] * std::max(qk, 0.0f);
        }
        s[p] = sum * in.w_scale;
      }
      if (scores) std::copy(s.begin(), s.begin() + visible, scores + t * n_pos);
      const int64_t keep = std::min(visible, in.top_k);
      std::iota(order.begin(), order.begin() + visible, 0);
      std::partial_sort(order.begin(), order.begin() + keep, order.begin() + visible,
                        [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
      int32_t* out = selected + t * in.top_k;
      std::copy(order.begin(), order.begin() + keep, out);
      std::fill(out + keep, out + in.top_k, -1);
    }
  });
}

namespace {

// Indices of the k largest values, largest first; ties go to the lower index.
void top_k(const float* v, int64_t n, int64_t k, int32_t* out) {
  std::span<int32_t> idx = cpu::scratch<int32_t, struct TopKSite>(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + k, out);
}

// Group-limited routing (DeepSeek-V3): a group scores the sum of its two best selection scores; only the best
// n_group_used groups stay eligible, the others are masked to -inf.
void mask_groups(const ExpertSelection& p, float* sel) {
  const int64_t per_group = p.n_expert / p.n_group;
  std::span<float> group_score = cpu::scratch<float, struct GroupScoreSite>(p.n_group);
  for (int64_t g = 0; g < p.n_group; ++g) {
    const float* s = sel + g * per_group;
    int32_t best[2];
    const int64_t take = std::min<int64_t>(2, per_group);
    top_k(s, per_group, take, best);
    float score = s[best[0]];
    if (take > 1) score += s[best[1]];
    group_score[g] = score;
  }
  std::span<int32_t> keep = cpu::scratch<int32_t, struct GroupKeepSite>(p.n_group_used);
  top_k(group_score.data(), p.n_group, p.n_group_used, keep.data());
  std::span<uint8_t> kept = cpu::scratch<uint8_t, struct GroupKeptSite>(p.n_group);
  std::fill(kept.begin(), kept.end(), 0);
  for (int32_t g : keep) kept[g] = 1;
  for (int64_t g = 0; g < p.n_group; ++g)
    if (!kept[g]) std::fill(sel + g * per_group, sel + (g + 1) * per_group, -std::numeric_limits<float>::infinity());
}

}  // namespace

void select_experts(const ExpertSelection& p, float* logits, const float* bias, int32_t* ids, float* weights,
                    float* raw, float* normed, const int32_t* fixed) {
  const int64_t ne = p.n_expert, nu = p.n_used;
  if (p.softmax_selected) {
    top_k(logits, ne, nu, ids);
    for (int64_t i = 0; i < nu; ++i) weights[i] = logits[ids[i]];
    if (raw) std::copy(weights, weights + nu, raw);
    softmax(weights, nu);
    return;
  }
  if (p.sqrt_softplus) {
    for (int64_t e = 0; e < ne; ++e) logits[e] = std::sqrt(softplus(logits[e]));
  } else if (p.sigmoid) {
    sigmoid(logits, ne);
  } else {
    softmax(logits, ne);
  }
  if (fixed) {
    std::copy_n(fixed, nu, ids);
  } else {
    std::span<float> sel = scratch<float, struct SelectionSite>(ne);
    for (int64_t e = 0; e < ne; ++e) sel[e] = bias ? logits[e] + bias[e] : logits[e];
    if (p.n_group > 1) mask_groups(p, sel.data());
    top_k(sel.data(), ne, nu, ids);
  }
  for (int64_t i = 0; i < nu; ++i) weights[i] = logits[ids[i]];
  if (raw) std::copy(weights, weights + nu, raw);
  if (p.norm) {
    float sum = 0;
    for (int64_t i = 0; i < nu; ++i) sum += weights[i];
    sum = std::max(sum, 6.103515625e-5f);  // the smallest normal half: guards against a zero sum
    for (int64_t i = 0; i < nu; ++i) weights[i] /= sum;
    if (normed) std::copy(weights, weights + nu, normed);
  }
  if (p.scale != 0.0f && p.scale != 1.0f)
    for (int64_t i = 0; i < nu; ++i) weights[i] *= p.scale;
}

}  // namespace hetmoe::cpu
