#include "runtime/engine/draft.h"

#include <algorithm>

#include "runtime/error.h"

namespace hetmoe::engine {

DraftSource parse_draft_source(std::string_view name) {
  if (name == "none") return DraftSource::kNone;
  if (name == "ngram") return DraftSource::kNgram;
  fail("--draft: '{}' is not a draft source (none, ngram)", name);
}

std::string_view draft_source_name(DraftSource source) { return source == DraftSource::kNgram ? "ngram" : "none"; }

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
}

void DraftBudget::verify_step(int drafted, int accepted, double seconds) {
  ++since_plain_;
  if (drafted <= 0) return;
  accepted_ = kDecay * accepted_ + accepted;
  rejected_ = kDecay * rejected_ + (accepted < drafted ? 1 : 0);
  if (t0_ > 0) beta_ = kDecay * beta_ + (1 - kDecay) * std::max(0.0, (seconds / t0_ - 1.0) / drafted);
}

void DraftBudget::shadow(bool agreed) {
  accepted_ = kDecay * accepted_ + (agreed ? 1 : 0);
  rejected_ = kDecay * rejected_ + (agreed ? 0 : 1);
}

std::unique_ptr<Drafter> make_drafter(DraftSource source) {
  if (source == DraftSource::kNgram) return std::make_unique<NgramDrafter>();
  return nullptr;
}

}  // namespace hetmoe::engine
