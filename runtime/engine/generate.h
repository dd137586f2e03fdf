#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/engine/sampler.h"
#include "runtime/engine/session.h"
#include "runtime/text/tokenizer.h"

namespace hetmoe::engine {

enum class StopReason { kEndOfGeneration, kMaxTokens, kInterrupted, kContextFull, kCallback };

struct GenerateOptions {
  int64_t max_tokens = 128;                      // < 0: until something else stops it
  bool stop_at_end_of_generation = true;         // end on EOS/EOT (the end token is returned but not evaluated)
  const std::atomic<bool>* interrupt = nullptr;  // checked before every token (Ctrl-C)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // sampled tokens, the end token included when it stopped the generation
  StopReason stop = StopReason::kMaxTokens;
};

// Samples from `logits` (the session's current position), then evaluates each accepted token and samples again.
// on_token sees every sampled token before it is evaluated and may return false to stop. Each accepted token is
// evaluated except the last one when the limit is reached, so the session ends holding everything but that token.
GenerateResult generate(Session& session, std::span<const float> logits, Sampler& sampler,
                        const text::Tokenizer* tokenizer, const GenerateOptions& options,
                        const std::function<bool(int32_t)>& on_token);

}  // namespace hetmoe::engine
