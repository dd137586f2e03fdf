// Speculative decoding: the rejection rule of Sampler::verify, the n-gram drafter, and generate() with drafts
// against generate() without them (the same tokens, the session left as plain decoding leaves it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine/draft.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/session.h"
#include "runtime/error.h"
#include "runtime/model/make_model.h"
#include "runtime/model/model.h"
#include "tests/support/compare.h"

namespace hetmoe::engine {
namespace {

namespace fs = std::filesystem;

std::string model_path(const std::string& name) { return (fs::path(HETMOE_TEST_DATA_DIR) / "models" / name).string(); }

// ---- the rejection rule ----

// How often each token comes out of verify() with `draft` proposed, over `draws` calls.
std::vector<double> verify_frequencies(const SamplingParams& params, const std::vector<float>& logits, int32_t draft,
                                       int draws) {
  Sampler s(params);
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) f[static_cast<size_t>(s.verify(logits, {}, draft))] += 1.0 / draws;
  return f;
}

std::vector<double> sample_frequencies(const SamplingParams& params, const std::vector<float>& logits, int draws) {
  Sampler s(params);
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) f[static_cast<size_t>(s.sample(logits, {}))] += 1.0 / draws;
  return f;
}

TEST(Verify, GreedyAcceptsExactlyTheArgmax) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  Sampler s({.temperature = 0.0f});
  EXPECT_EQ(s.verify(logits, {}, 1), 1);  // the argmax (ties to the lower id): accepted
  EXPECT_EQ(s.verify(logits, {}, 3), 1);  // its tie with a higher id: replaced by the argmax
  EXPECT_EQ(s.verify(logits, {}, 4), 1);
  // The penalties apply as in sample(): token 1 seen before loses its lead.
  Sampler p({.temperature = 0.0f, .repeat_penalty = 2.0f});
  const std::vector<int32_t> history = {1};
  EXPECT_EQ(p.verify(logits, history, 3), 3);
  EXPECT_EQ(p.verify(logits, history, 1), 3);
}

// Whatever the draft, verify()'s tokens are distributed as sample()'s: drafts the chain likes, dislikes, or cut
// (outside top-k, below min-p), with and without truncation. 200k draws each: a frequency's standard error is at
// most 0.0011, the bound 0.006.
TEST(Verify, TokensAreDistributedAsTheChainsWhateverTheDraft) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.2f, -0.5f, 1.7f, 0.9f, -2.0f, 1.2f};
  const SamplingParams configs[] = {
      {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 3},
      {.temperature = 0.7f, .top_k = 4, .top_p = 1.0f, .min_p = 0.0f, .seed = 4},
      {.temperature = 1.3f, .top_k = 0, .top_p = 0.9f, .min_p = 0.1f, .seed = 5},
  };
  const int draws = 200000;
  for (const SamplingParams& params : configs) {
    const std::vector<double> want = sample_frequencies(params, logits, draws);
    for (int32_t draft : {1, 4, 3, 6}) {
      SCOPED_TRACE(testing::Message() << "temperature " << params.temperature << " top-k " << params.top_k << " draft "
                                      << draft);
      const std::vector<double> got = verify_frequencies(params, logits, draft, draws);
      for (size_t t = 0; t < logits.size(); ++t) EXPECT_NEAR(got[t], want[t], 0.006) << "token " << t;
    }
  }
}

TEST(Verify, AcceptsADraftAsOftenAsTheChainWouldDrawIt) {
  // p = (0.6, 0.3, 0.1): a draft of token 1 is accepted 30 % of the time, and when it is not, the token is 0 or 2
  // in proportion 6:1.
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  const std::vector<double> f =
      verify_frequencies({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 9}, logits, 1, 200000);
  EXPECT_NEAR(f[1], 0.3, 0.006);
  EXPECT_NEAR(f[0], 0.6, 0.006);
  EXPECT_NEAR(f[2], 0.1, 0.006);
}

// ---- the n-gram drafter ----

TEST(NgramDrafter, ProposesWhatFollowedTheLongestRepeatedSuffix) {
  NgramDrafter d(2, 4);
  std::vector<int32_t> out;
  // ... 5 6 7 8 9 ... then 5 6 + next 7: the 3-gram 5 6 7 was followed by 8 9 10.
  const std::vector<int32_t> h = {1, 5, 6, 7, 8, 9, 10, 2, 3, 5, 6};
  d.propose(h, 7, 3, out);
  EXPECT_EQ(out, (std::vector<int32_t>{8, 9, 10}));
  d.propose(h, 7, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{8, 9}));
  // The longer match wins over a later shorter one: 6 7 also follows 4 later, but 5 6 7 was followed by 8.
  const std::vector<int32_t> h2 = {5, 6, 7, 8, 1, 6, 7, 4, 5, 6};
  d.propose(h2, 7, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{8}));
  // Of equal matches the latest: 3 4 was followed by 9, later by 5.
  d.propose(std::vector<int32_t>{3, 4, 9, 0, 3, 4, 5, 0, 3}, 4, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{5}));
}

TEST(NgramDrafter, NothingWithoutARepeatAndAFullRunOfOneToken) {
  NgramDrafter d(2, 4);
  std::vector<int32_t> out = {1};
  d.propose(std::vector<int32_t>{1, 2, 3, 4}, 5, 4, out);
  EXPECT_TRUE(out.empty());
  d.propose(std::vector<int32_t>{1, 2, 3, 4}, 5, 0, out);
  EXPECT_TRUE(out.empty());
  d.propose({}, 5, 4, out);
  EXPECT_TRUE(out.empty());
  // A run of one token: the occurrence that overlaps the suffix has one token after it; an earlier one has four.
  d.propose(std::vector<int32_t>{9, 9, 9, 9, 9, 9, 9}, 9, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{9, 9, 9, 9}));
}

TEST(Draft, SourcesByName) {
  EXPECT_EQ(parse_draft_source("none"), DraftSource::kNone);
  EXPECT_EQ(parse_draft_source("ngram"), DraftSource::kNgram);
  EXPECT_THROW(parse_draft_source("4"), Error);
  EXPECT_EQ(parse_draft_source("mtp"), DraftSource::kMtp);
  auto m = model::Model::load(model_path("tiny-deepseek3-Q4_K_M.gguf"), 2);
  EXPECT_EQ(make_drafter(DraftSource::kNone, *m, 32), nullptr);
  EXPECT_NE(make_drafter(DraftSource::kNgram, *m, 32), nullptr);
  // A file without an MTP block: a clear error that says what to use instead.
  EXPECT_EQ(m->n_mtp(), 0);
  try {
    make_drafter(DraftSource::kMtp, *m, 32);
    ADD_FAILURE() << "an MTP drafter on a model without the block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no MTP block"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--draft ngram"), std::string::npos) << e.what();
  }
}

// ---- the draft budget ----

// Step times are given here, not measured: 10 ms for one token, a draft costing beta of that.
TEST(DraftBudget, FirstMeasuresAStepThenDraftsByTheMeasuredRates) {
  DraftBudget b(8);
  EXPECT_EQ(b.choose(), 0);  // nothing measured yet: one plain step first
  b.plain_step(0.010);
  // The prior (a = 0.8, beta = 0.5): (1 + .8 + .64) / 2 beats one and three drafts.
  EXPECT_EQ(b.choose(), 2);
  // Drafts that cost 0.65 of a step each and are right half the time: none pays.
  // The first step with drafts replaces the prior cost; later ones move it by their share.
  b.verify_step(3, 1, 0.010 * (1 + 0.65 * 3));
  EXPECT_NEAR(b.cost_per_draft(), 0.65, 1e-9);
  for (int i = 0; i < 199; ++i) b.verify_step(3, 1, 0.010 * (1 + 0.65 * 3));
  EXPECT_NEAR(b.acceptance(), 0.5, 0.01);
  EXPECT_NEAR(b.cost_per_draft(), 0.65, 0.01);
  b.plain_step(0.010);
  EXPECT_EQ(b.choose(), 0);
  // The drafts then get cheap and always right: all eight.
  for (int i = 0; i < 31; ++i) b.verify_step(8, 8, 0.010 * (1 + 0.05 * 8));
  b.plain_step(0.010);
  for (int i = 0; i < 200; ++i) b.shadow(true);
  for (int i = 0; i < 31; ++i) b.verify_step(8, 8, 0.010 * (1 + 0.05 * 8));
  EXPECT_GT(b.acceptance(), 0.95);
  EXPECT_EQ(b.choose(), 8);
  // Every 32nd step measures one token's time again.
  b.verify_step(8, 8, 0.010 * (1 + 0.05 * 8));
  EXPECT_EQ(b.choose(), 0);
  b.plain_step(0.010);
  EXPECT_EQ(b.choose(), 8);
  // Guesses checked afterwards (steps without drafts) move the acceptance too.
  for (int i = 0; i < 200; ++i) b.shadow(false);
  EXPECT_LT(b.acceptance(), 0.01);
  EXPECT_EQ(b.choose(), 0);
  // A guess that costs next to nothing is asked for at every step without drafts; one that costs a fifth of a step
  // at every eighth after a right guess, the interval doubling with each wrong one up to 64.
  b.guessed(0.0001);
  b.plain_step(0.010);
  EXPECT_TRUE(b.guess_due());
  auto interval = [&b] {  // steps until the next guess is due
    b.guessed(0.002);
    int steps = 0;
    do {
      b.plain_step(0.010);
      ++steps;
    } while (!b.guess_due() && steps < 1000);
    return steps;
  };
  b.shadow(true);
  EXPECT_EQ(interval(), 8);
  b.shadow(false);
  EXPECT_EQ(interval(), 16);
  b.shadow(false);
  EXPECT_EQ(interval(), 32);
  for (int i = 0; i < 4; ++i) b.shadow(false);
  EXPECT_EQ(interval(), 64);
  b.shadow(true);
  EXPECT_EQ(interval(), 8);
}

// ---- generation with drafts ----

// Drafts the continuation plain greedy decoding produced (`ref`, after a prompt of n_prompt tokens), with every
// third draft wrong: the steps accept some drafts and reject others at every depth.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(std::vector<int32_t> ref, size_t n_prompt, int32_t n_vocab)
      : ref_(std::move(ref)), n_prompt_(n_prompt), n_vocab_(n_vocab) {}
  void propose(std::span<const int32_t> history, int32_t, int max, std::vector<int32_t>& out) override {
    out.clear();
    for (size_t i = history.size() + 1 - n_prompt_; i < ref_.size() && static_cast<int>(out.size()) < max; ++i)
      out.push_back(++calls_ % 3 == 0 ? (ref_[i] + 1) % n_vocab_ : ref_[i]);
  }

 private:
  std::vector<int32_t> ref_;
  size_t n_prompt_;
  int32_t n_vocab_;
  int64_t calls_ = 0;
};

struct Outcome {
  GenerateResult result;
  std::vector<int32_t> session_tokens;
  std::vector<float> next_logits;  // after the generation: the logits of one more token, evaluated
};

// Drafts as the drafter has them (adaptive: as a DraftBudget chooses from the measured step times, which these
// tests must not depend on, except where they only check the tokens).
Outcome generate_on(model::Model& m, const std::vector<int32_t>& prompt, int64_t n, Drafter* drafter, int draft_max,
                    const std::function<bool(int32_t)>& on_token = {}, bool adaptive = false) {
  Session s(m, 96);
  if (drafter) s.observe(drafter->hidden_observer());
  const std::span<const float> logits = s.eval(prompt);
  Sampler sampler({.temperature = 0.0f});
  Outcome r;
  r.result = generate(s, logits, sampler, nullptr,
                      {.max_tokens = n, .drafter = drafter, .draft_max = draft_max, .adaptive = adaptive}, on_token);
  r.session_tokens = s.tokens();
  const int32_t more[1] = {r.result.tokens.back()};
  const std::span<const float> next = s.eval(more);
  r.next_logits.assign(next.begin(), next.end());
  return r;
}

// The greedy token of `logits` and its margin over the runner-up.
float top_margin(std::span<const float> logits) {
  std::vector<float> v(logits.begin(), logits.end());
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
  return v[0] - v[1];
}

// F32 files (make-model's tiny presets, with the architectures that keep recurrent state): a batch differs from one
// row at a time only in summation order, so drafts change nothing: the same tokens, the session holding the same
// ones, the logits after it the same to 1e-4. Drafts of every depth are accepted and rejected (the rejected ones'
// cache rows are forgotten, the recurrent state replayed).
TEST(Speculative, F32ModelsGiveThePlainGreedyTokensAndSession) {
  for (const std::string preset : {"tiny-deepseek-v3", "tiny-qwen3.5-moe", "tiny-deepseek-v4"}) {
    SCOPED_TRACE(preset);
    const fs::path path = fs::temp_directory_path() / ("hetmoe-speculative-" + preset + ".gguf");
    make_model({.preset = preset, .out_path = path.string(), .type = "F32", .threads = 2});
    auto m = model::Model::load(path.string(), 2);
    fs::remove(path);
    const std::vector<int32_t> prompt = {3, 17, 42, 100, 7, 255, 256, 300};
    const int64_t n = 40;
    const Outcome plain = generate_on(*m, prompt, n, nullptr, 0);
    for (int k : {1, 3, 6}) {
      SCOPED_TRACE(k);
      OracleDrafter oracle(plain.result.tokens, prompt.size(), static_cast<int32_t>(m->config().n_vocab));
      const Outcome spec = generate_on(*m, prompt, n, &oracle, k);
      EXPECT_EQ(spec.result.tokens, plain.result.tokens);
      EXPECT_EQ(spec.session_tokens, plain.session_tokens);
      EXPECT_LT(test_support::relative_rms(spec.next_logits, plain.next_logits), 1e-4);
      EXPECT_GT(spec.result.accepted, 0);
      EXPECT_LT(spec.result.accepted, spec.result.drafted);
      EXPECT_LT(spec.result.steps, n - 1);
    }
    // With the draft count chosen as the run goes (by step times): whatever it chooses, the same tokens.
    OracleDrafter oracle(plain.result.tokens, prompt.size(), static_cast<int32_t>(m->config().n_vocab));
    const Outcome adaptive = generate_on(*m, prompt, n, &oracle, 6, {}, /*adaptive=*/true);
    EXPECT_EQ(adaptive.result.tokens, plain.result.tokens);
    EXPECT_EQ(adaptive.session_tokens, plain.session_tokens);
  }
}

// The reference files in their quantized types: the verification batch takes other kernels than one row (tiles
// from 4 rows of an expert), equal to rounding, so the batching rules hold: the tokens are the plain ones up to
// where they part, and they part only where plain decoding's margin is below 0.1.
TEST(Speculative, QuantizedModelsFollowPlainGreedyDecoding) {
  for (const std::string name : {"tiny-deepseek3-Q4_K_M.gguf", "tiny-qwen3moe-Q4_K_M.gguf", "tiny-mixtral-Q4_K_M.gguf",
                                 "tiny-qwen35moe-Q4_K_M.gguf", "tiny-gptoss-MXFP4_MOE.gguf"}) {
    SCOPED_TRACE(name);
    auto m = model::Model::load(model_path(name), 2);
    const std::vector<int32_t> prompt = {11, 64, 128, 5, 11, 64};
    const int64_t n = 32;
    // Plain greedy decoding with each step's margin.
    std::vector<float> margins;
    Session s(*m, 96);
    std::vector<float> logits;
    {
      const std::span<const float> l = s.eval(prompt);
      logits.assign(l.begin(), l.end());
    }
    Sampler greedy({.temperature = 0.0f});
    std::vector<int32_t> plain;
    for (int64_t i = 0; i < n; ++i) {
      margins.push_back(top_margin(logits));
      plain.push_back(greedy.sample(logits, s.tokens()));
      const int32_t one[1] = {plain.back()};
      const std::span<const float> l = s.eval(one);
      logits.assign(l.begin(), l.end());
    }
    OracleDrafter oracle(plain, prompt.size(), static_cast<int32_t>(m->config().n_vocab));
    const Outcome spec = generate_on(*m, prompt, n, &oracle, 4);
    ASSERT_EQ(spec.result.tokens.size(), static_cast<size_t>(n));
    EXPECT_GT(spec.result.accepted, 0);
    for (int64_t i = 0; i < n; ++i) {
      if (spec.result.tokens[i] == plain[i]) continue;
      EXPECT_LT(margins[i], 0.1f) << "parted at step " << i << " at a clear margin";
      break;
    }
  }
}

// The session ends as plain decoding leaves it whatever stops the generation inside a step's accepted drafts: the
// limit (its last token is not evaluated) or the callback (the token it refused is not evaluated).
TEST(Speculative, StopsInsideAStepLeaveTheSessionAsPlainDecodingDoes) {
  auto m = model::Model::load(model_path("tiny-deepseek3-Q4_K_M.gguf"), 2);
  const std::vector<int32_t> prompt = {3, 17, 42, 100, 7};
  const Outcome plain = generate_on(*m, prompt, 24, nullptr, 0);
  for (int64_t n : {1, 2, 5, 9}) {
    SCOPED_TRACE(n);
    OracleDrafter oracle(plain.result.tokens, prompt.size(), static_cast<int32_t>(m->config().n_vocab));
    const Outcome spec = generate_on(*m, prompt, n, &oracle, 8);
    ASSERT_EQ(spec.result.tokens.size(), static_cast<size_t>(n));
    EXPECT_EQ(spec.result.stop, StopReason::kMaxTokens);
    EXPECT_EQ(spec.session_tokens.size(), prompt.size() + static_cast<size_t>(n) - 1);
  }
  for (size_t stop_at : {size_t{1}, size_t{3}, size_t{6}}) {
    SCOPED_TRACE(stop_at);
    OracleDrafter oracle(plain.result.tokens, prompt.size(), static_cast<int32_t>(m->config().n_vocab));
    size_t seen = 0;
    const Outcome spec = generate_on(*m, prompt, 24, &oracle, 8, [&](int32_t) { return ++seen <= stop_at; });
    EXPECT_EQ(spec.result.stop, StopReason::kCallback);
    ASSERT_EQ(spec.result.tokens.size(), stop_at + 1);
    // Everything before the refused token, and not it.
    EXPECT_EQ(spec.session_tokens.size(), prompt.size() + stop_at);
  }
}

// A draft batch that fits the context only in part is cut to fit; a full context still ends the generation.
TEST(Speculative, DraftsNeverOverrunTheContext) {
  auto m = model::Model::load(model_path("tiny-qwen3moe-Q4_K_M.gguf"), 2);
  Session s(*m, 12);
  const std::vector<int32_t> prompt = {5, 6, 7, 5, 6, 7, 5, 6};
  const std::span<const float> logits = s.eval(prompt);
  Sampler sampler({.temperature = 0.0f});
  NgramDrafter ngram;
  const GenerateResult r = generate(s, logits, sampler, nullptr,
                                    {.max_tokens = 50, .drafter = &ngram, .draft_max = 8, .adaptive = false}, {});
  EXPECT_EQ(r.stop, StopReason::kContextFull);
  EXPECT_EQ(s.n_past(), 12);
  EXPECT_EQ(r.tokens.size(), 5u);  // four evaluated, the fifth sampled when the context was full
}

// ---- MTP drafts ----

// The files with an MTP block (GLM-4.5's NextN, DeepSeek-V3.2's, Qwen3.5's) load it apart from the trunk: the trunk has
// block_count - nextn_predict_layers blocks and the block is there to draft with.
TEST(Mtp, TheBlockIsBoundAfterTheTrunk) {
  for (const auto& [name, trunk] :
       {std::pair{"tiny-glm4moe-Q4_K_M.gguf", 3}, std::pair{"tiny-deepseek32-Q4_K_M.gguf", 3},
        std::pair{"tiny-qwen35moe-Q4_K_M.gguf", 4}}) {
    SCOPED_TRACE(name);
    auto m = model::Model::load(model_path(name), 2);
    EXPECT_EQ(m->config().n_layer, trunk);
    EXPECT_EQ(m->n_mtp(), 1);
  }
}

// The drafts after a prompt are the same whether the session evaluated it in one batch or a token at a time (the
// block's rows are written from the hidden states the session handed over, as one batch or several), and after the
// session dropped tokens and evaluated others in their place (the rows rewritten).
TEST(Mtp, DraftsDoNotDependOnHowTheSessionGotThere) {
  for (const std::string name :
       {"tiny-glm4moe-Q4_K_M.gguf", "tiny-deepseek32-Q4_K_M.gguf", "tiny-qwen35moe-Q4_K_M.gguf"}) {
    SCOPED_TRACE(name);
    auto m = model::Model::load(model_path(name), 2);
    const std::vector<int32_t> prompt = {11, 64, 128, 5, 11, 64, 300, 2, 19, 7};
    const int32_t next = 42;
    auto drafts_after = [&](const std::function<void(Session&, Drafter&)>& evaluate) {
      Session s(*m, 64);
      const std::unique_ptr<Drafter> d = make_drafter(DraftSource::kMtp, *m, s.n_ctx());
      s.observe(d->hidden_observer());
      evaluate(s, *d);
      EXPECT_EQ(s.tokens(), prompt);
      std::vector<int32_t> out;
      d->propose(s.tokens(), next, 4, out);
      EXPECT_EQ(out.size(), 4u);
      for (int32_t t : out) EXPECT_TRUE(t >= 0 && t < m->config().n_vocab);
      // Asked again for the same position, the same drafts (the block's rows past the session's are rewritten).
      std::vector<int32_t> again;
      d->propose(s.tokens(), next, 4, again);
      EXPECT_EQ(again, out);
      return out;
    };
    const std::vector<int32_t> batch = drafts_after([&](Session& s, Drafter&) { s.eval(prompt); });
    EXPECT_EQ(drafts_after([&](Session& s, Drafter&) {
                for (int32_t t : prompt) s.eval(std::span<const int32_t>(&t, 1));
              }),
              batch);
    EXPECT_EQ(drafts_after([&](Session& s, Drafter&) {
                s.eval(std::span<const int32_t>(prompt).first(4));
                s.eval(std::span<const int32_t>(prompt).subspan(4, 3));
                s.eval(std::span<const int32_t>(prompt).subspan(7));
              }),
              batch);
    // Other tokens after the sixth, drafted from, then dropped: the prompt's tail evaluated in their place (the rows
    // from the fifth position on written again).
    const std::function<void(Session&, Drafter&)> replaced = [&](Session& s, Drafter& d) {
      s.eval(std::span<const int32_t>(prompt).first(6));
      const std::vector<int32_t> other = {9, 9, 9};
      s.eval(other);
      std::vector<int32_t> out;
      d.propose(s.tokens(), 3, 2, out);
      s.truncate(6);
      s.eval(std::span<const int32_t>(prompt).subspan(6));
    };
    EXPECT_EQ(drafts_after(replaced), batch);
    // A draft of one token at another next token: that position's row written again, then the chain.
    Session s(*m, 64);
    const std::unique_ptr<Drafter> d = make_drafter(DraftSource::kMtp, *m, s.n_ctx());
    s.observe(d->hidden_observer());
    s.eval(prompt);
    std::vector<int32_t> out;
    d->propose(s.tokens(), 7, 4, out);
    d->propose(s.tokens(), next, 4, out);
    EXPECT_EQ(out, batch);
  }
}

// A prompt longer than a block pass (MtpDrafter::kChunk rows) has its rows written while it is evaluated: the drafts
// after it are those after the same prompt evaluated in pieces of other sizes.
TEST(Mtp, LongPromptsAreWrittenAsTheyAreEvaluated) {
  auto m = model::Model::load(model_path("tiny-glm4moe-Q4_K_M.gguf"), 2);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(m->config().n_vocab - 1));
  std::vector<int32_t> prompt(3 * MtpDrafter::kChunk + 40);
  for (int32_t& t : prompt) t = id(rng);
  auto drafts_after = [&](size_t piece) {
    Session s(*m, static_cast<int64_t>(prompt.size()) + 8);
    MtpDrafter d(*m, s.n_ctx());
    s.observe(&d);
    for (size_t i = 0; i < prompt.size(); i += piece)
      s.eval(std::span<const int32_t>(prompt).subspan(i, std::min(piece, prompt.size() - i)));
    std::vector<int32_t> out;
    d.propose(s.tokens(), 42, 3, out);
    return out;
  };
  const std::vector<int32_t> whole = drafts_after(prompt.size());
  EXPECT_EQ(whole.size(), 3u);
  EXPECT_EQ(drafts_after(100), whole);
  EXPECT_EQ(drafts_after(300), whole);
}

// Rollbacks further back than the states the drafter keeps (MtpDrafter::kKeep): the rows there run with a zero
// state, and the drafter still drafts, whether the session evaluated again before the proposal or not.
TEST(Mtp, RollbacksPastTheKeptStatesStillDraft) {
  auto m = model::Model::load(model_path("tiny-glm4moe-Q4_K_M.gguf"), 2);
  std::vector<int32_t> prompt(2 * MtpDrafter::kKeep + 20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 5) % m->config().n_vocab);
  Session s(*m, 256);
  MtpDrafter d(*m, s.n_ctx());
  s.observe(&d);
  s.eval(prompt);
  std::vector<int32_t> out;
  d.propose(s.tokens(), 1, 3, out);
  ASSERT_EQ(out.size(), 3u);
  // Dropped and not evaluated again: the proposal comes straight after the truncation.
  s.truncate(10);
  d.propose(s.tokens(), 2, 3, out);
  EXPECT_EQ(out.size(), 3u);
  // Evaluated again from far back, then dropped to just before what was evaluated again.
  s.eval(std::span<const int32_t>(prompt).subspan(10));
  d.propose(s.tokens(), 1, 3, out);
  s.truncate(5);
  s.eval(std::span<const int32_t>(prompt).subspan(5, 100));
  s.truncate(4);
  d.propose(s.tokens(), prompt[4], 3, out);
  EXPECT_EQ(out.size(), 3u);
  for (int32_t t : out) EXPECT_TRUE(t >= 0 && t < m->config().n_vocab);
}

// With the forward pass, its caches and the experts on the emulated device, the trunk's hidden states come back to
// the host and the block runs there: the same drafts as on the host.
TEST(Mtp, DraftsWithThePassOnTheEmulatedDeviceAsOnTheHost) {
  for (const std::string name :
       {"tiny-glm4moe-Q4_K_M.gguf", "tiny-deepseek32-Q4_K_M.gguf", "tiny-qwen35moe-Q4_K_M.gguf"}) {
    SCOPED_TRACE(name);
    const std::vector<int32_t> prompt = {11, 64, 128, 5, 11, 64, 300, 2};
    auto drafts_on = [&](const std::string& kind) {
      auto e = Engine::open(
          {.model = model_path(name), .threads = 2, .device = {.kind = kind, .memory_gb = 0.1, .move_rows = 2}});
      EXPECT_EQ(e->model().pass_on_device(), kind == "emulated");
      Session s(e->model(), 32);
      const std::unique_ptr<Drafter> d = make_drafter(DraftSource::kMtp, e->model(), s.n_ctx());
      s.observe(d->hidden_observer());
      s.eval(std::span<const int32_t>(prompt).first(5));
      s.eval(std::span<const int32_t>(prompt).subspan(5));
      std::vector<int32_t> out;
      d->propose(s.tokens(), 42, 4, out);
      return out;
    };
    const std::vector<int32_t> host = drafts_on("cpu");
    EXPECT_EQ(host.size(), 4u);
    EXPECT_EQ(drafts_on("emulated"), host);
  }
}

// make-model writes an MTP block on request; on an F32 file MTP drafts change nothing: the plain greedy tokens, the
// session holding the same ones, the logits after it the same to 1e-4.
TEST(Mtp, F32ModelGivesThePlainGreedyTokensAndSession) {
  const fs::path path = fs::temp_directory_path() / "hetmoe-speculative-mtp.gguf";
  make_model({.preset = "tiny-deepseek-v3", .out_path = path.string(), .type = "F32", .threads = 2, .mtp = true});
  auto m = model::Model::load(path.string(), 2);
  fs::remove(path);
  ASSERT_EQ(m->n_mtp(), 1);
  const std::vector<int32_t> prompt = {3, 17, 42, 100, 7, 255, 256, 300};
  const int64_t n = 32;
  const Outcome plain = generate_on(*m, prompt, n, nullptr, 0);
  for (int k : {1, 4}) {
    SCOPED_TRACE(k);
    const std::unique_ptr<Drafter> mtp = make_drafter(DraftSource::kMtp, *m, 96);
    const Outcome spec = generate_on(*m, prompt, n, mtp.get(), k);
    EXPECT_EQ(spec.result.tokens, plain.result.tokens);
    EXPECT_EQ(spec.session_tokens, plain.session_tokens);
    EXPECT_LT(test_support::relative_rms(spec.next_logits, plain.next_logits), 1e-4);
    EXPECT_GT(spec.result.drafted, 0);
  }
  // The presets without an MTP block in their family refuse it.
  EXPECT_THROW(make_model({.preset = "tiny-qwen3.5-moe", .out_path = path.string(), .type = "F32", .mtp = true}),
               Error);
}

// With MTP drafts the output follows plain greedy decoding (as the quantized files' verification batches do: the
// tokens part only where plain decoding's margin is below 0.1); drafts are proposed and verified, and the session
// holds what plain decoding leaves in it up to that point.
TEST(Mtp, SpeculativeDecodingFollowsPlainGreedyDecoding) {
  for (const std::string name :
       {"tiny-glm4moe-Q4_K_M.gguf", "tiny-deepseek32-Q4_K_M.gguf", "tiny-qwen35moe-Q4_K_M.gguf"}) {
    SCOPED_TRACE(name);
    auto m = model::Model::load(model_path(name), 2);
    const std::vector<int32_t> prompt = {11, 64, 128, 5, 11, 64};
    const int64_t n = 24;
    const Outcome plain = generate_on(*m, prompt, n, nullptr, 0);
    std::vector<float> margins;
    {
      Session s(*m, 96);
      std::span<const float> l = s.eval(prompt);
      for (int64_t i = 0; i < n; ++i) {
        margins.push_back(top_margin(l));
        const int32_t one[1] = {plain.result.tokens[static_cast<size_t>(i)]};
        l = s.eval(one);
      }
    }
    for (int k : {1, 3}) {
      SCOPED_TRACE(k);
      const std::unique_ptr<Drafter> mtp = make_drafter(DraftSource::kMtp, *m, 96);
      const Outcome spec = generate_on(*m, prompt, n, mtp.get(), k);
      ASSERT_EQ(spec.result.tokens.size(), static_cast<size_t>(n));
      EXPECT_GT(spec.result.drafted, 0);
      EXPECT_LE(spec.result.accepted, spec.result.drafted);
      EXPECT_GT(spec.result.draft_seconds, 0.0);
      size_t same = 0;
      while (same < plain.result.tokens.size() && spec.result.tokens[same] == plain.result.tokens[same]) ++same;
      if (same < plain.result.tokens.size()) {
        EXPECT_LT(margins[same], 0.1f) << "parted at step " << same << " at a clear margin";
      } else {
        EXPECT_EQ(spec.session_tokens, plain.session_tokens);
      }
    }
  }
}

}  // namespace
}  // namespace hetmoe::engine
