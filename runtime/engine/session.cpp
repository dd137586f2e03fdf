#include "runtime/engine/session.h"

#include <optional>

#include "runtime/error.h"

namespace hetmoe::engine {

Session::Session(model::Model& model, int64_t n_ctx) : model_(model), cache_(model.make_cache(n_ctx)) {}

void Session::check_fits(size_t n) const {
  if (n == 0) fail("nothing to evaluate");
  if (static_cast<int64_t>(n) > n_free())
    fail("context full: {} tokens do not fit ({} of {} positions used)", n, n_past(), n_ctx());
}

void Session::prepare(size_t n, const std::atomic<bool>* cancel) {
  check_fits(n);
  sync(cancel);
  if (cache_.has_recurrent()) {
    const std::optional<int64_t> newest = cache_.checkpoint_at_or_before(n_past());
    if (n > 1 || !newest || n_past() - *newest >= kDecodeCheckpointEvery) cache_.checkpoint();
  }
}

void Session::account(std::span<const int32_t> tokens, double seconds, bool verify) {
  if (verify) {
    counters_.verify_steps += 1;
    counters_.verify_tokens += static_cast<int64_t>(tokens.size());
    counters_.verify_seconds += seconds;
  } else if (tokens.size() > 1) {
    counters_.prefill_tokens += static_cast<int64_t>(tokens.size());
    counters_.prefill_seconds += seconds;
  } else {
    counters_.decode_tokens += 1;
    counters_.decode_seconds += seconds;
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

void Session::observe(HiddenObserver* observer) {
  if (observer && model_.config().hc_streams > 0)
    fail("{}: a hyper-connected model's final hidden states are not kept (no MTP drafts)", model_.file().path());
  observer_ = observer;
}

void Session::run(std::span<const int32_t> tokens, int64_t pos0, model::SequenceBatch::Logits logits,
                  std::vector<float>& out, const std::atomic<bool>* cancel) {
  const model::SequenceBatch one{
      .tokens = tokens, .pos0 = pos0, .cache = &cache_, .logits = logits, .hidden = observer_ != nullptr};
  model_.forward(std::span<const model::SequenceBatch>(&one, 1), out, nullptr, cancel);
}

void Session::notify(int64_t pos0, std::span<const int32_t> tokens, std::span<const float> hidden) {
  if (observer_) observer_->evaluated(pos0, tokens, hidden);
}

std::span<const float> Session::eval(std::span<const int32_t> tokens, const std::atomic<bool>* cancel) {
  prepare(tokens.size(), cancel);
  const auto start = std::chrono::steady_clock::now();
  const int64_t pos0 = n_past();
  run(tokens, pos0, model::SequenceBatch::Logits::kLast, logits_, cancel);
  account(tokens, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  notify(pos0, tokens, model_.hidden());
  return logits_;
}

std::span<const float> Session::eval_all(std::span<const int32_t> tokens, const std::atomic<bool>* cancel) {
  prepare(tokens.size(), cancel);
  const auto start = std::chrono::steady_clock::now();
  const int64_t pos0 = n_past();
  run(tokens, pos0, model::SequenceBatch::Logits::kAll, all_logits_, cancel);
  account(tokens, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), /*verify=*/true);
  notify(pos0, tokens, model_.hidden());
  const size_t n_vocab = static_cast<size_t>(model_.config().n_vocab);
  logits_.assign(all_logits_.end() - static_cast<std::ptrdiff_t>(n_vocab), all_logits_.end());
  return all_logits_;
}

void Session::eval_batch(std::span<const BatchPart> parts, const std::atomic<bool>* cancel) {
  if (parts.empty()) fail("nothing to evaluate: the batch is empty");
  model::Model& model = parts.front().session->model_;
  for (size_t i = 0; i < parts.size(); ++i) {
    const BatchPart& part = parts[i];
    if (&part.session->model_ != &model) fail("the sessions of a batch must run on one model");
    for (size_t j = 0; j < i; ++j)
      if (parts[j].session == part.session) fail("a session appears twice in one batch");
    part.session->check_fits(part.tokens.size());
  }
  thread_local std::vector<model::SequenceBatch> batch;
  batch.clear();
  for (const BatchPart& part : parts) {
    part.session->prepare(part.tokens.size(), cancel);
    batch.push_back({.tokens = part.tokens,
                     .pos0 = part.session->n_past(),
                     .cache = &part.session->cache_,
                     .logits = part.all_logits ? model::SequenceBatch::Logits::kAll
                               : part.logits   ? model::SequenceBatch::Logits::kLast
                                               : model::SequenceBatch::Logits::kNone,
                     .hidden = part.session->observer_ != nullptr});
  }
  thread_local std::vector<float> logits;
  const auto start = std::chrono::steady_clock::now();
  model.forward(batch, logits, nullptr, cancel);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t n_vocab = static_cast<size_t>(model.config().n_vocab);
  const size_t E = static_cast<size_t>(model.config().n_embd);
  const std::span<const float> hidden = model.hidden();
  size_t row = 0;
  for (const BatchPart& part : parts) {
    Session& session = *part.session;
    if (part.all_logits) {
      const auto first = logits.begin() + static_cast<std::ptrdiff_t>(row * n_vocab);
      row += part.tokens.size();
      session.all_logits_.assign(first, logits.begin() + static_cast<std::ptrdiff_t>(row * n_vocab));
      session.logits_.assign(session.all_logits_.end() - static_cast<std::ptrdiff_t>(n_vocab),
                             session.all_logits_.end());
    } else if (part.logits) {
      session.logits_.assign(logits.begin() + static_cast<std::ptrdiff_t>(row * n_vocab),
                             logits.begin() + static_cast<std::ptrdiff_t>((row + 1) * n_vocab));
      ++row;
    } else {
      session.logits_.clear();
    }
    session.account(part.tokens, seconds);
  }
  // The observers last: every session holds its tokens whatever one of them throws. The hidden states hold every
  // row when a part asked for them, and nothing when none did (no observer to notify).
  if (hidden.empty()) return;
  size_t first_row = 0;
  for (const BatchPart& part : parts) {
    const int64_t pos0 = part.session->n_past() - static_cast<int64_t>(part.tokens.size());
    part.session->notify(pos0, part.tokens, hidden.subspan(first_row * E, part.tokens.size() * E));
    first_row += part.tokens.size();
  }
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
    run(again, from, model::SequenceBatch::Logits::kLast, logits_, cancel);
    notify(from, again, model_.hidden());
  }
}

}  // namespace hetmoe::engine
