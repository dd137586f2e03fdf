#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/engine/draft.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

namespace hetmoe::server {

// What a request asks of the batcher: a prompt's tokens and how to continue it.
struct Job {
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;
  int64_t max_tokens = -1;        // < 0: until the end token, a stop string or the slot's context
  std::vector<std::string> stop;  // the reply ends before the first of these (not included)
  int32_t top_logprobs = -1;      // < 0: no log probabilities; else this many alternatives per token (at most 20)
  bool ignore_eos = false;        // keep going past the end-of-generation token
  bool render_special = false;    // control tokens' text in the reply (a chat's reasoning and tool-call markers)
};

enum class Finish { kStop, kLength, kCancelled, kError };

// One generated token's log probability under the model (log-softmax of its logits) and the best alternatives.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// What a request gets back, as it comes: the batcher appends, the request's thread takes. Thread-safe.
class Stream {
 public:
  struct Update {
    std::string text;                    // new text since the last take (complete UTF-8, stop strings held back)
    std::vector<TokenLogprob> logprobs;  // of the tokens generated since the last take
    int64_t tokens = 0;                  // tokens generated since the last take
    bool finished = false;
    Finish finish = Finish::kStop;
    std::string error;  // kError: what went wrong
    int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  };
  // What arrived since the last take; waits up to `timeout` when nothing has (returns an empty update then).
  Update take(std::chrono::milliseconds timeout);
  // The client went away or asked to stop: the sequence leaves the batch at the next step.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // The batcher's side.
  void append(std::string_view text, const TokenLogprob* logprob, int64_t tokens);
  void finish(Finish reason, std::string error, int64_t prompt_tokens, int64_t cached_tokens,
              int64_t completion_tokens);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  Update pending_;
  bool taken_final_ = false;
  std::atomic<bool> cancelled_{false};
};

// Thrown by submit() when the queue is full or the batcher is stopping (the server answers 503).
class Unavailable : public Error {
 public:
  using Error::Error;
};

struct BatcherOptions {
  int parallel = 1;                // sequences advancing together, each in its own slot (a session and its cache)
  int64_t slot_ctx = 4096;         // positions per slot
  int64_t max_batch_tokens = 512;  // rows per forward pass: every decoding sequence's token, then prompt chunks
  size_t max_queue = 64;           // requests waiting for a slot
  // Speculative decoding: each decoding sequence's token goes into the step with up to draft_max drafts after it.
  engine::DraftSource draft = engine::DraftSource::kNone;
  int draft_max = 4;
  // How many, per sequence and step, from its measured acceptance and cost (engine::DraftBudget, as `run` does):
  // the cost is timed in steps the sequence has to itself; until one was, a sequence that shares its steps drafts
  // draft_max. Off: always draft_max.
  bool adaptive_drafts = true;
};

// What the batcher has done since it started, for /metrics.
struct BatcherStats {
  int64_t requests = 0, finished = 0, cancelled = 0, failed = 0, rejected = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, prefill_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // steps with prompt rows / decode-only steps
  int64_t steps = 0, step_rows = 0;
  int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding's drafts, and those the model agreed with
  int64_t queued = 0, busy_slots = 0, slots = 0;
  int64_t kv_used = 0, kv_total = 0;  // positions
  // The model's counters after the last step (read on the worker, between passes).
  uint64_t cpu_expert_bytes = 0;                     // routed-expert weights the CPU read
  uint64_t to_device_bytes = 0, to_host_bytes = 0;   // a device's copies
  uint64_t expert_moves = 0, expert_admissions = 0;  // the scheduler's
};

// Continuous batching: up to `parallel` sequences, each in its own slot, advance together, one forward pass per
// step over every active sequence's new tokens (decode tokens and chunks of pending prompts), so the MoE step routes
// all their rows at once and the scheduler plans with the real row counts. A job joins at the next step and leaves
// when it finishes or is cancelled, freeing its slot. A job goes to the free slot whose cached tokens share the
// longest prefix with its prompt, and that prefix is not evaluated again.
class Batcher {
 public:
  Batcher(model::Model& model, const text::Tokenizer* tokenizer, BatcherOptions options);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues a job. Fails with hetmoe::Error (nothing queued) when its prompt is empty, holds an id outside the
  // vocabulary or does not fit a slot, and with Unavailable when the queue is full or the batcher is stopping.
  std::shared_ptr<Stream> submit(Job job);
  // Stops taking jobs; the queued and running ones have `grace` to complete, then the rest are cancelled. Returns
  // when the worker is done.
  void stop(std::chrono::milliseconds grace);
  bool stopping() const;
  BatcherStats stats() const;
  const BatcherOptions& options() const { return options_; }

 private:
  struct Sequence;
  struct Slot {
    std::unique_ptr<engine::Session> session;
    std::unique_ptr<Sequence> seq;  // the job it runs; null when free
    uint64_t last_used = 0;
    std::unique_ptr<engine::Drafter> drafter;  // its session's (an MTP drafter holds the block's cache); null without
  };
  void run();
  // Takes queued jobs into free slots (under the lock).
  void admit_locked();
  // One forward pass over every active sequence; false when there was nothing to do.
  bool step();
  // After a step: samples the sequence's next token from its logits (first checking the drafts it evaluated, in
  // order) and decides whether it is done.
  void advance(Slot& slot);
  // A token of the sequence's reply, from `logits`, with `in_session` tokens in the session before it: sent, or the
  // end of the reply (false: the slot has ended).
  bool take(Slot& slot, int32_t token, std::span<const float> logits, int64_t in_session);
  void end(Slot& slot, Finish reason, std::string error = {});

  model::Model& model_;
  const text::Tokenizer* tokenizer_;
  BatcherOptions options_;
  std::vector<Slot> slots_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::condition_variable done_;
  bool stopping_ = false, finish_on_stop_ = true, worker_done_ = false;
  BatcherStats stats_;
  uint64_t clock_ = 0;
  std::thread worker_;
};

}  // namespace hetmoe::server
