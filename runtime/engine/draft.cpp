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

std::unique_ptr<Drafter> make_drafter(DraftSource source) {
  if (source == DraftSource::kNgram) return std::make_unique<NgramDrafter>();
  return nullptr;
}

}  // namespace hetmoe::engine
