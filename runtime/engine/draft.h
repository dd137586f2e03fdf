#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace hetmoe::engine {

// Where speculative decoding's drafts come from.
enum class DraftSource { kNone, kNgram };

// "none" or "ngram"; a clear error for anything else.
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

// How many drafts the next step should take, from what the run measured so far. The drafts' acceptance: each draft
// is taken to be accepted with probability a, a step's run ending at its first rejection, so a = accepted /
// (accepted + rejections), both sums decaying (by 0.95 a step) so that a = 0.8 before anything is seen soon gives
// way to the text's own. A step's cost: t0 for one token, t0 (1 + beta k) for a token and k drafts, running averages
// (beta 0.5 until measured). The next step takes the k in 0..max with the most tokens per unit of time,
// (1 + a + ... + a^k) / (1 + beta k): none when the drafts are rarely right or cost nearly a step each (a MoE's
// drafts read experts of their own). A step without drafts still checks the drafter's first guess against the token
// that follows (shadow), so the acceptance keeps being measured; every 32nd step goes without drafts to measure t0.
class DraftBudget {
 public:
  explicit DraftBudget(int max) : max_(max) {}
  int choose() const;
  void plain_step(double seconds);
  void verify_step(int drafted, int accepted, double seconds);
  void shadow(bool agreed);
  double acceptance() const { return accepted_ / (accepted_ + rejected_); }
  double cost_per_draft() const { return beta_; }

 private:
  static constexpr double kDecay = 0.95;
  static constexpr int kMeasureEvery = 32;
  int max_;
  double accepted_ = 4, rejected_ = 1;
  double t0_ = 0, beta_ = 0.5;
  int since_plain_ = 0;
};

// The drafter for `source` (null for kNone).
std::unique_ptr<Drafter> make_drafter(DraftSource source);

}  // namespace hetmoe::engine
