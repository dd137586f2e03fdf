#include "runtime/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "cpu_kernels/ops.h"
#include "runtime/error.h"

// The chain is llama.cpp's default (common_params_sampling::samplers, less the stages that are off by default
// there and absent here: DRY, top-n-sigma, typical-p, XTC):
//   penalties -> top-k -> top-p -> min-p -> temperature -> draw
// with llama.cpp's definitions of each stage:
//   penalties   for each distinct token among the last penalty_last_n of the history, seen `count` times:
//               logit = logit <= 0 ? logit * repeat : logit / repeat;  logit -= count * frequency + presence
//   top-k       keep the k highest logits
//   top-p       softmax over what is left, keep the smallest prefix (highest first) whose mass reaches p
//   min-p       keep logits >= max_logit + log(min_p), i.e. probability >= min_p * the top probability
//   temperature divide the logits by it
//   draw        softmax, then one uniform number picks a token by cumulative probability
// top-p and min-p see the logits before temperature, as in llama.cpp. temperature <= 0 is greedy: the argmax of
// the penalised logits, which no truncation stage can remove. Ties are broken towards the lower id everywhere,
// so each stage is a function of its input alone.
//
// Cost per token: one pass over the vocabulary to copy, O(n log k) for top-k, and a full sort only when top-p
// runs without top-k (about 129k entries for DeepSeek: a few milliseconds).

namespace hetmoe::engine {
namespace {

using Candidate = std::pair<float, int32_t>;  // (logit, id)

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Higher logit first, equal logits in id order.
bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// A uniform double in [0, 1) from the top 53 bits of one draw: the same on every standard library, unlike
// std::uniform_real_distribution.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Whether the penalties change any logit of a sequence with this history.
bool penalties_apply(const SamplingParams& p, std::span<const int32_t> history) {
  return p.penalty_last_n != 0 && !history.empty() &&
         (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
}

void apply_penalties(const SamplingParams& p, std::span<const int32_t> history, std::vector<int32_t>& window,
                     std::vector<Candidate>& candidates) {
  if (!penalties_apply(p, history)) return;
  const size_t n =
      p.penalty_last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(p.penalty_last_n));
  window.assign(history.end() - static_cast<std::ptrdiff_t>(n), history.end());
  std::sort(window.begin(), window.end());
  const auto n_vocab = static_cast<int32_t>(candidates.size());
  for (size_t i = 0; i < window.size();) {
    size_t j = i;
    while (j < window.size() && window[j] == window[i]) ++j;
    const int32_t id = window[i];
    const auto count = static_cast<float>(j - i);
    i = j;
    if (id < 0 || id >= n_vocab) continue;  // candidates are still indexed by id here
    float& logit = candidates[static_cast<size_t>(id)].first;
    logit = logit <= 0.0f ? logit * p.repeat_penalty : logit / p.repeat_penalty;
    logit -= count * p.frequency_penalty + p.presence_penalty;
  }
}

// The first of the highest logits, i.e. the lowest id among ties.
int32_t argmax(const std::vector<Candidate>& candidates) {
  const Candidate* best = &candidates[0];
  for (const Candidate& c : candidates)
    if (ranks_before(c, *best)) best = &c;
  return best->second;
}

// Keeps the smallest highest-first prefix whose softmax mass reaches top_p (at least one token).
void apply_top_p(float top_p, std::vector<Candidate>& sorted) {
  const double max_logit = sorted[0].first;
  double total = 0.0;
  for (const Candidate& c : sorted) total += std::exp(static_cast<double>(c.first) - max_logit);
  double cumulative = 0.0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    cumulative += std::exp(static_cast<double>(sorted[i].first) - max_logit) / total;
    if (cumulative >= top_p) {
      sorted.resize(i + 1);
      return;
    }
  }
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::reseed(uint64_t seed) {
  params_.seed = seed;
  rng_.seed(seed);
}

std::optional<int32_t> Sampler::prepare(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) fail("sampler: empty logits");
  // Greedy with no penalty: the argmax of the logits as they are, without the copy into candidates (a decode step's
  // vocabulary of 100k+ logits cost a tenth of a millisecond that way, with one core while the other waited).
  if (params_.temperature <= 0.0f && !penalties_apply(params_, history))
    return static_cast<int32_t>(cpu::first_argmax(logits.data(), static_cast<int64_t>(logits.size())));
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    candidates_[i] = {std::isnan(logits[i]) ? kNegInf : logits[i], static_cast<int32_t>(i)};

  apply_penalties(params_, history, window_, candidates_);
  if (params_.temperature <= 0.0f) return argmax(candidates_);

  // No stage below can drop the best token, and a vocabulary whose logits are all -inf (or NaN) has no
  // distribution to draw from: both cases come down to the argmax.
  if (candidates_.size() == 1 || !std::isfinite(candidates_[static_cast<size_t>(argmax(candidates_))].first))
    return argmax(candidates_);

  bool sorted = false;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < candidates_.size()) {
    const auto k = static_cast<std::ptrdiff_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(), ranks_before);
    candidates_.resize(static_cast<size_t>(k));
    sorted = true;
  }
  if (params_.top_p < 1.0f) {
    if (!sorted) std::sort(candidates_.begin(), candidates_.end(), ranks_before);
    sorted = true;
    apply_top_p(params_.top_p, candidates_);
  }
  if (params_.min_p > 0.0f) {
    const float max_logit =
        sorted ? candidates_[0].first : std::max_element(candidates_.begin(), candidates_.end(), [](auto& a, auto& b) {
                                          return a.first < b.first;
                                        })->first;
    // min_p > 1 would exclude even the best token; llama.cpp keeps at least one.
    const float threshold = std::min(max_logit, max_logit + std::log(params_.min_p));
    std::erase_if(candidates_, [threshold](const Candidate& c) { return c.first < threshold; });
  }

  // Temperature: exp((logit - max) / temperature), in double so that a tiny temperature cannot overflow.
  const double max_logit = std::max_element(candidates_.begin(), candidates_.end(), [](auto& a, auto& b) {
                             return a.first < b.first;
                           })->first;
  const double temperature = params_.temperature;
  weights_.resize(candidates_.size());
  for (size_t i = 0; i < candidates_.size(); ++i)
    weights_[i] = std::exp((candidates_[i].first - max_logit) / temperature);
  return std::nullopt;
}

int32_t Sampler::draw(int32_t skip) {
  double total = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (candidates_[i].second != skip) total += weights_[i];
  const double target = uniform01(rng_) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (candidates_[i].second == skip) continue;
    cumulative += weights_[i];
    if (weights_[i] > 0.0 && target < cumulative) return candidates_[i].second;
  }
  // Rounding left the target at the very end of the mass: the last token with any mass.
  for (size_t i = candidates_.size(); i-- > 0;)
    if (weights_[i] > 0.0 && candidates_[i].second != skip) return candidates_[i].second;
  return candidates_.front().second;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (const std::optional<int32_t> forced = prepare(logits, history)) return *forced;
  return draw(-1);
}

int32_t Sampler::verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft) {
  if (const std::optional<int32_t> forced = prepare(logits, history)) return *forced;
  double total = 0.0, mass = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    total += weights_[i];
    if (candidates_[i].second == draft) mass = weights_[i];
  }
  // Accepted with probability p(draft); else a draw from p without the draft, renormalised (max(p - q, 0) for a
  // draft distribution q that is all on the draft).
  if (mass > 0.0 && uniform01(rng_) * total < mass) return draft;
  if (mass >= total) return draft;  // the draft is the only token with mass: p(draft) = 1
  return draw(draft);
}

}  // namespace hetmoe::engine
