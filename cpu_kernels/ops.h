#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cpu_kernels/thread_pool.h"

namespace hetmoe::cpu {

// The element-wise and attention operations of a transformer layer, in F32, following ggml's order of
// operations where the last bits matter (norm sums in double, softmax sums in double).

// y = (x / rms(x)) * w; y may alias x. `w` may be null (no weight).
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);

// In place over n values.
void softmax(float* x, int64_t n);
// softmax with one more logit, `sink`, in the denominator only (gpt-oss's attention sinks).
void softmax_with_sink(float* x, int64_t n, float sink);
void sigmoid(float* x, int64_t n);
// ggml's softplus: x above 20, else log(1 + exp(x)).
inline float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }
// The e^x of SiLU: Cephes' expf (x clamped to [kLow, kHigh] so that 2^k stays a normal float, k = round(x log2 e),
// Cody-Waite reduction by ln 2 in two parts, a degree-5 polynomial), in float multiplies and adds only, each rounded
// once as IEEE says: no fused multiply-add anywhere, so the tiers' SIMD versions (KernelTable::swiglu) compute the
// same floats lane by lane. Within 2 ulp of e^x over the clamped range (the ops test measures it).
struct SiluExp {
  static constexpr float kLow = -87.3f, kHigh = 88.3f;
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kRound = 12582912.0f;  // 1.5 x 2^23: (t + kRound) - kRound is t rounded to an integer
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                         kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
};
float silu_exp(float x);
// silu(g) * u = g / (1 + e^-g) * u with silu_exp: the one expression every SwiGLU path uses, scalar here and SIMD in
// KernelTable::swiglu, so that fused and unfused paths, and decode and batch paths, agree bit for bit.
float silu_times(float g, float u);
// out[i] = silu(gate[i]) * up[i] through the selected tier's KernelTable::swiglu; out may alias gate.
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// Whether x[0, n) holds no NaN and no infinity.
bool all_finite(const float* x, int64_t n);
// The index of the first largest of x[0, n) with NaN taken as -inf (so 0 when none is above -inf); n > 0. Greedy
// sampling's pick, in two passes the compiler vectorises: std::max_element over a 102400-logit vocabulary took
// 0.37 ms here, a few percent of a decode step, with one core while the other waited.
int64_t first_argmax(const float* x, int64_t n);

// The router's choice for one token, in llama.cpp's order of operations: probabilities from the logits (softmax or
// sigmoid), selection scores = probabilities + bias, group-limited masking (DeepSeek-V3: a group scores the sum of
// its two best scores; only the best n_group_used groups stay eligible), the n_used best scores (ties: lower id), and
// their probabilities as weights, divided by their sum when `norm` and multiplied by `scale` unless it is 0 or 1.
struct ExpertSelection {
  int64_t n_expert = 0;
  int64_t n_used = 0;
  bool sigmoid = false;
  bool softmax_selected = false;  // gpt-oss: select on the raw logits, weights = softmax over the selected ones
  bool sqrt_softplus = false;     // DeepSeek-V4: probabilities sqrt(softplus(logit))
  bool norm = false;
  float scale = 0.0f;
  int64_t n_group = 1;  // group-limited routing when > 1
  int64_t n_group_used = 1;
};
// logits [n_expert] become the probabilities; bias [n_expert] may be null; ids and weights get n_used values.
// raw (the weights before normalising) and normed (before scaling) are optional copies for tracing. `fixed` (n_used
// ids, DeepSeek-V4's hash-routed layers) replaces the selection: those experts, in that order, no bias.
void select_experts(const ExpertSelection& p, float* logits, const float* bias, int32_t* ids, float* weights,
                    float* raw = nullptr, float* normed = nullptr, const int32_t* fixed = nullptr);

// Rotary position embedding with ggml's YaRN formulation.
struct RopeParams {
  int n_dims = 0;     // rotated dimensions at the start of each head
  bool neox = false;  // pairs (i, i + n_dims/2) instead of adjacent (2i, 2i+1)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;   // 1 / context scaling factor
  float ext_factor = 0.0f;   // YaRN extrapolation mix: 1 with YaRN scaling, 0 otherwise
  float attn_factor = 1.0f;  // magnitude applied to sin/cos
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;  // training context the YaRN ramp is measured against
  // Interleaved multimodal rope (Qwen3.5's IMROPE) for text: pair i falls in sector s = i mod (sum of sections);
  // sectors s % 3 == 0, 1, 2 below 3 * sections[0], [1], [2] rotate by the token's position, the others by
  // position 0 (not at all), as the fourth position component of a text token is 0. All zero: every pair rotates.
  int sections[4] = {0, 0, 0, 0};
  bool rotates_pair(int pair) const {
    const int total = sections[0] + sections[1] + sections[2] + sections[3];
    if (total == 0) return true;
    const int s = pair % total;
    return (s % 3 == 0 && s < 3 * sections[0]) || (s % 3 == 1 && s < 3 * sections[1]) ||
           (s % 3 == 2 && s < 3 * sections[2]);
  }
};

// cos/sin of every rotated pair at position `pos`: cache[2i] = cos, cache[2i+1] = sin, n_dims values.
void rope_cache(const RopeParams& p, int64_t pos, float* cache);
// Rotates the first n_dims values of one head vector in place.
void rope_apply(const RopeParams& p, const float* cache, float* x);

// Causal attention of a batch of queries against a cache.
struct AttentionShape {
  int n_head = 0;
  int n_head_kv = 0;   // heads share a key/value head in groups of n_head / n_head_kv
  int head_dim_k = 0;  // query and key length per head
  int head_dim_v = 0;
  float scale = 1.0f;  // applied to q.k before the softmax
  // gpt-oss: one logit per head that joins each softmax's denominator without a value (memory of the attention's
  // device); null: none.
  const float* sinks = nullptr;
  // Sliding window: a query at position p sees keys p - window + 1 .. p; 0: every earlier position.
  int64_t window = 0;
  // DeepSeek-V3.2: query t sees only the key positions keys[t * keys_per_query + i] that are >= 0 (the indexer's
  // selection, memory of the attention's device); null: the causal range.
  const int32_t* keys = nullptr;
  int64_t keys_per_query = 0;
};

// q: [n_tokens][n_head * q_stride_head] (query head h at h * q_head_stride); token t sits at position pos0 + t and
// attends to cache positions 0..pos0+t. Key head g of position j at k + j*k_stride + g*head_dim_k, value head g
// at v + j*v_stride + g*head_dim_v. out: [n_tokens][n_head * head_dim_v].
struct AttentionInput {
  const float* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  const float* k = nullptr;
  int64_t k_stride = 0;
  const float* v = nullptr;
  int64_t v_stride = 0;
  // A sliding window's ring: the rows of position j at row j mod ring (the window plus a batch); 0: row j.
  int64_t ring = 0;
  // DeepSeek-V4's compressed entries, seen besides the raw keys (after them in the softmax): one head (n_head_kv 1)
  // per row, key and value alike (head_dim_k floats at compressed + b * compressed_stride). A query at position p
  // sees entries b < (p + 1) / ratio: all of them, or with `chosen` those of its row chosen[t * chosen_per_query + i]
  // that are >= 0 (the indexer's top-k, memory of the attention's device). Null: none.
  const float* compressed = nullptr;
  int64_t compressed_stride = 0;
  int64_t ratio = 0;
  const int32_t* chosen = nullptr;
  int64_t chosen_per_query = 0;
  // The most entries any query of a batch at positions pos0 .. pos0 + n - 1 sees.
  int64_t max_compressed(int64_t pos0, int64_t n) const {
    if (!compressed) return 0;
    return chosen ? chosen_per_query : (pos0 + n) / ratio;
  }
};
void causal_attention(const AttentionShape& shape, const AttentionInput& in, int64_t n_tokens, int64_t pos0, float* out,
                      ThreadPool& pool);

// y = LayerNorm(x) * weight + bias over n values (mean and variance in double).
void layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t n, float eps);

// DeepSeek-V3.2's (and V4's) lightning indexer. Query t (position pos0 + t) scores every cached key s <= pos0 + t as
// w_scale * sum_h w[t][h] * relu(q[t][h] . k[s]) (k: one head of `dim` values at k + s * k_stride, shared by the
// n_head query heads) and keeps the top_k positions, highest score first (ties: the lower position); a query with no
// more than top_k positions keeps them all. selected: [n_tokens][top_k], -1 after a query's last position; scores
// (optional): [n_tokens][pos0 + n_tokens], the visible ones written.
struct IndexerInput {
  const float* q = nullptr;  // [n_tokens][n_head][dim]
  const float* w = nullptr;  // [n_tokens][n_head]
  float w_scale = 1.0f;
  const float* k = nullptr;
  int64_t k_stride = 0;
  int n_head = 0;
  int dim = 0;
  int64_t top_k = 0;
  // Keys are compressed blocks of `ratio` positions (DeepSeek-V4): query t sees keys s < (pos0 + t + 1) / ratio.
  int64_t ratio = 1;
};
void indexer_select(const IndexerInput& in, int64_t n_tokens, int64_t pos0, int32_t* selected, float* scores,
                    ThreadPool& pool);

}  // namespace hetmoe::cpu
