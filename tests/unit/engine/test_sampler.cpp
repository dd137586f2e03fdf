#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/engine/sampler.h"
#include "runtime/error.h"

namespace hetmoe::engine {
namespace {

// Every truncation stage off: a plain draw from softmax(logits / temperature).
SamplingParams plain(float temperature, uint64_t seed = 1) {
  return SamplingParams{.temperature = temperature, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed};
}

int32_t argmax_lowest_id(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<float> random_logits(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp((logits[i] - max) / temperature);
  for (double& x : p) x /= total;
  return p;
}

std::vector<int> histogram(Sampler& sampler, const std::vector<float>& logits, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.sample(logits, {}))];
  return counts;
}

// Logits whose softmax is exactly `p` (up to rounding).
std::vector<float> logits_of(const std::vector<double>& p) {
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  return logits;
}

TEST(Sampler, GreedyIsArgmaxWithTiesToTheLowerId) {
  Sampler greedy(SamplingParams{.temperature = 0.0f});
  EXPECT_EQ(greedy.sample(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}, {}), 1);
  EXPECT_EQ(greedy.sample(std::vector<float>{5.0f, 1.0f, 5.0f}, {}), 0);
  EXPECT_EQ(greedy.sample(std::vector<float>{-2.0f, -1.0f, -3.0f}, {}), 1);
  EXPECT_EQ(greedy.sample(std::vector<float>{7.0f}, {}), 0);
  // NaN never wins.
  EXPECT_EQ(greedy.sample(std::vector<float>{NAN, -1.0f, NAN}, {}), 1);
}

TEST(Sampler, TemperatureZeroOrBelowIsGreedy) {
  std::mt19937 rng(7);
  for (float temperature : {0.0f, -1.0f}) {
    Sampler s(SamplingParams{.temperature = temperature, .seed = 99});
    for (int trial = 0; trial < 50; ++trial) {
      const std::vector<float> logits = random_logits(rng, 97, 3.0f);
      EXPECT_EQ(s.sample(logits, {}), argmax_lowest_id(logits));
    }
  }
}

TEST(Sampler, TopKOneIsGreedy) {
  std::mt19937 rng(11);
  for (uint64_t seed = 0; seed < 5; ++seed) {
    Sampler s(SamplingParams{.temperature = 1.5f, .top_k = 1, .top_p = 1.0f, .min_p = 0.0f, .seed = seed});
    for (int trial = 0; trial < 40; ++trial) {
      const std::vector<float> logits = random_logits(rng, 37, 0.5f);
      EXPECT_EQ(s.sample(logits, {}), argmax_lowest_id(logits));
    }
  }
  // Ties at the top are cut towards the lower id, as in greedy.
  Sampler tie(SamplingParams{.temperature = 1.0f, .top_k = 1, .seed = 3});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(tie.sample(std::vector<float>{0.0f, 4.0f, 4.0f, 4.0f}, {}), 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::mt19937 rng(5);
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < 200; ++i) steps.push_back(random_logits(rng, 37, 0.3f));
  auto run = [&](uint64_t seed) {
    Sampler s(plain(1.0f, seed));
    std::vector<int32_t> out;
    for (const auto& logits : steps) out.push_back(s.sample(logits, out));
    return out;
  };
  const std::vector<int32_t> a = run(42);
  EXPECT_EQ(a, run(42));
  EXPECT_NE(a, run(43));
  EXPECT_NE(a, run(0));

  // reseed() starts the same sequence again.
  Sampler s(plain(1.0f, 42));
  std::vector<int32_t> first;
  for (int i = 0; i < 20; ++i) first.push_back(s.sample(steps[0], {}));
  s.reseed(42);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(steps[0], {}), first[static_cast<size_t>(i)]);
  EXPECT_EQ(s.params().seed, 42u);
}

TEST(Sampler, TopPExcludesTheTail) {
  // p = 0.5, 0.3, 0.15, 0.05: the smallest prefix reaching 0.75 is {0, 1}.
  const std::vector<float> logits = logits_of({0.5, 0.3, 0.15, 0.05});
  Sampler s(SamplingParams{.temperature = 1.0f, .top_k = 0, .top_p = 0.75f, .min_p = 0.0f, .seed = 8});
  const std::vector<int> counts = histogram(s, logits, 5000);
  EXPECT_EQ(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
  // Renormalised over the kept two: 0.5 / 0.8 = 0.625 (sigma about 0.007).
  EXPECT_NEAR(counts[0] / 5000.0, 0.625, 0.035);
  // Reaching the mass exactly at a token keeps that token: 0.5 + 0.3 + 0.15 >= 0.9 keeps three.
  Sampler wide(SamplingParams{.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 8});
  const std::vector<int> wide_counts = histogram(wide, logits, 5000);
  EXPECT_GT(wide_counts[2], 0);
  EXPECT_EQ(wide_counts[3], 0);
}

TEST(Sampler, MinPExcludesUnlikelyTokens) {
  // min_p = 0.2 of the top probability 0.5 is 0.1: 0.15 stays, 0.05 goes.
  const std::vector<float> logits = logits_of({0.5, 0.3, 0.15, 0.05});
  Sampler s(SamplingParams{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.2f, .seed = 21});
  const std::vector<int> counts = histogram(s, logits, 5000);
  EXPECT_EQ(counts[3], 0);
  EXPECT_GT(counts[2], 0);
  // min_p above 1 still leaves the best token.
  Sampler strict(SamplingParams{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 5.0f, .seed = 21});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(strict.sample(logits, {}), 0);
}

TEST(Sampler, TopKExcludesAllButTheK) {
  const std::vector<float> logits = {0.1f, 0.4f, 0.3f, 0.2f, 0.0f};
  Sampler s(SamplingParams{.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .min_p = 0.0f, .seed = 4});
  const std::vector<int> counts = histogram(s, logits, 3000);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_EQ(counts[0] + counts[3] + counts[4], 0);
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p{.temperature = 0.0f, .repeat_penalty = 1.1f};
  Sampler s(p);
  // 2.0 / 1.1 = 1.82 < 1.9.
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.9f, -1.0f}, {}), 0);
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.9f, -1.0f}, std::vector<int32_t>{0}), 1);
  // -1.0 * 1.1 = -1.1 < -1.05 (dividing would have raised it to -0.91 and kept token 0).
  EXPECT_EQ(s.sample(std::vector<float>{-1.0f, -1.05f}, {}), 0);
  EXPECT_EQ(s.sample(std::vector<float>{-1.0f, -1.05f}, std::vector<int32_t>{0}), 1);
  // The repeat penalty does not depend on the count: 2.0 / 1.1 > 1.8 however often token 0 was seen.
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.8f}, std::vector<int32_t>{0, 0, 0, 0}), 0);
}

TEST(Sampler, PresencePenaltyIsSubtractedOnce) {
  Sampler strong(SamplingParams{.temperature = 0.0f, .presence_penalty = 0.3f});
  Sampler weak(SamplingParams{.temperature = 0.0f, .presence_penalty = 0.1f});
  const std::vector<float> logits = {1.0f, 0.8f};
  EXPECT_EQ(strong.sample(logits, std::vector<int32_t>{0}), 1);            // 0.7 < 0.8
  EXPECT_EQ(weak.sample(logits, std::vector<int32_t>{0}), 0);              // 0.9 > 0.8
  EXPECT_EQ(weak.sample(logits, std::vector<int32_t>{0, 0, 0, 0, 0}), 0);  // still 0.9: once, not per occurrence
}

TEST(Sampler, FrequencyPenaltyIsSubtractedPerOccurrence) {
  Sampler s(SamplingParams{.temperature = 0.0f, .frequency_penalty = 0.2f});
  const std::vector<float> logits = {1.0f, 0.5f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 0}), 0);              // 1.0 - 0.4 = 0.6 > 0.5
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 0, 0}), 1);           // 1.0 - 0.6 = 0.4 < 0.5
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 1, 0, 1, 0, 1}), 0);  // both lose 0.6
}

TEST(Sampler, PenaltiesLookAtTheLastNTokensOnly) {
  const std::vector<float> logits = {1.0f, 0.8f};
  const std::vector<int32_t> history = {1, 0};  // token 0 is the most recent
  auto pick = [&](int32_t last_n) {
    Sampler s(SamplingParams{.temperature = 0.0f, .presence_penalty = 0.5f, .penalty_last_n = last_n});
    return s.sample(logits, history);
  };
  EXPECT_EQ(pick(0), 0);   // off
  EXPECT_EQ(pick(1), 1);   // only token 0 is penalised: 0.5 < 0.8
  EXPECT_EQ(pick(2), 0);   // both: 0.5 > 0.3
  EXPECT_EQ(pick(-1), 0);  // all of the history, the same
  EXPECT_EQ(pick(64), 0);  // a window longer than the history
  // Ids outside the vocabulary in the history are ignored.
  Sampler s(SamplingParams{.temperature = 0.0f, .presence_penalty = 0.5f});
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{-3, 2, 1000}), 0);
}

TEST(Sampler, PenaltiesApplyBeforeTruncation) {
  // Token 0 leads by far, but a presence penalty of 3 drops it below token 1; top-k 1 must then keep token 1.
  Sampler s(SamplingParams{.temperature = 1.0f, .top_k = 1, .presence_penalty = 3.0f, .seed = 2});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(std::vector<float>{3.0f, 1.0f, 0.5f}, std::vector<int32_t>{0}), 1);
}

// A fixed seed makes these deterministic; the tolerance is 4.5 standard deviations of a binomial proportion, so
// a correct sampler with another seed would also pass with near certainty, and a wrong temperature would not.
void expect_frequencies_match_softmax(float temperature, uint64_t seed) {
  const std::vector<float> logits = {0.0f, 0.5f, 1.0f, -0.5f, 2.0f, 1.5f, -1.0f, 0.2f};
  const std::vector<double> p = softmax(logits, temperature);
  constexpr int kDraws = 20000;
  Sampler s(plain(temperature, seed));
  const std::vector<int> counts = histogram(s, logits, kDraws);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double sigma = std::sqrt(p[i] * (1.0 - p[i]) / kDraws);
    EXPECT_NEAR(counts[i] / static_cast<double>(kDraws), p[i], 4.5 * sigma)
        << "token " << i << " at temperature " << temperature;
  }
}

TEST(Sampler, TemperatureOneFrequenciesMatchSoftmax) { expect_frequencies_match_softmax(1.0f, 1234); }

TEST(Sampler, TemperatureScalesTheLogits) {
  expect_frequencies_match_softmax(0.5f, 77);
  expect_frequencies_match_softmax(2.0f, 78);
}

TEST(Sampler, DefaultsOnALargeVocabularyPickFromTheTopForty) {
  std::mt19937 rng(3);
  const std::vector<float> logits = random_logits(rng, 129280, 2.0f);
  std::vector<float> sorted = logits;
  std::nth_element(sorted.begin(), sorted.begin() + 39, sorted.end(), std::greater<float>());
  const float fortieth = sorted[39];
  Sampler s(SamplingParams{});
  for (int i = 0; i < 100; ++i) EXPECT_GE(logits[static_cast<size_t>(s.sample(logits, {}))], fortieth);
}

TEST(Sampler, AllMinusInfinityGivesTheFirstToken) {
  const float inf = INFINITY;
  Sampler s(plain(1.0f));
  EXPECT_EQ(s.sample(std::vector<float>{-inf, -inf, -inf}, {}), 0);
  // A single finite token among -inf always wins.
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(std::vector<float>{-inf, 0.0f, -inf}, {}), 1);
}

TEST(Sampler, EmptyLogitsFail) {
  Sampler s(SamplingParams{});
  EXPECT_THROW(s.sample(std::vector<float>{}, {}), Error);
}

}  // namespace
}  // namespace hetmoe::engine
