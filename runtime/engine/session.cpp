#include "runtime/engine/session.h"

#include <optional>

#include "runtime/error.h"

namespace hetmoe::engine {

Session::Session(model::Model& model, int64_t n_ctx) : model_(model), cache_(model.make_cache(n_ctx)) {}

std::span<const float> Session::eval(std::span<const int32_t> tokens, const std::atomic<bool>* cancel) {
  if (tokens.empty()) fail("nothing to evaluate");
  if (static_cast<int64_t>(tokens.size()) > n_free())
    fail("context full: {} tokens do not fit ({} of {} positions used)", tokens.size(), n_past(), n_ctx());
  sync(cancel);
  if (cache_.has_recurrent()) {
    const std::optional<int64_t> newest = cache_.checkpoint_at_or_before(n_past());
    if (tokens.size() > 1 || !newest || n_past() - *newest >= kDecodeCheckpointEvery) cache_.checkpoint();
  }
  const auto start = std::chrono::steady_clock::now();
  model_.forward(tokens, n_past(), cache_, /*all_logits=*/false, logits_, nullptr, cancel);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (tokens.size() > 1) {
    counters_.prefill_tokens += static_cast<int64_t>(tokens.size());
    counters_.prefill_seconds += seconds;
  } else {
    counters_.decode_tokens += 1;
    counters_.decode_seconds += seconds;
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  return logits_;
}

void Session::truncate(int64_t n) {
  if (n < 0 || n > n_past()) fail("cannot keep {} of {} tokens", n, n_past());
  tokens_.resize(static_cast<size_t>(n));
}

int64_t Session::replay_pending() const {
  if (!cache_.has_recurrent() || cache_.recurrent_pos() == n_past()) return 0;
  return n_past() - cache_.checkpoint_at_or_before(n_past()).value_or(0);
}

void Session::sync(const std::atomic<bool>* cancel) {
  if (!cache_.has_recurrent() || cache_.recurrent_pos() == n_past()) return;
  const int64_t from = cache_.rollback(n_past());
  if (from < n_past()) {
    const std::span<const int32_t> again(tokens_.data() + from, tokens_.data() + n_past());
    model_.forward(again, from, cache_, /*all_logits=*/false, logits_, nullptr, cancel);
  }
}

}  // namespace hetmoe::engine
