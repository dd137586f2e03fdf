#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/model/kv_cache.h"
#include "runtime/model/model.h"

namespace hetmoe::engine {

// What sees the final hidden state of every position a session evaluates (an MTP drafter's input).
class HiddenObserver {
 public:
  virtual ~HiddenObserver() = default;
  // The session evaluated `tokens` at positions pos0, pos0 + 1, ...; hidden: their final hidden states,
  // [n][n_embd].
  virtual void evaluated(int64_t pos0, std::span<const int32_t> tokens, std::span<const float> hidden) = 0;
};

// One conversation's state on a model: the tokens its cache holds and the cache itself. Tokens are appended by
// eval() and evaluated once: a chat turn evaluates just its new tokens (KV reuse). A model with recurrent layers
// (Qwen3.5's Gated DeltaNet) cannot drop tokens from its state: the session checkpoints it before each batch of
// several tokens and every kDecodeCheckpointEvery positions of decoding, and after truncate() the next eval
// restores the newest checkpoint before the kept tokens and evaluates the ones after it again.
class Session {
 public:
  // Fails when n_ctx exceeds the model's training context or the cache cannot be allocated.
  Session(model::Model& model, int64_t n_ctx);

  int64_t n_ctx() const { return cache_.n_ctx(); }
  int64_t n_past() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t n_free() const { return n_ctx() - n_past(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  model::Model& model() { return model_; }

  // Evaluates `tokens` after what the cache holds and returns the logits of the last one (valid until the next
  // call). Fails before changing anything when they do not fit or an id is out of range.
  // With `cancel` set, a batch stops between layers by throwing Cancelled, leaving the session as it was.
  std::span<const float> eval(std::span<const int32_t> tokens, const std::atomic<bool>* cancel = nullptr);
  // The logits eval() returned last.
  std::span<const float> last_logits() const { return logits_; }
  // Every token's logits of the last eval_all, or of the last eval_batch part that asked for them.
  std::span<const float> all_logits() const { return all_logits_; }
  // As eval(), returning every token's logits, [n][n_vocab] (valid until the next call): speculative decoding's
  // verification of a token and its drafts. last_logits() is then the last row.
  std::span<const float> eval_all(std::span<const int32_t> tokens, const std::atomic<bool>* cancel = nullptr);

  // Several sessions of one model advance in one forward pass (continuous batching): each part's tokens after what
  // its session holds, as eval() would take them, with its logits (of the last token, when asked) then in its
  // last_logits(). Fails before changing anything when a part would fail alone, when a session appears twice or the
  // sessions' models differ. With `cancel` raised, every session is left as it was (Cancelled).
  struct BatchPart {
    Session* session = nullptr;
    std::span<const int32_t> tokens;
    bool logits = true;       // false: a prompt's chunk before its last (its last_logits() are then empty)
    bool all_logits = false;  // every token's logits, then in all_logits() (a token and its drafts)
  };
  static void eval_batch(std::span<const BatchPart> parts, const std::atomic<bool>* cancel = nullptr);
  // Forgets everything after the first n tokens; their cache rows are overwritten by later evals.
  void truncate(int64_t n);
  static constexpr int64_t kDecodeCheckpointEvery = 256;
  // Positions the next eval evaluates again to bring recurrent state back to the kept tokens (0 without recurrent
  // layers or when nothing was dropped).
  int64_t replay_pending() const;
  void clear() { truncate(0); }
  // Every evaluation from now on also computes its rows' final hidden states and hands them to `observer` (null:
  // nobody). It must outlive its use. Fails on a model whose final hidden states are not kept (hyper-connections).
  void observe(HiddenObserver* observer);

  // What the last eval calls cost: a batch of more than one token counts as prefill, a single token as decode, an
  // eval_all as a verification step.
  struct Counters {
    int64_t prefill_tokens = 0;
    double prefill_seconds = 0;
    int64_t decode_tokens = 0;
    double decode_seconds = 0;
    int64_t verify_steps = 0;
    int64_t verify_tokens = 0;
    double verify_seconds = 0;
  };
  const Counters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

 private:
  // Brings the cache's recurrent state to n_past(): rolls back and evaluates the kept tokens after the checkpoint.
  void sync(const std::atomic<bool>* cancel);
  // Fails when `n` tokens cannot be evaluated next (none, or more than the free positions).
  void check_fits(size_t n) const;
  // Before evaluating `n` tokens: fails when they do not fit, syncs, takes the checkpoint the batch needs.
  void prepare(size_t n, const std::atomic<bool>* cancel);
  // Runs `tokens` at pos0 (n_past(), or earlier for a replay), logits as asked, the hidden states kept for notify.
  void run(std::span<const int32_t> tokens, int64_t pos0, model::SequenceBatch::Logits logits, std::vector<float>& out,
           const std::atomic<bool>* cancel);
  // The observer, if any, sees the hidden states of `tokens` at pos0 (after they are the session's).
  void notify(int64_t pos0, std::span<const int32_t> tokens, std::span<const float> hidden);
  // After: the tokens are the session's, their cost counted.
  void account(std::span<const int32_t> tokens, double seconds, bool verify = false);

  model::Model& model_;
  model::KvCache cache_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
  std::vector<float> all_logits_;  // eval_all's
  Counters counters_;
  HiddenObserver* observer_ = nullptr;
};

}  // namespace hetmoe::engine
