#include "runtime/engine/generate.h"

#include <algorithm>

namespace hetmoe::engine {

GenerateResult generate(Session& session, std::span<const float> logits, Sampler& sampler,
                        const text::Tokenizer* tokenizer, const GenerateOptions& options,
                        const std::function<bool(int32_t)>& on_token) {
  GenerateResult result;
  std::vector<float> current(logits.begin(), logits.end());
  for (int64_t i = 0; options.max_tokens < 0 || i < options.max_tokens; ++i) {
    if (options.interrupt && options.interrupt->load()) {
      result.stop = StopReason::kInterrupted;
      return result;
    }
    const int32_t token = sampler.sample(current, session.tokens());
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.stop = StopReason::kCallback;
      return result;
    }
    if (options.stop_at_end_of_generation && tokenizer && tokenizer->is_end_of_generation(token)) {
      result.stop = StopReason::kEndOfGeneration;
      return result;
    }
    if (options.max_tokens >= 0 && i + 1 == options.max_tokens) break;  // the last token is not evaluated
    if (session.n_free() < 1) {
      result.stop = StopReason::kContextFull;
      return result;
    }
    const int32_t one[1] = {token};
    const std::span<const float> next = session.eval(one);
    current.assign(next.begin(), next.end());
  }
  result.stop = StopReason::kMaxTokens;
  return result;
}

}  // namespace hetmoe::engine
