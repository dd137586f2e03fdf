#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "runtime/model/model.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "server/batcher.h"
#include "server/openai.h"

namespace hetmoe::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (port() tells which)
  std::string api_key{};             // empty: no key needed
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  std::string model_name{};          // what /v1/models lists and responses name
  RequestDefaults defaults{};
  int http_threads = 0;  // 0: enough for every slot and the queue
};

// The OpenAI-compatible HTTP front of a Batcher: /v1/chat/completions, /v1/completions (streamed as server-sent
// events or not), /v1/models, /health, /tokenize, /detokenize, /metrics (Prometheus text). Each request is parsed
// and validated on its connection's thread, queued in the batcher, and answered as its tokens come.
class HttpServer {
 public:
  HttpServer(Batcher& batcher, model::Model& model, const text::Tokenizer& tokenizer,
             const text::ChatTemplate& chat_template, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the address; fails with one line when it cannot (port taken, bad host). Returns the port.
  int bind();
  // Serves until stop(); returns then.
  void listen();
  // Stops accepting connections; requests in flight end as the batcher ends them.
  void stop();
  // The /metrics text.
  std::string metrics() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hetmoe::server
