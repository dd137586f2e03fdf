#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace hetmoe::engine {

struct SamplingParams {
  float temperature = 0.8f;        // <= 0: greedy (argmax, ties to the lower id)
  int32_t top_k = 40;              // <= 0: off
  float top_p = 0.95f;             // >= 1: off
  float min_p = 0.05f;             // <= 0: off
  float repeat_penalty = 1.0f;     // 1: off; divides positive logits and multiplies negative ones of seen tokens
  float presence_penalty = 0.0f;   // subtracted once from every seen token
  float frequency_penalty = 0.0f;  // subtracted once per occurrence
  int32_t penalty_last_n = 64;     // how many recent tokens the penalties look at; 0: off, -1: all
  uint64_t seed = 0;
};

// Chooses the next token from the logits of the current position only, in llama.cpp's default order: penalties,
// top-k, top-p, min-p, temperature, then a draw from what is left (documented in sampler.cpp). The same seed and
// the same inputs give the same tokens on every platform (no std:: distribution is involved).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // `logits` are not modified. `history` is the sequence so far (prompt and generated), for the penalties.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // Speculative decoding's rule for a token a drafter proposed (a draft that is one token, not a distribution):
  // returns `draft` with the probability the chain gives it at these logits, else a token drawn from the chain's
  // distribution with the draft left out. The tokens that come out are distributed as sample()'s (the standard
  // rejection rule); greedy (temperature <= 0) returns the argmax, which accepts the draft exactly when it is the
  // greedy token.
  int32_t verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft);
  void reseed(uint64_t seed);
  const SamplingParams& params() const { return params_; }

 private:
  // Runs the chain up to the draw: returns the token when the chain leaves no choice (greedy, one candidate, no
  // finite logit), else leaves the candidates in candidates_ and their unnormalised probabilities in weights_.
  std::optional<int32_t> prepare(std::span<const float> logits, std::span<const int32_t> history);
  // One draw from the prepared candidates, `skip` left out (-1: none).
  int32_t draw(int32_t skip);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch, reused: (logit, id)
  std::vector<int32_t> window_;                        // scratch, reused: the penalised tokens, sorted
  std::vector<double> weights_;                        // scratch, reused: the candidates' unnormalised probabilities
};

}  // namespace hetmoe::engine
