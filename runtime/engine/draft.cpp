#include "runtime/engine/draft.h"

#include <algorithm>

#include "cpu_kernels/ops.h"
#include "runtime/error.h"

namespace hetmoe::engine {

DraftSource parse_draft_source(std::string_view name) {
  if (name == "none") return DraftSource::kNone;
  if (name == "ngram") return DraftSource::kNgram;
  if (name == "mtp") return DraftSource::kMtp;
  fail("--draft: '{}' is not a draft source (none, ngram, mtp)", name);
}

std::string_view draft_source_name(DraftSource source) {
  return source == DraftSource::kNgram ? "ngram" : source == DraftSource::kMtp ? "mtp" : "none";
}

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(std::max(1, min_n)), max_n_(std::max(min_n_, max_n)) {}

void NgramDrafter::propose(std::span<const int32_t> history, int32_t next, int max, std::vector<int32_t>& out) {
  out.clear();
  if (max <= 0) return;
  seq_.assign(history.begin(), history.end());
  seq_.push_back(next);
  const auto len = static_cast<int64_t>(seq_.size());
  for (int64_t n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const int32_t* suffix = seq_.data() + len - n;
    // The latest earlier occurrence followed by `max` tokens, else the latest one (an occurrence that overlaps the
    // suffix, as in a run of one token, is followed by fewer).
    int64_t latest = -1;
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + n, seq_.data() + start)) continue;
      if (latest < 0) latest = start;
      if (len - (start + n) >= max) {
        latest = start;
        break;
      }
    }
    if (latest >= 0) {
      const int64_t from = latest + n, count = std::min<int64_t>(max, len - from);
      out.assign(seq_.begin() + from, seq_.begin() + from + count);
      return;
    }
  }
}

int DraftBudget::choose() const {
  if (t0_ <= 0 || since_plain_ >= kMeasureEvery) return 0;
  const double a = acceptance();
  int best = 0;
  double best_rate = 1.0, tokens = 1.0, p = 1.0;
  for (int k = 1; k <= max_; ++k) {
    tokens += p *= a;
    const double rate = tokens / (1.0 + beta_ * k);
    if (rate > best_rate) best = k, best_rate = rate;
  }
  return best;
}

void DraftBudget::plain_step(double seconds) {
  t0_ = t0_ > 0 ? kDecay * t0_ + (1 - kDecay) * seconds : seconds;
  since_plain_ = 0;
  ++since_guess_;
}

void DraftBudget::guessed(double seconds) {
  guess_cost_ = t0_ > 0 ? seconds / t0_ : 0.0;
  since_guess_ = 0;
}

void DraftBudget::verified(int drafted, int accepted) {
  if (drafted <= 0) return;
  accepted_ = kDecay * accepted_ + accepted;
  rejected_ = kDecay * rejected_ + (accepted < drafted ? 1 : 0);
}

void DraftBudget::verify_step(int drafted, int accepted, double seconds) {
  ++since_plain_;
  if (drafted <= 0) return;
  verified(drafted, accepted);
  if (t0_ > 0) {
    // The first measurement replaces the prior: a step of drafts that cost a whole step each should not be taken
    // again for the prior's sake.
    const double beta = std::max(0.0, (seconds / t0_ - 1.0) / drafted);
    beta_ = beta_measured_ ? kDecay * beta_ + (1 - kDecay) * beta : beta;
    beta_measured_ = true;
  }
}

void DraftBudget::shadow(bool agreed) {
  guess_every_ = agreed ? kGuessEvery : std::min(2 * guess_every_, kGuessEveryMax);
  accepted_ = kDecay * accepted_ + (agreed ? 1 : 0);
  rejected_ = kDecay * rejected_ + (agreed ? 0 : 1);
}

namespace {

model::KvCache mtp_cache(const model::Model& model, int64_t n_ctx) {
  if (model.n_mtp() == 0)
    fail(
        "{}: the model carries no MTP block (nextn_predict_layers); --draft mtp needs a DeepSeek-V3/V3.2, GLM-4.5 or "
        "Qwen3.5 "
        "file that keeps it (or use --draft ngram)",
        model.file().path());
  return model.make_mtp_cache(n_ctx);
}

}  // namespace

MtpDrafter::MtpDrafter(model::Model& model, int64_t n_ctx)
    : model_(model), cache_(mtp_cache(model, n_ctx)), last_state_(static_cast<size_t>(model.config().n_embd)) {}

void MtpDrafter::rewind(int64_t pos) {
  done_ = std::max<int64_t>(pos, 0);
  tail_token_ = -1;     // the row at done_ - 1 is not the last one written any more: its output is not held
  if (done_ < base_) {  // its hidden state is gone: the row runs with zeros
    states_.clear();
    tokens_.clear();
    base_ = done_;
  }
}

void MtpDrafter::write(int64_t end) {
  const auto E = static_cast<size_t>(model_.config().n_embd);
  for (int64_t from = done_; from < end; from += kChunk) {
    const int64_t n = std::min(kChunk, end - from);
    model_.forward_mtp(
        std::span<const int32_t>(next_).subspan(static_cast<size_t>(from - done_), static_cast<size_t>(n)),
        states_.data() + static_cast<size_t>(from - base_) * E, from, cache_, last_state_.data(), last_logits_);
  }
  tail_token_ = next_.back();
  done_ = end;
  // Only the last kKeep positions' states stay before the ones not written, for the rows a rollback writes again.
  if (done_ - base_ > kKeep) {
    const int64_t drop = done_ - kKeep - base_;
    states_.erase(states_.begin(), states_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(drop) * E));
    tokens_.erase(tokens_.begin(),
                  tokens_.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(drop, tokens_.size())));
    base_ += drop;
  }
}

void MtpDrafter::evaluated(int64_t pos0, std::span<const int32_t> tokens, std::span<const float> hidden) {
  const auto E = static_cast<size_t>(model_.config().n_embd);
  const auto n = tokens.size();
  if (n == 0) return;
  // The session replaced tokens from pos0 on: the rows from pos0 - 1 on assumed the old ones. The same tokens again
  // (a recurrent cache's replay from its checkpoint) leave the rows written as they are.
  bool same = pos0 >= base_ && pos0 <= done_;
  for (size_t i = 0; same && i < n && pos0 + static_cast<int64_t>(i) <= done_; ++i) {
    const int64_t pos = pos0 + static_cast<int64_t>(i);
    const auto at = static_cast<size_t>(pos - base_);
    same = tokens[i] == (pos == done_ ? tail_token_ : at < tokens_.size() ? tokens_[at] : -1);
  }
  if (!same && (pos0 < done_ || (pos0 == done_ && done_ > 0))) rewind(pos0 - 1);
  // The states from pos0 on are these; positions between the ones held and pos0 were never seen (zeros, no token).
  const auto held = static_cast<size_t>(pos0 - base_);
  states_.resize(held * E, 0.0f);
  tokens_.resize(held, -1);
  if (hidden.size() == n * E) {
    states_.insert(states_.end(), hidden.begin(), hidden.end());
  } else {
    states_.resize(states_.size() + n * E, 0.0f);
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  // A long prompt's rows are written as it goes (all but the last position's, whose next token is not known yet), so
  // the states held stay a few chunks whatever its length.
  const int64_t last = base_ + static_cast<int64_t>(tokens_.size()) - 1;
  if (last - done_ < kChunk) return;
  next_.clear();
  for (int64_t i = done_; i < last; ++i) {
    const int32_t t = tokens_[static_cast<size_t>(i + 1 - base_)];
    if (t < 0) return;  // a position never seen: left to the next proposal, which has the history
    next_.push_back(t);
  }
  write(last);
}

void MtpDrafter::propose(std::span<const int32_t> history, int32_t next, int max, std::vector<int32_t>& out) {
  out.clear();
  const auto P = static_cast<int64_t>(history.size());
  const auto E = static_cast<size_t>(model_.config().n_embd);
  if (P == 0 || max <= 0 || P >= cache_.n_ctx()) return;
  // The session dropped positions this drafter wrote, or the last row assumed another token after it: written again.
  if (done_ > P || (done_ == P && tail_token_ != next)) rewind(P - 1);
  // The states of positions base_ .. P - 1: what the session evaluated (it may have dropped some of them since),
  // zeros for positions never seen; their tokens from the history.
  states_.resize(static_cast<size_t>(P - base_) * E, 0.0f);
  tokens_.assign(history.begin() + static_cast<std::ptrdiff_t>(base_), history.end());
  if (done_ < P) {
    next_.clear();
    for (int64_t i = done_; i < P; ++i) next_.push_back(i + 1 < P ? history[i + 1] : next);
    write(P);
  }
  // Drafts: the block's argmax at P - 1, then the block again at the next position on its own output (rows past P
  // that the session's positions later write again).
  const std::vector<float>* logits = &last_logits_;
  state_ = last_state_;
  const auto n_vocab = static_cast<int64_t>(last_logits_.size());
  for (int64_t pos = P;; ++pos) {
    const int64_t best = cpu::first_argmax(logits->data(), n_vocab);
    out.push_back(static_cast<int32_t>(std::clamp<int64_t>(best, 0, n_vocab - 1)));
    if (static_cast<int>(out.size()) == max || pos >= cache_.n_ctx()) break;
    next_.assign(1, out.back());
    chained_.assign(state_.begin(), state_.end());
    model_.forward_mtp(next_, chained_.data(), pos, cache_, state_.data(), logits_);
    logits = &logits_;
  }
}

std::unique_ptr<Drafter> make_drafter(DraftSource source, model::Model& model, int64_t n_ctx) {
  if (source == DraftSource::kNgram) return std::make_unique<NgramDrafter>();
  if (source == DraftSource::kMtp) return std::make_unique<MtpDrafter>(model, n_ctx);
  return nullptr;
}

}  // namespace hetmoe::engine
