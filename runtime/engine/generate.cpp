#include "runtime/engine/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace hetmoe::engine {

GenerateResult generate(Session& session, std::span<const float> logits, Sampler& sampler,
                        const text::Tokenizer* tokenizer, const GenerateOptions& options,
                        const std::function<bool(int32_t)>& on_token) {
  GenerateResult result;
  std::vector<float> current(logits.begin(), logits.end());
  std::optional<int32_t> chosen;  // the current position's token when a verification already chose it
  std::vector<int32_t> drafts, batch;
  DraftBudget budget(options.draft_max);
  std::optional<int32_t> guess;  // the drafter's first guess at the token being sampled, when no step evaluated it
  using Clock = std::chrono::steady_clock;
  // A token is the generation's: returns why it stops there, if it does.
  auto take = [&](int32_t token) -> std::optional<StopReason> {
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) return StopReason::kCallback;
    if (options.stop_at_end_of_generation && tokenizer && tokenizer->is_end_of_generation(token))
      return StopReason::kEndOfGeneration;
    return std::nullopt;
  };
  const auto n_max = options.max_tokens;
  for (;;) {
    if (options.interrupt && options.interrupt->load()) {
      result.stop = StopReason::kInterrupted;
      return result;
    }
    const int32_t token = chosen ? *chosen : sampler.sample(current, session.tokens());
    chosen.reset();
    if (guess) budget.shadow(*guess == token);
    guess.reset();
    if (const std::optional<StopReason> stop = take(token)) {
      result.stop = *stop;
      return result;
    }
    const auto n_taken = static_cast<int64_t>(result.tokens.size());
    if (n_max >= 0 && n_taken == n_max) break;  // the last token is not evaluated
    if (session.n_free() < 1) {
      result.stop = StopReason::kContextFull;
      return result;
    }
    // Drafts that fit the context and leave the last token of the limit to a sample of its own.
    int64_t room = std::min<int64_t>(options.draft_max, session.n_free() - 1);
    if (n_max >= 0) room = std::min(room, n_max - n_taken - 1);
    const int64_t wanted = options.adaptive ? std::min<int64_t>(room, budget.choose()) : room;
    // A verification step's time counts its proposal: the budget weighs what drafts cost to make as well as to
    // verify. A guess for a step without drafts is asked for when the budget says it is worth its cost.
    const auto start = Clock::now();
    drafts.clear();
    if (options.drafter && room > 0 && (wanted > 0 || budget.guess_due())) {
      options.drafter->propose(session.tokens(), token, static_cast<int>(std::max<int64_t>(wanted, 1)), drafts);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      result.draft_seconds += seconds;
      if (wanted == 0) budget.guessed(seconds);
    }
    if (wanted == 0 && !drafts.empty()) {
      guess = drafts.front();  // not evaluated: checked against the next token instead
      drafts.clear();
    }
    ++result.steps;
    if (drafts.empty()) {
      const int32_t one[1] = {token};
      const auto eval_start = Clock::now();
      const std::span<const float> next = session.eval(one);
      current.assign(next.begin(), next.end());
      budget.plain_step(std::chrono::duration<double>(Clock::now() - eval_start).count());
      continue;
    }
    batch.assign(1, token);
    batch.insert(batch.end(), drafts.begin(), drafts.end());
    const std::span<const float> rows = session.eval_all(batch);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const auto n_vocab = static_cast<int64_t>(current.size());
    const int64_t base = session.n_past() - static_cast<int64_t>(batch.size());  // the token's position
    result.drafted += static_cast<int64_t>(drafts.size());
    size_t kept = 0;  // drafts accepted
    for (; kept < drafts.size(); ++kept) {
      const std::span<const float> row = rows.subspan(kept * n_vocab, n_vocab);
      const std::span<const int32_t> history(session.tokens().data(), base + 1 + kept);
      const int32_t verified = sampler.verify(row, history, drafts[kept]);
      if (verified != drafts[kept]) {
        chosen = verified;
        break;
      }
      ++result.accepted;
      if (const std::optional<StopReason> stop = take(verified)) {
        session.truncate(base + 1 + static_cast<int64_t>(kept));  // the stopping token is not evaluated
        result.stop = *stop;
        return result;
      }
    }
    session.truncate(base + 1 + static_cast<int64_t>(kept));
    budget.verify_step(static_cast<int>(drafts.size()), static_cast<int>(kept), seconds);
    if (!chosen) {
      const std::span<const float> last = rows.subspan(drafts.size() * n_vocab, n_vocab);
      current.assign(last.begin(), last.end());
    }
  }
  result.stop = StopReason::kMaxTokens;
  return result;
}

double decode_rate(const Session::Counters& c, const GenerateResult& r) {
  const double seconds = c.decode_seconds + c.verify_seconds + r.draft_seconds;
  return static_cast<double>(c.decode_tokens + c.verify_steps + r.accepted) / std::max(seconds, 1e-9);
}

std::string draft_summary(const GenerateResult& r) {
  return fmt::format("; drafts: {} of {} accepted ({:.0f} %), {:.2f} tokens per step", r.accepted, r.drafted,
                     100.0 * static_cast<double>(r.accepted) / static_cast<double>(std::max<int64_t>(1, r.drafted)),
                     static_cast<double>(r.steps + r.accepted) / static_cast<double>(std::max<int64_t>(1, r.steps)));
}

}  // namespace hetmoe::engine
