#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "runtime/device/device.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/session.h"
#include "runtime/error.h"
#include "runtime/io/output_file.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "scheduler/routing_trace.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace hetmoe::cli {

std::unique_ptr<engine::Engine> open_engine(const engine::EngineOptions& options) {
  std::unique_ptr<engine::Engine> e = engine::Engine::open(options);
  for (const std::string& note : flag_notes()) fmt::print(stderr, "{}\n", note);
  flag_notes().clear();  // said once
  for (const std::string& note : e->notes()) fmt::print(stderr, "{}\n", note);
  return e;
}

std::unique_ptr<text::Tokenizer> open_tokenizer(const gguf::GgufFile& file) {
  std::unique_ptr<text::Tokenizer> t = text::Tokenizer::from_gguf(file);
  for (const std::string& w : t->warnings()) fmt::print(stderr, "hetmoe: warning: {}\n", w);
  return t;
}

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ',' || text[i] == ' ') {
      ++i;
      continue;
    }
    size_t end = i;
    if (text[end] == '-') ++end;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == i || (text[i] == '-' && end == i + 1)) fail("--tokens: '{}' is not a list of token ids", text);
    const std::string num = text.substr(i, end - i);
    errno = 0;
    const long long v = std::strtoll(num.c_str(), nullptr, 10);
    if (errno != 0 || v < INT32_MIN || v > INT32_MAX) fail("--tokens: {} is out of range", num);
    ids.push_back(static_cast<int32_t>(v));
    i = end;
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

int logits(const LogitsOptions& opt) {
  const auto engine = open_engine({opt.model, opt.threads, opt.critical, opt.device});
  model::Model* model = &engine->model();
  const int64_t n = static_cast<int64_t>(opt.tokens.size());
  model::KvCache cache = model->make_cache(std::min<int64_t>(n, model->config().n_ctx_train));
  std::vector<float> out;
  model->forward(opt.tokens, 0, cache, /*all_logits=*/true, out);
  io::write_file(opt.out, std::string_view(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float)));
  return 0;
}

namespace {

// Streams each MoE layer's routing to a file as hetmoe-routing/1 lines. The file appears under its name only when the
// run finished: a failed write is reported at the end, and the temporary file is removed.
class RoutingWriter final : public model::RoutingObserver {
 public:
  RoutingWriter(const std::string& path, const model::ModelConfig& c) : file_(path) {
    trace_.model = c.name;
    trace_.n_layer = c.n_layer;
    trace_.n_expert = c.n_expert;
    trace_.n_used = c.n_expert_used;
    write(trace_.header_line());
  }
  void routed(int64_t layer, int64_t n, int64_t n_used, const int32_t* ids, const float* weights) override {
    const sched::RoutingStep step{.layer = layer,
                                  .n_tokens = n,
                                  .ids = std::vector<int32_t>(ids, ids + n * n_used),
                                  .weights = std::vector<float>(weights, weights + n * n_used)};
    write(trace_.step_line(step));
  }
  void finish() {
    if (error_) std::rethrow_exception(error_);
    file_.commit();
  }

 private:
  // Called from inside the forward pass: an error is kept for finish() rather than thrown through the model.
  void write(const std::string& line) {
    if (error_) return;
    try {
      file_.print("{}\n", line);
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  io::OutputFile file_;
  sched::RoutingTrace trace_;  // the header's fields
  std::exception_ptr error_;
};

}  // namespace

int run(const RunOptions& opt) {
  const auto engine = open_engine({opt.model, opt.threads, opt.critical, opt.device});
  model::Model* model = &engine->model();
  const model::ModelConfig& c = model->config();
  if (opt.n_predict < 0) fail("-n must not be negative");
  std::unique_ptr<RoutingWriter> routing;
  if (!opt.trace_routing.empty()) {
    if (c.n_expert == 0) fail("--trace-routing: {} has no routed experts", opt.model);
    routing = std::make_unique<RoutingWriter>(opt.trace_routing, c);
    model->set_routing_observer(routing.get());
  }

  // A text prompt needs the tokenizer; ids need none (a file without one still runs with --tokens).
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::vector<int32_t> prompt = opt.tokens;
  if (!opt.prompt.empty() || prompt.empty()) {
    if (const auto bad = text::find_invalid_utf8(opt.prompt)) fail("the prompt is not valid UTF-8 (byte {})", *bad);
    tokenizer = open_tokenizer(model->file());
    prompt = tokenizer->encode(opt.prompt, /*add_special=*/true, /*parse_special=*/false);
    if (prompt.empty()) fail("the prompt is empty");
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t ctx = opt.ctx_size > 0 ? opt.ctx_size : std::min<int64_t>(n_prompt + opt.n_predict, c.n_ctx_train);
  if (n_prompt > ctx) fail("context full: the prompt has {} tokens, more than the context size {}", n_prompt, ctx);
  engine::Session session(*model, ctx);
  engine::Sampler sampler(opt.sampling);

  const std::unique_ptr<engine::Drafter> drafter =
      engine::make_drafter(engine::parse_draft_source(opt.draft.source), *model, session.n_ctx());
  if (drafter) session.observe(drafter->hidden_observer());
  const std::span<const float> logits = session.eval(prompt);
  const bool text_out = tokenizer && !opt.print_ids;
  std::optional<text::StreamDecoder> decoder;
  if (text_out) decoder.emplace(*tokenizer);
  int count = 0;
  engine::GenerateOptions gen{.max_tokens = opt.n_predict,
                              .stop_at_end_of_generation = tokenizer && !opt.ignore_eos,
                              .drafter = drafter.get(),
                              .draft_max = opt.draft.max};
  const engine::GenerateResult result =
      engine::generate(session, logits, sampler, tokenizer.get(), gen, [&](int32_t token) {
        if (text_out) {
          if (!tokenizer->is_end_of_generation(token)) fmt::print("{}", decoder->push(token));
        } else {
          fmt::print("{}{}", count ? " " : "", token);
        }
        ++count;
        std::fflush(stdout);
        return true;
      });
  if (text_out) fmt::print("{}", decoder->flush());
  fmt::print("\n");
  std::fflush(stdout);
  if (result.stop == engine::StopReason::kContextFull)
    fail("context full after {} tokens (context size {}); use a larger --ctx-size", session.n_past(), session.n_ctx());
  if (routing) {
    model->set_routing_observer(nullptr);
    routing->finish();
  }
  if (!opt.print_ids) {
    const engine::Session::Counters& k = session.counters();
    // A reply of one token comes from the prompt's pass: no decode step to give a rate.
    const bool decoded = k.decode_tokens + k.verify_steps > 0;
    fmt::print(stderr, "prompt {} tokens, {:.1f} tok/s; generated {} tokens, {}{}\n", k.prefill_tokens,
               k.prefill_tokens / std::max(k.prefill_seconds, 1e-9), result.tokens.size(),
               decoded ? fmt::format("{:.1f} tok/s", engine::decode_rate(k, result)) : "no decode step",
               drafter ? engine::draft_summary(result) : "");
  }
  return 0;
}

}  // namespace hetmoe::cli
