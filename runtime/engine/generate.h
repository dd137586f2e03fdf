#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/draft.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/session.h"
#include "runtime/text/tokenizer.h"

namespace hetmoe::engine {

enum class StopReason { kEndOfGeneration, kMaxTokens, kInterrupted, kContextFull, kCallback };

struct GenerateOptions {
  int64_t max_tokens = 128;                      // < 0: until something else stops it
  bool stop_at_end_of_generation = true;         // end on EOS/EOT (the end token is returned but not evaluated)
  const std::atomic<bool>* interrupt = nullptr;  // checked before every token (Ctrl-C)
  // Speculative decoding: up to draft_max tokens from `drafter` follow each sampled token into one verification
  // batch (null or 0: one token per step).
  Drafter* drafter = nullptr;
  int draft_max = 0;
  // With a drafter: each step's draft count chosen by a DraftBudget from the acceptance and step times measured as
  // the generation goes (at most draft_max); false: draft_max drafts whenever the drafter has them.
  bool adaptive = true;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // sampled tokens, the end token included when it stopped the generation
  StopReason stop = StopReason::kMaxTokens;
  int64_t steps = 0;         // forward passes of the generation (one token, or a token and its drafts)
  int64_t drafted = 0;       // drafts evaluated
  int64_t accepted = 0;      // drafts accepted
  double draft_seconds = 0;  // in the drafter's proposals (an MTP drafter runs its block; a lookup costs nothing)
};

// Samples from `logits` (the session's current position), then evaluates each accepted token and samples again.
// on_token sees every sampled token before it is evaluated and may return false to stop. Each accepted token is
// evaluated except the last one when the limit is reached, so the session ends holding everything but that token.
// With a drafter, each sampled token goes into one batch with the drafts that follow it; the drafts are checked in
// order against the batch's logits by Sampler::verify (greedy: accepted while they are the argmax; else the
// standard rejection rule, so the tokens are distributed as without drafts), the first rejected one is replaced by
// the token verify chose and the cache forgets the rest. The session ends as it would without drafts.
GenerateResult generate(Session& session, std::span<const float> logits, Sampler& sampler,
                        const text::Tokenizer* tokenizer, const GenerateOptions& options,
                        const std::function<bool(int32_t)>& on_token);

// Tokens per second of a generation's steps: the tokens they evaluated and kept (one per step, and the accepted
// drafts) over the time of those steps and their proposals.
double decode_rate(const Session::Counters& c, const GenerateResult& r);
// "; drafts: A of D accepted (P %), T tokens per step" for a generation with a drafter.
std::string draft_summary(const GenerateResult& r);

}  // namespace hetmoe::engine
