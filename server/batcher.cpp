#include "server/batcher.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"
#include "runtime/text/think_filter.h"

namespace hetmoe::server {

Stream::Update Stream::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!taken_final_ && pending_.text.empty() && pending_.tokens == 0 && pending_.logprobs.empty() && !pending_.finished)
    changed_.wait_for(lock, timeout);
  Update out = std::move(pending_);
  pending_ = {};
  if (out.finished) {
    taken_final_ = true;
    // Later takes keep saying how it ended.
    pending_.finished = true;
    pending_.finish = out.finish;
    pending_.error = out.error;
    pending_.prompt_tokens = out.prompt_tokens;
    pending_.cached_tokens = out.cached_tokens;
    pending_.completion_tokens = out.completion_tokens;
  }
  return out;
}

void Stream::append(std::string_view text, const TokenLogprob* logprob, int64_t tokens) {
  {
    std::lock_guard lock(mutex_);
    pending_.text += text;
    pending_.tokens += tokens;
    if (logprob) pending_.logprobs.push_back(*logprob);
  }
  changed_.notify_all();
}

void Stream::finish(Finish reason, std::string error, int64_t prompt_tokens, int64_t cached_tokens,
                    int64_t completion_tokens) {
  {
    std::lock_guard lock(mutex_);
    pending_.finished = true;
    pending_.finish = reason;
    pending_.error = std::move(error);
    pending_.prompt_tokens = prompt_tokens;
    pending_.cached_tokens = cached_tokens;
    pending_.completion_tokens = completion_tokens;
  }
  changed_.notify_all();
}

// A job in its slot: where its prompt is, what it generated, the text sent so far.
struct Batcher::Sequence {
  Sequence(Job j, std::shared_ptr<Stream> s, int draft_max)
      : job(std::move(j)), stream(std::move(s)), sampler(job.sampling), budget(draft_max) {}
  Job job;
  std::shared_ptr<Stream> stream;
  engine::Sampler sampler;
  std::vector<int32_t> history;  // prompt and generated tokens (the penalties' window)
  int64_t prompt_done = 0;       // prompt tokens the session holds
  int64_t cached = 0;            // of them, found in the slot's cache
  int64_t generated = 0;
  int32_t next = -1;             // the sampled token the next step evaluates; -1 while the prompt is pending
  std::vector<int32_t> drafts;   // the drafts the step evaluates after `next`
  engine::DraftBudget budget;    // how many drafts pay (adaptive_drafts)
  std::optional<int32_t> guess;  // a draft not evaluated, checked against the token that comes (the budget's shadow)
  double propose_seconds = 0;    // the step's proposal
  double step_seconds = -1;      // the step's forward pass when the sequence had it to itself, else -1
  std::optional<text::StreamDecoder> decoder;
  std::string text;  // generated text not sent yet (held back: a possible start of a stop string)
};

Batcher::Batcher(model::Model& model, const text::Tokenizer* tokenizer, BatcherOptions options)
    : model_(model), tokenizer_(tokenizer), options_(options) {
  if (options_.parallel < 1) fail("--parallel must be at least 1");
  if (options_.slot_ctx < 2) fail("the context per slot must be at least 2 positions");
  if (options_.max_batch_tokens < options_.parallel)
    fail("the batch of {} tokens cannot hold a token of each of {} slots", options_.max_batch_tokens,
         options_.parallel);
  for (int i = 0; i < options_.parallel; ++i) {
    Slot& s = slots_.emplace_back(Slot{std::make_unique<engine::Session>(model_, options_.slot_ctx), nullptr, 0,
                                       engine::make_drafter(options_.draft, model_, options_.slot_ctx)});
    if (s.drafter) s.session->observe(s.drafter->hidden_observer());
  }
  stats_.slots = options_.parallel;
  stats_.kv_total = options_.parallel * options_.slot_ctx;
  worker_ = std::thread([this] { run(); });
}

Batcher::~Batcher() { stop(std::chrono::milliseconds(0)); }

std::shared_ptr<Stream> Batcher::submit(Job job) {
  const int64_t n = static_cast<int64_t>(job.prompt.size());
  if (n == 0) fail("the prompt is empty");
  if (n >= options_.slot_ctx)
    fail("the prompt has {} tokens, more than the context of {} positions per slot leaves room for", n,
         options_.slot_ctx);
  const int64_t n_vocab = model_.config().n_vocab;
  for (int32_t t : job.prompt)
    if (t < 0 || t >= n_vocab) fail("token id {} is out of range (the vocabulary has {} tokens)", t, n_vocab);
  if (job.top_logprobs > 20) fail("top_logprobs is at most 20");
  auto stream = std::make_shared<Stream>();
  auto seq = std::make_unique<Sequence>(std::move(job), stream, options_.draft_max);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw Unavailable("the server is shutting down");
    if (queue_.size() >= options_.max_queue) {
      ++stats_.rejected;
      throw Unavailable(fmt::format("the queue is full ({} requests wait for a slot)", queue_.size()));
    }
    queue_.push_back(std::move(seq));
    ++stats_.requests;
    stats_.queued = static_cast<int64_t>(queue_.size());
  }
  wake_.notify_all();
  return stream;
}

void Batcher::stop(std::chrono::milliseconds grace) {
  {
    std::unique_lock lock(mutex_);
    if (!worker_.joinable()) return;
    stopping_ = true;
    wake_.notify_all();
    done_.wait_for(lock, grace, [this] { return worker_done_; });
    // What is left is cancelled.
    finish_on_stop_ = false;
    for (auto& q : queue_) q->stream->cancel();
  }
  wake_.notify_all();
  worker_.join();
}

bool Batcher::stopping() const {
  std::lock_guard lock(mutex_);
  return stopping_;
}

BatcherStats Batcher::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Batcher::admit_locked() {
  while (!queue_.empty()) {
    // The free slot sharing the longest prefix with the prompt; of equals, the one unused longest.
    Slot* best = nullptr;
    int64_t best_common = -1;
    const std::vector<int32_t>& prompt = queue_.front()->job.prompt;
    for (Slot& s : slots_) {
      if (s.seq) continue;
      const std::vector<int32_t>& cached = s.session->tokens();
      const size_t limit = std::min(cached.size(), prompt.size());
      const int64_t common = static_cast<int64_t>(
          std::mismatch(cached.begin(), cached.begin() + static_cast<std::ptrdiff_t>(limit), prompt.begin()).first -
          cached.begin());
      if (common > best_common || (common == best_common && s.last_used < best->last_used)) {
        best = &s;
        best_common = common;
      }
    }
    if (!best) return;
    std::unique_ptr<Sequence> seq = std::move(queue_.front());
    queue_.pop_front();
    if (seq->stream->cancelled()) {
      seq->stream->finish(Finish::kCancelled, {}, static_cast<int64_t>(seq->job.prompt.size()), 0, 0);
      ++stats_.cancelled;
      continue;
    }
    // The last prompt token is always evaluated: its logits choose the first reply token.
    const int64_t keep = std::min<int64_t>(best_common, static_cast<int64_t>(prompt.size()) - 1);
    best->session->truncate(keep);
    seq->prompt_done = keep;
    seq->cached = keep;
    seq->history = seq->job.prompt;
    if (tokenizer_) seq->decoder.emplace(*tokenizer_, seq->job.render_special);
    stats_.prompt_tokens += static_cast<int64_t>(seq->job.prompt.size());
    stats_.cached_tokens += keep;
    ++stats_.busy_slots;
    best->seq = std::move(seq);
  }
}

void Batcher::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      for (;;) {
        admit_locked();
        stats_.queued = static_cast<int64_t>(queue_.size());
        const bool active = std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.seq != nullptr; });
        if (stopping_ && !finish_on_stop_)
          for (Slot& s : slots_)
            if (s.seq) s.seq->stream->cancel();
        if (active) break;
        if (stopping_) {
          for (auto& q : queue_) q->stream->finish(Finish::kCancelled, {}, 0, 0, 0);
          queue_.clear();
          worker_done_ = true;
          done_.notify_all();
          return;
        }
        wake_.wait(lock);
      }
    }
    step();
  }
}

bool Batcher::step() {
  for (Slot& s : slots_)
    if (s.seq && s.seq->stream->cancelled()) end(s, Finish::kCancelled);
  // Every decoding sequence's token first, then the pending prompts' chunks in the budget that is left.
  std::vector<engine::Session::BatchPart> parts;
  std::vector<Slot*> owners;
  std::vector<std::vector<int32_t>> next_tokens(slots_.size());
  int64_t budget = options_.max_batch_tokens, prompt_rows = 0, drafted = 0;
  int64_t decoding = 0;
  bool prompts = false;
  for (const Slot& s : slots_) {
    decoding += s.seq && s.seq->next >= 0 ? 1 : 0;
    prompts = prompts || (s.seq && s.seq->next < 0);
  }
  const bool alone = decoding == 1 && !prompts;  // a decoding sequence with the step to itself: its cost is timed
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.seq || s.seq->next < 0) continue;
    Sequence& q = *s.seq;
    // Drafts that fit the context, the batch (a token for every decoding sequence first) and the token limit (whose
    // last token is sampled on its own).
    int64_t room = std::min<int64_t>(options_.draft_max, s.session->n_free() - 1);
    room = std::min(room, budget - decoding);
    if (q.job.max_tokens >= 0) room = std::min(room, q.job.max_tokens - q.generated - 1);
    // The budget's choice once it has timed a step of one token, or when it can time one now.
    const int64_t wanted = options_.adaptive_drafts && (q.budget.calibrated() || alone)
                               ? std::min<int64_t>(room, q.budget.choose())
                               : room;
    q.drafts.clear();
    q.guess.reset();
    q.propose_seconds = 0;
    if (s.drafter && room > 0 && (wanted > 0 || q.budget.guess_due())) {
      const auto start = std::chrono::steady_clock::now();
      try {
        s.drafter->propose(std::span<const int32_t>(q.history).first(q.history.size() - 1), q.next,
                           static_cast<int>(std::max<int64_t>(wanted, 1)), q.drafts);
        q.propose_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (wanted == 0) {  // a guess: not evaluated, checked against the token that comes
          q.budget.guessed(q.propose_seconds);
          if (!q.drafts.empty()) q.guess = q.drafts.front();
          q.drafts.clear();
        }
      } catch (const std::exception& e) {
        // The drafter could not run (out of memory): this sequence ends with the error, the others go on.
        end(s, Finish::kError, e.what());
        --decoding;
        continue;
      }
    }
    next_tokens[i].assign(1, q.next);
    next_tokens[i].insert(next_tokens[i].end(), q.drafts.begin(), q.drafts.end());
    parts.push_back({.session = s.session.get(), .tokens = next_tokens[i], .all_logits = !q.drafts.empty()});
    owners.push_back(&s);
    budget -= static_cast<int64_t>(next_tokens[i].size());
    --decoding;
    drafted += static_cast<int64_t>(q.drafts.size());
  }
  for (Slot& s : slots_) {
    if (!s.seq || s.seq->next >= 0 || budget <= 0) continue;
    Sequence& q = *s.seq;
    const int64_t n_prompt = static_cast<int64_t>(q.job.prompt.size());
    const int64_t chunk = std::min(budget, n_prompt - q.prompt_done);
    parts.push_back({s.session.get(), std::span<const int32_t>(q.job.prompt.data() + q.prompt_done, chunk),
                     q.prompt_done + chunk == n_prompt});
    owners.push_back(&s);
    budget -= chunk;
    prompt_rows += chunk;
  }
  if (parts.empty()) return false;
  const auto start = std::chrono::steady_clock::now();
  try {
    engine::Session::eval_batch(parts);
  } catch (const std::exception& e) {
    // Nothing was added to the sessions; their sequences end with the error, the slots stay usable.
    for (Slot* s : owners) end(*s, Finish::kError, e.what());
    return true;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    // The step's counts first: whoever sees a token of this step sees them too.
    std::lock_guard lock(mutex_);
    ++stats_.steps;
    stats_.drafted_tokens += drafted;
    int64_t rows = 0;
    for (const auto& p : parts) rows += static_cast<int64_t>(p.tokens.size());
    stats_.step_rows += rows;
    stats_.prefill_tokens += prompt_rows;
    if (prompt_rows > 0) {
      stats_.prefill_seconds += seconds;
    } else {
      stats_.decode_seconds += seconds;
    }
    int64_t used = 0;
    for (const Slot& s : slots_) used += s.session->n_past();
    stats_.kv_used = used;
    stats_.cpu_expert_bytes = model_.cpu_expert_bytes();
    if (const model::DeviceExperts* dev = model_.device_experts()) {
      const device::TransferStats t = dev->device().transfers();
      stats_.to_device_bytes = t.to_device_bytes;
      stats_.to_host_bytes = t.to_host_bytes;
      stats_.expert_moves = dev->traffic().moves;
      stats_.expert_admissions = dev->traffic().admissions;
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    Slot& s = *owners[i];
    Sequence& q = *s.seq;
    q.step_seconds = parts.size() == 1 ? seconds : -1;
    if (q.next < 0) q.prompt_done += static_cast<int64_t>(parts[i].tokens.size());
    if (parts[i].logits) advance(s);
  }
  return true;
}

namespace {

// The log-softmax of `logits` at `token`, and the `top` most likely tokens with theirs.
TokenLogprob logprob_of(std::span<const float> logits, int32_t token, int32_t top) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max));
  const float log_z = max + static_cast<float>(std::log(sum));
  TokenLogprob out{.token = token, .logprob = logits[static_cast<size_t>(token)] - log_z, .top = {}};
  if (top > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const auto k = std::min<size_t>(static_cast<size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
             (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
    });
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], logits[static_cast<size_t>(ids[i])] - log_z);
  }
  return out;
}

// Where the first stop string starts in `text` (npos: none), and how many bytes at its end could start one.
std::pair<size_t, size_t> find_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t first = std::string::npos, held = 0;
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    first = std::min(first, text.find(stop));
    held = std::max(held, text::marker_start_at_end(text, stop));
  }
  return {first, held};
}

}  // namespace

void Batcher::advance(Slot& slot) {
  Sequence& q = *slot.seq;
  engine::Session& session = *slot.session;
  if (q.next < 0 || q.drafts.empty()) {
    const std::span<const float> logits = session.last_logits();
    const int32_t token = q.sampler.sample(logits, q.history);
    if (q.next >= 0) {  // a step of one token: timed when the sequence had it alone, and its guess checked
      if (q.step_seconds >= 0) q.budget.plain_step(q.step_seconds);
      if (q.guess) q.budget.shadow(*q.guess == token);
      q.guess.reset();
    }
    if (take(slot, token, logits, session.n_past())) q.next = token;
    return;
  }
  // The step evaluated q.next and its drafts: row j's logits follow q.next and drafts 0..j-1.
  const std::span<const float> rows = session.all_logits();
  const auto n_vocab = static_cast<size_t>(model_.config().n_vocab);
  const std::vector<int32_t> drafts = std::move(q.drafts);
  q.drafts.clear();
  const int64_t base = session.n_past() - static_cast<int64_t>(drafts.size());  // tokens held through q.next
  int64_t accepted = 0;
  for (size_t j = 0; j <= drafts.size(); ++j) {
    const std::span<const float> logits = rows.subspan(j * n_vocab, n_vocab);
    const int32_t token =
        j < drafts.size() ? q.sampler.verify(logits, q.history, drafts[j]) : q.sampler.sample(logits, q.history);
    const bool agreed = j < drafts.size() && token == drafts[j];
    // In the session before the token: q.next and the drafts before it (an agreed draft is evaluated already).
    if (!take(slot, token, logits, base + static_cast<int64_t>(j)) || !agreed) {
      // The session keeps what the reply holds evaluated: q.next and the accepted drafts.
      session.truncate(base + static_cast<int64_t>(j));
      if (slot.seq) q.next = token;
      break;
    }
    ++accepted;
  }
  if (slot.seq) {  // what the drafts were worth (a reply that ended chooses no more)
    const int n_drafted = static_cast<int>(drafts.size()), n_kept = static_cast<int>(accepted);
    if (q.step_seconds >= 0)
      q.budget.verify_step(n_drafted, n_kept, q.step_seconds + q.propose_seconds);
    else
      q.budget.verified(n_drafted, n_kept);
  }
  std::lock_guard lock(mutex_);
  stats_.accepted_tokens += accepted;
}

bool Batcher::take(Slot& slot, int32_t token, std::span<const float> logits, int64_t in_session) {
  Sequence& q = *slot.seq;
  std::optional<TokenLogprob> lp;
  if (q.job.top_logprobs >= 0) lp = logprob_of(logits, token, q.job.top_logprobs);
  const auto ended = [&](Finish reason) {
    end(slot, reason);
    return false;
  };
  if (tokenizer_ && !q.job.ignore_eos && tokenizer_->is_end_of_generation(token)) return ended(Finish::kStop);
  ++q.generated;
  q.history.push_back(token);
  if (q.decoder) q.text += q.decoder->push(token);
  const auto [stop_at, held] = find_stop(q.text, q.job.stop);
  if (stop_at != std::string::npos) {
    q.text.resize(stop_at);
    q.stream->append(q.text, lp ? &*lp : nullptr, 1);
    q.text.clear();
    return ended(Finish::kStop);
  }
  q.stream->append(std::string_view(q.text).substr(0, q.text.size() - held), lp ? &*lp : nullptr, 1);
  q.text.erase(0, q.text.size() - held);
  if (q.job.max_tokens >= 0 && q.generated >= q.job.max_tokens) return ended(Finish::kLength);
  if (in_session >= slot.session->n_ctx()) return ended(Finish::kLength);  // the slot's context is full
  return true;
}

void Batcher::end(Slot& slot, Finish reason, std::string error) {
  Sequence& q = *slot.seq;
  if (reason == Finish::kStop || reason == Finish::kLength) {
    // What was held back: an incomplete character, a partial stop string that never completed.
    if (q.decoder) q.text += q.decoder->flush();
    if (!q.text.empty()) q.stream->append(q.text, nullptr, 0);
  }
  {
    // Counted before the request hears of it: what it reads of the counts next includes it.
    std::lock_guard lock(mutex_);
    switch (reason) {
      case Finish::kCancelled:
        ++stats_.cancelled;
        break;
      case Finish::kError:
        ++stats_.failed;
        break;
      default:
        ++stats_.finished;
    }
    stats_.generated_tokens += q.generated;
    --stats_.busy_slots;
  }
  q.stream->finish(reason, std::move(error), static_cast<int64_t>(q.job.prompt.size()), q.cached, q.generated);
  slot.seq.reset();
  slot.last_used = ++clock_;
}

}  // namespace hetmoe::server
