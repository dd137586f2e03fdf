// hetmoe serve: the OpenAI-compatible server. SIGTERM or SIGINT stops it: no new requests, the ones in flight get
// --shutdown-grace seconds to finish, the rest are cancelled, and it exits 0.
#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <thread>

#include "runtime/error.h"
#include "server/batcher.h"
#include "server/http_server.h"
#include "tools/commands.h"

namespace hetmoe::cli {

int serve(const ServeOptions& opt) {
  if (opt.parallel < 1 || opt.parallel > 256) fail("--parallel must be between 1 and 256");
  if (opt.port < 0 || opt.port > 65535) fail("--port must be between 0 and 65535");
  // The signals go to one thread that waits for them, not to whichever thread runs: blocked here, before any thread
  // starts, so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const auto engine = open_engine({opt.model, opt.threads, opt.critical, opt.device});
  model::Model& model = engine->model();
  const model::ModelConfig& c = model.config();
  const std::unique_ptr<text::Tokenizer> tokenizer = open_tokenizer(model.file());
  text::ChatTemplate chat_template = [&] {
    if (!opt.chat_template.empty()) {
      auto t = text::ChatTemplate::by_name(opt.chat_template, *tokenizer);
      if (!t)
        fail("unknown chat template '{}' (known: {})", opt.chat_template, fmt::join(text::ChatTemplate::names(), ", "));
      return *t;
    }
    std::string warning;
    text::ChatTemplate t = text::ChatTemplate::detect(model.file(), *tokenizer, &warning);
    if (!warning.empty()) fmt::print(stderr, "hetmoe: warning: {}\n", warning);
    return t;
  }();

  // -c is the whole context, shared evenly by the slots (as llama-server does); by default each slot gets
  // min(4096, the training context).
  const int64_t slot_ctx = opt.ctx_size > 0 ? opt.ctx_size / opt.parallel : std::min<int64_t>(4096, c.n_ctx_train);
  if (slot_ctx > c.n_ctx_train)
    fail("-c {} gives each of {} slots {} positions, more than the model's training context of {}", opt.ctx_size,
         opt.parallel, slot_ctx, c.n_ctx_train);
  if (slot_ctx < 16)
    fail("-c {} gives each of {} slots only {} positions; give at least 16 per slot", opt.ctx_size, opt.parallel,
         slot_ctx);
  server::Batcher batcher(model, tokenizer.get(),
                          {.parallel = opt.parallel,
                           .slot_ctx = slot_ctx,
                           .max_batch_tokens = std::max<int64_t>(opt.batch_size, opt.parallel),
                           .max_queue = static_cast<size_t>(opt.max_queue),
                           .draft = engine::parse_draft_source(opt.draft.source),
                           .draft_max = opt.draft.max});
  std::string name = opt.alias;
  if (name.empty()) {
    name = opt.model.substr(opt.model.find_last_of('/') + 1);
    if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  }
  server::HttpServer http(batcher, model, *tokenizer, chat_template,
                          {.host = opt.host,
                           .port = opt.port,
                           .api_key = opt.api_key,
                           .max_body_bytes = static_cast<size_t>(opt.max_body_mb * (1 << 20)),
                           .model_name = name,
                           .defaults = {.sampling = opt.sampling, .max_tokens = opt.max_tokens},
                           .http_threads = 0});
  const int port = http.bind();
  fmt::print(stderr, "hetmoe: serving {} on http://{}:{} ({} slots of {} positions, chat template {}{})\n", name,
             opt.host, port, opt.parallel, slot_ctx, chat_template.name(),
             opt.api_key.empty() ? "" : ", API key required");
  std::fflush(stderr);

  std::atomic<bool> signalled{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    signalled = true;
    fmt::print(stderr, "hetmoe: {} received: finishing the requests in flight (at most {} s)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", opt.shutdown_grace);
    batcher.stop(std::chrono::milliseconds(static_cast<int64_t>(opt.shutdown_grace * 1000)));
    http.stop();
  });
  http.listen();
  // listen() returned without a signal (it failed): wake the stopper.
  if (!signalled) pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  fmt::print(stderr, "hetmoe: stopped\n");
  return 0;
}

}  // namespace hetmoe::cli
