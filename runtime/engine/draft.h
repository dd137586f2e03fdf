#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/engine/session.h"
#include "runtime/model/model.h"

namespace hetmoe::engine {

// Where speculative decoding's drafts come from.
enum class DraftSource { kNone, kNgram, kMtp };

// "none", "ngram" or "mtp"; a clear error for anything else.
DraftSource parse_draft_source(std::string_view name);
std::string_view draft_source_name(DraftSource source);

// Proposes the tokens likely to follow a sequence. The target model then evaluates the sequence's next token and
// the drafts in one batch (speculative decoding): decode reads every active weight once per step, so a step of
// k + 1 positions costs far less than k + 1 steps, and every draft the target agrees with is a token for free.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to `max` tokens that may follow `history` and then `next` (the token about to be evaluated), into `out`
  // (cleared first; empty when there is no guess).
  virtual void propose(std::span<const int32_t> history, int32_t next, int max, std::vector<int32_t>& out) = 0;
  // What must see the final hidden states of the session it drafts for (Session::observe), if anything.
  virtual HiddenObserver* hidden_observer() { return nullptr; }
};

// Prompt lookup: the longest n-gram (max_n down to min_n tokens) that ends the sequence and also occurs earlier in
// it; the drafts are the tokens that followed its latest earlier occurrence (the latest with max of them). Costs
// nothing to run and needs no model: it predicts text that repeats what the context holds (code edits, quoting,
// summaries, extraction).
class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(int min_n = 2, int max_n = 4);
  void propose(std::span<const int32_t> history, int32_t next, int max, std::vector<int32_t>& out) override;

 private:
  int min_n_, max_n_;
  std::vector<int32_t> seq_;  // scratch: history then next
};

// Drafts from the model's own MTP block (DeepSeek-V3/V3.2, GLM-4.5, Qwen3.5; Model::forward_mtp): the first from the
// trunk's last hidden state and the token about to be evaluated, each further one chained from the block's own output
// at the next position (one MTP block drafting several tokens, as vLLM runs it); each the argmax of the block's logits.
// The block attends over a cache of its own, one row per position of the session, and a position's row needs the
// hidden state there and the token after it: the drafter sees every hidden state the session computes, keeps those
// whose rows it has not written (and the last kKeep it wrote, for a rollback), and writes them as one batch at the
// next proposal (a long prompt's as it is evaluated, kChunk rows at a time). A row whose hidden state is gone (the
// drafter attached late, the session replaced tokens further back than kKeep) runs with zeros: its drafts are weaker,
// the output is the same.
class MtpDrafter final : public Drafter, public HiddenObserver {
 public:
  // Fails with a clear error when the model has no MTP block.
  MtpDrafter(model::Model& model, int64_t n_ctx);
  void propose(std::span<const int32_t> history, int32_t next, int max, std::vector<int32_t>& out) override;
  HiddenObserver* hidden_observer() override { return this; }
  void evaluated(int64_t pos0, std::span<const int32_t> tokens, std::span<const float> hidden) override;
  static constexpr int64_t kKeep = 64;
  static constexpr int64_t kChunk = 256;  // rows of one block pass at most

 private:
  // The block's rows from `pos` on are to be written again.
  void rewind(int64_t pos);
  // Writes the rows of positions done_ .. end - 1, next_ holding the token after each; the last row's output goes to
  // last_state_ and last_logits_.
  void write(int64_t end);

  model::Model& model_;
  model::KvCache cache_;
  int64_t done_ = 0;             // the block's rows stand for the session's positions below this one
  int64_t base_ = 0;             // states_ holds the hidden states of positions base_, base_ + 1, ...
  std::vector<float> states_;    // [positions][n_embd]: up to kKeep before done_, then the ones not yet written
  std::vector<int32_t> tokens_;  // the token at each of those positions (-1: never seen)
  int32_t tail_token_ = -1;      // the token after position done_ - 1 that its row assumed
  std::vector<int32_t> next_;    // scratch: the token after each position written
  std::vector<float> last_state_, last_logits_;  // the block's output at position done_ - 1: the first draft's
  std::vector<float> state_, chained_, logits_;  // the chain's
};

// How many drafts the next step should take, from what the run measured so far. The drafts' acceptance: each draft
// is taken to be accepted with probability a, a step's run ending at its first rejection, so a = accepted /
// (accepted + rejections), both sums decaying (by 0.95 a step) so that a = 0.8 before anything is seen soon gives
// way to the text's own. A step's cost: t0 for one token, t0 (1 + beta k) for a token and k drafts, running averages
// (beta 0.5 until the first step with drafts, whose measurement then replaces it). The next step takes the k in 0..max
// with the most tokens per unit of time, (1 + a + ... + a^k) / (1 + beta k): none when the drafts are rarely right or
// cost nearly a step each (a MoE's drafts read experts of their own). A step without drafts still checks the drafter's
// first guess against the token that follows (shadow), so the acceptance keeps being measured; every 32nd step goes
// without drafts to measure t0. A guess that costs (an MTP block's pass: a fair part of a step) is asked for only every
// 8th step without drafts, the interval doubling (up to 64) with each wrong guess and back to 8 with a right one; one
// that costs under 2 % of a step (a lookup) every time.
class DraftBudget {
 public:
  explicit DraftBudget(int max) : max_(max) {}
  int choose() const;
  // A step of one token took `seconds` (the proposal of a guess not counted).
  void plain_step(double seconds);
  // A step of a token and `drafted` drafts took `seconds`, their proposal included.
  void verify_step(int drafted, int accepted, double seconds);
  // Whether a step without drafts should ask the drafter for its guess.
  bool guess_due() const { return guess_cost_ < kCheapGuess || since_guess_ >= guess_every_; }
  // A guess was proposed in `seconds`, then checked against the token that came (agreed or not).
  void guessed(double seconds);
  void shadow(bool agreed);
  // A verification step whose time is not this sequence's alone (a server's step shared with others): what was
  // accepted counts, the time does not.
  void verified(int drafted, int accepted);
  // Whether a step of one token has been timed (choose() asks for one until then).
  bool calibrated() const { return t0_ > 0; }
  double acceptance() const { return accepted_ / (accepted_ + rejected_); }
  double cost_per_draft() const { return beta_; }

 private:
  static constexpr double kDecay = 0.95;
  static constexpr int kMeasureEvery = 32;
  static constexpr int kGuessEvery = 8, kGuessEveryMax = 64;
  static constexpr double kCheapGuess = 0.02;
  int max_;
  double accepted_ = 4, rejected_ = 1;
  double t0_ = 0, beta_ = 0.5;
  bool beta_measured_ = false;
  double guess_cost_ = 0;  // the last guess's time in one-token steps
  int since_plain_ = 0, since_guess_ = 0, guess_every_ = kGuessEvery;
};

// The drafter for `source` (null for kNone); an MTP drafter for sessions of `model` of up to n_ctx positions (its
// hidden_observer() goes to the session it drafts for). Fails when the model has no MTP block.
std::unique_ptr<Drafter> make_drafter(DraftSource source, model::Model& model, int64_t n_ctx);

}  // namespace hetmoe::engine
