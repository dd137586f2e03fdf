#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>

#include "runtime/error.h"

namespace hetmoe::server {

using nlohmann::json;

namespace {

constexpr std::chrono::milliseconds kPoll{100};
// A streamed reply that has been silent this long gets an SSE comment: writing is how a closed connection shows.
constexpr std::chrono::milliseconds kKeepAlive{1000};

// Equal strings in time that does not depend on where they differ.
bool equal_in_constant_time(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

// Model output can hold bytes that are not UTF-8 (random weights, a cut character): they become U+FFFD.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, std::string_view message, std::string_view param = {},
                std::string_view type = "invalid_request_error") {
  res.status = status;
  res.set_content(dump(error_body(message, type, param)), "application/json");
}

}  // namespace

struct HttpServer::Impl {
  Impl(Batcher& b, model::Model& m, const text::Tokenizer& t, const text::ChatTemplate& ct, ServerOptions o)
      : batcher(b), model(m), tokenizer(t), chat_template(ct), options(std::move(o)) {}

  Batcher& batcher;
  model::Model& model;
  const text::Tokenizer& tokenizer;
  const text::ChatTemplate& chat_template;
  ServerOptions options;
  httplib::Server http;
  int port = 0;
  std::atomic<int64_t> http_requests{0}, http_errors{0}, streams_open{0};
  const std::time_t created = std::time(nullptr);

  void routes();
  std::string metrics_text() const;
  bool authorized(const httplib::Request& req, httplib::Response& res);
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  // What a whole answer gathers from its stream.
  struct Collected {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    int64_t tokens = 0;
    Stream::Update final;  // finished once the stream ended
  };
  std::pair<int, std::string> whole_answer(const ParsedRequest& r, const Collected& c) const;
  void answer_whole(ParsedRequest r, std::shared_ptr<Stream> stream, httplib::Response& res);
  void answer_streamed(ParsedRequest r, std::shared_ptr<Stream> stream, httplib::Response& res);
};

HttpServer::HttpServer(Batcher& batcher, model::Model& model, const text::Tokenizer& tokenizer,
                       const text::ChatTemplate& chat_template, ServerOptions options)
    : impl_(std::make_unique<Impl>(batcher, model, tokenizer, chat_template, std::move(options))) {
  Impl& s = *impl_;
  const int threads = s.options.http_threads > 0
                          ? s.options.http_threads
                          : static_cast<int>(batcher.options().parallel + batcher.options().max_queue + 4);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  s.http.set_read_timeout(30);
  s.http.set_write_timeout(30);
  s.routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  Impl& s = *impl_;
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
    if (s.port < 0) fail("cannot listen on {}: no free port", s.options.host);
  } else {
    if (!s.http.bind_to_port(s.options.host, s.options.port))
      fail("cannot listen on {}:{} (the port is taken or the address is not this machine's)", s.options.host,
           s.options.port);
    s.port = s.options.port;
  }
  return s.port;
}

void HttpServer::listen() { impl_->http.listen_after_bind(); }

void HttpServer::stop() {
  if (impl_->http.is_running()) impl_->http.stop();
}

std::string HttpServer::metrics() const { return impl_->metrics_text(); }

std::string HttpServer::Impl::metrics_text() const {
  const Impl& s = *this;
  const BatcherStats b = s.batcher.stats();
  std::string out;
  auto metric = [&](std::string_view name, std::string_view type, std::string_view help, double value) {
    out += fmt::format("# HELP hetmoe_{} {}\n# TYPE hetmoe_{} {}\nhetmoe_{} {}\n", name, help, name, type, name, value);
  };
  metric("requests_total", "counter", "Generation requests accepted into the queue.", static_cast<double>(b.requests));
  metric("requests_finished_total", "counter", "Requests that ended with a stop or length.",
         static_cast<double>(b.finished));
  metric("requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
         static_cast<double>(b.cancelled));
  metric("requests_failed_total", "counter", "Requests that ended with an error.", static_cast<double>(b.failed));
  metric("requests_rejected_total", "counter", "Requests refused with 503 because the queue was full.",
         static_cast<double>(b.rejected));
  metric("http_requests_total", "counter", "HTTP requests of any kind.", static_cast<double>(s.http_requests.load()));
  metric("http_errors_total", "counter", "HTTP answers with a 4xx or 5xx status.",
         static_cast<double>(s.http_errors.load()));
  metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", static_cast<double>(b.prompt_tokens));
  metric("prompt_tokens_cached_total", "counter", "Prompt tokens found in a slot's KV cache (not evaluated again).",
         static_cast<double>(b.cached_tokens));
  metric("prefill_tokens_total", "counter", "Prompt tokens evaluated.", static_cast<double>(b.prefill_tokens));
  metric("generated_tokens_total", "counter", "Tokens generated.", static_cast<double>(b.generated_tokens));
  metric("prefill_tokens_per_second", "gauge", "Prompt tokens evaluated per second of steps with prompt rows.",
         b.prefill_seconds > 0 ? static_cast<double>(b.prefill_tokens) / b.prefill_seconds : 0.0);
  metric("decode_steps_seconds_total", "counter", "Time in steps of decode tokens only.", b.decode_seconds);
  metric("prefill_steps_seconds_total", "counter", "Time in steps with prompt rows.", b.prefill_seconds);
  metric("steps_total", "counter", "Forward passes.", static_cast<double>(b.steps));
  metric("step_rows_total", "counter", "Rows (tokens) of all forward passes.", static_cast<double>(b.step_rows));
  metric("draft_tokens_total", "counter", "Drafted tokens evaluated (speculative decoding).",
         static_cast<double>(b.drafted_tokens));
  metric("draft_accepted_tokens_total", "counter", "Drafted tokens the model agreed with.",
         static_cast<double>(b.accepted_tokens));
  metric("queue_depth", "gauge", "Requests waiting for a slot.", static_cast<double>(b.queued));
  metric("slots_busy", "gauge", "Slots running a request.", static_cast<double>(b.busy_slots));
  metric("slots_total", "gauge", "Slots (--parallel).", static_cast<double>(b.slots));
  metric("kv_cache_used_positions", "gauge", "Positions the slots' KV caches hold.", static_cast<double>(b.kv_used));
  metric("kv_cache_total_positions", "gauge", "Positions of all slots' KV caches.", static_cast<double>(b.kv_total));
  metric("kv_cache_usage_ratio", "gauge", "Used over total KV positions.",
         b.kv_total > 0 ? static_cast<double>(b.kv_used) / static_cast<double>(b.kv_total) : 0.0);
  metric("cpu_expert_bytes_total", "counter", "Routed-expert weight bytes the CPU read.",
         static_cast<double>(b.cpu_expert_bytes));
  metric("device_bytes_to_device_total", "counter", "Bytes copied to the device (experts moved and admitted).",
         static_cast<double>(b.to_device_bytes));
  metric("device_bytes_to_host_total", "counter", "Bytes copied back from the device.",
         static_cast<double>(b.to_host_bytes));
  metric("expert_moves_total", "counter", "Routed experts moved to the device for one step.",
         static_cast<double>(b.expert_moves));
  metric("expert_admissions_total", "counter", "Routed experts admitted to the device's residency.",
         static_cast<double>(b.expert_admissions));
  metric("streams_open", "gauge", "Streamed replies in progress.", static_cast<double>(s.streams_open.load()));
  return out;
}

bool HttpServer::Impl::authorized(const httplib::Request& req, httplib::Response& res) {
  if (options.api_key.empty()) return true;
  const std::string header = req.get_header_value("Authorization");
  const std::string_view prefix = "Bearer ";
  const bool ok = header.size() > prefix.size() && header.compare(0, prefix.size(), prefix) == 0 &&
                  equal_in_constant_time(std::string_view(header).substr(prefix.size()), options.api_key);
  if (!ok) {
    send_error(res, 401, "a valid API key is required (Authorization: Bearer KEY)", {}, "authentication_error");
    res.set_header("WWW-Authenticate", "Bearer");
  }
  return ok;
}

void HttpServer::Impl::routes() {
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    ++http_requests;
    if (res.status >= 400) ++http_errors;
  });
  // httplib's own refusals (413 for a body over the limit, 404, 405) get an OpenAI error object too.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string message = res.status == 413   ? "the request body is larger than this server takes"
                                : res.status == 404 ? "no such endpoint"
                                                    : fmt::format("HTTP status {}", res.status);
    res.set_content(dump(error_body(message, "invalid_request_error", {})), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    send_error(res, 500, message, {}, "server_error");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (batcher.stopping()) return send_error(res, 503, "the server is shutting down", {}, "server_overloaded");
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    // The owner's metrics(): the server object outlives its routes.
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const model::ModelConfig& c = model.config();
    json m = {{"id", options.model_name},
              {"object", "model"},
              {"created", created},
              {"owned_by", "hetmoe"},
              {"meta", {{"architecture", c.arch_name}, {"n_ctx_slot", batcher.options().slot_ctx}}}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    try {
      const json body = parse_body(req.body);
      const auto it = body.find("content");
      if (it == body.end() || !it->is_string()) throw ApiError(400, "'content' must be a string", "content");
      const std::string content = it->get<std::string>();
      if (text::find_invalid_utf8(content)) throw ApiError(400, "'content' is not valid UTF-8", "content");
      const bool add_special = boolean(body, "add_special").value_or(false);
      const bool with_pieces = boolean(body, "with_pieces").value_or(false);
      const std::vector<int32_t> ids = tokenizer.encode(content, add_special, /*parse_special=*/true);
      json tokens = json::array();
      for (int32_t id : ids) {
        if (!with_pieces) {
          tokens.push_back(id);
          continue;
        }
        const std::string piece = tokenizer.token_to_piece(id, true);
        tokens.push_back(
            {{"id", id},
             {"piece",
              text::find_invalid_utf8(piece) ? json(std::vector<uint8_t>(piece.begin(), piece.end())) : json(piece)}});
      }
      res.set_content(dump(json{{"tokens", tokens}}), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what(), e.param, e.type);
    }
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    try {
      const json body = parse_body(req.body);
      const auto it = body.find("tokens");
      if (it == body.end() || !it->is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
      std::vector<int32_t> ids;
      for (const json& x : *it) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tokenizer.n_vocab())
          throw ApiError(400, fmt::format("'tokens' must hold token ids below {}", tokenizer.n_vocab()), "tokens");
        ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
      }
      std::string content = tokenizer.decode(ids);
      // A cut at a partial character: the bytes that are not UTF-8 become U+FFFD, so the JSON stays valid.
      while (const auto bad = text::find_invalid_utf8(content)) content.replace(*bad, 1, "\xEF\xBF\xBD");
      res.set_content(dump(json{{"content", content}}), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what(), e.param, e.type);
    }
  });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (!authorized(req, res)) return;
  ParsedRequest r;
  std::shared_ptr<Stream> stream;
  try {
    const json body = parse_body(req.body);
    r = chat ? parse_chat(body, tokenizer, chat_template, options.defaults)
             : parse_completion(body, tokenizer, options.defaults);
    if (static_cast<int64_t>(r.job.prompt.size()) >= batcher.options().slot_ctx)
      throw ApiError(400,
                     fmt::format("the prompt has {} tokens; the context of a slot is {} positions", r.job.prompt.size(),
                                 batcher.options().slot_ctx),
                     chat ? "messages" : "prompt", "context_length_exceeded");
    stream = batcher.submit(r.job);
  } catch (const ApiError& e) {
    return send_error(res, e.status, e.what(), e.param, e.type);
  } catch (const Unavailable& e) {
    res.set_header("Retry-After", "1");
    return send_error(res, 503, e.what(), {}, "server_overloaded");
  } catch (const Error& e) {
    return send_error(res, 400, e.what());
  }
  if (r.stream) return answer_streamed(std::move(r), std::move(stream), res);
  answer_whole(std::move(r), std::move(stream), res);
}

// A whole answer: what the stream gave, as the endpoint's JSON. Its status: 200, or an error's.
std::pair<int, std::string> HttpServer::Impl::whole_answer(const ParsedRequest& r, const Collected& c) const {
  const Stream::Update& u = c.final;
  if (u.finish == Finish::kError) return {500, dump(error_body(u.error, "server_error", {}))};
  if (u.finish == Finish::kCancelled)
    return {503, dump(error_body("the request was cancelled (the server is stopping)", "server_error", {}))};
  json choice = {{"index", 0}, {"finish_reason", finish_reason(u.finish)}};
  json out = {{"id", random_id(r.chat ? "chatcmpl" : "cmpl")},
              {"created", std::time(nullptr)},
              {"model", options.model_name},
              {"system_fingerprint", "hetmoe"},
              {"usage", usage_json(u)}};
  if (r.chat) {
    ReplyParser reply(r);
    ReplyParser::Parts parts = reply.push(c.text), rest = reply.flush();
    parts.reasoning += rest.reasoning;
    parts.content += rest.content;
    parts.calls.insert(parts.calls.end(), rest.calls.begin(), rest.calls.end());
    json message = {{"role", "assistant"}, {"content", parts.content}};
    if (!parts.calls.empty()) {
      const size_t b = parts.content.find_first_not_of(" \n\r\t");
      const size_t e = parts.content.find_last_not_of(" \n\r\t");
      message["content"] = b == std::string::npos ? json(nullptr) : json(parts.content.substr(b, e - b + 1));
      message["tool_calls"] = tool_calls_json(parts.calls, 0, false);
      if (u.finish == Finish::kStop) choice["finish_reason"] = "tool_calls";
    }
    if (!parts.reasoning.empty()) message["reasoning_content"] = parts.reasoning;
    choice["message"] = std::move(message);
    choice["logprobs"] = r.logprobs ? chat_logprobs(c.logprobs, tokenizer) : json(nullptr);
    out["object"] = "chat.completion";
  } else {
    choice["text"] = c.text;
    choice["logprobs"] = r.logprobs ? completion_logprobs(c.logprobs, tokenizer, 0) : json(nullptr);
    out["object"] = "text_completion";
  }
  out["choices"] = json::array({std::move(choice)});
  return {200, dump(out)};
}

// Whole answers wait for their first token in the handler: an error in the prompt's evaluation still gets its
// status. Then the rest is awaited in a content provider that watches the connection, so a client that hangs up
// cancels its request at the next step; the status (200) is sent with the body at the end.
void HttpServer::Impl::answer_whole(ParsedRequest r, std::shared_ptr<Stream> stream, httplib::Response& res) {
  auto c = std::make_shared<Collected>();
  auto add = [](Collected& c, Stream::Update u) {
    c.text += u.text;
    c.logprobs.insert(c.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    c.tokens += u.tokens;
    if (u.finished) c.final = std::move(u);
  };
  while (!c->final.finished && c->tokens == 0) add(*c, stream->take(kPoll));
  if (c->final.finished) {
    const auto [status, body] = whole_answer(r, *c);
    res.status = status;
    res.set_content(body, "application/json");
    return;
  }
  ++streams_open;
  res.set_chunked_content_provider(
      "application/json",
      [this, r = std::move(r), stream, c, add](size_t, httplib::DataSink& sink) {
        while (!c->final.finished) {
          if (!sink.is_writable()) {
            stream->cancel();
            return false;
          }
          add(*c, stream->take(kPoll));
        }
        const std::string body = whole_answer(r, *c).second;
        if (!sink.write(body.data(), body.size())) return false;
        sink.done();
        return true;
      },
      [this, stream](bool success) {
        if (!success) stream->cancel();
        --streams_open;
      });
}

void HttpServer::Impl::answer_streamed(ParsedRequest r, std::shared_ptr<Stream> stream, httplib::Response& res) {
  // State the provider keeps between its calls.
  struct State {
    ParsedRequest r;
    std::shared_ptr<Stream> stream;
    std::string id;
    std::time_t created;
    std::optional<ReplyParser> reply;  // chat
    size_t n_calls = 0;
    bool sent_role = false, done = false;
    size_t text_offset = 0;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto st = std::make_shared<State>(
      State{.r = std::move(r), .stream = std::move(stream), .id = {}, .created = std::time(nullptr), .reply = {}});
  st->id = random_id(st->r.chat ? "chatcmpl" : "cmpl");
  if (st->r.chat) st->reply.emplace(st->r);
  ++streams_open;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st](size_t, httplib::DataSink& sink) {
        State& s = *st;
        auto send = [&](const json& chunk) {
          const std::string line = "data: " + dump(chunk) + "\n\n";
          s.last_write = std::chrono::steady_clock::now();
          return sink.write(line.data(), line.size());
        };
        auto chunk = [&](json choice) {
          return json{{"id", s.id},
                      {"object", s.r.chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", s.created},
                      {"model", options.model_name},
                      {"system_fingerprint", "hetmoe"},
                      {"choices", json::array({std::move(choice)})}};
        };
        if (s.done) return false;
        if (s.r.chat && !s.sent_role) {
          s.sent_role = true;
          if (!send(chunk({{"index", 0},
                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}}))) {
            s.stream->cancel();
            return false;
          }
        }
        if (!sink.is_writable()) {  // the client went away
          s.stream->cancel();
          return false;
        }
        const Stream::Update u = s.stream->take(kPoll);
        // The text (and its tokens' logprobs) as one chunk.
        auto text_chunk = [&](const ReplyParser::Parts& found, const std::vector<TokenLogprob>& lps) {
          if (s.r.chat) {
            json delta = json::object();
            if (!found.reasoning.empty()) delta["reasoning_content"] = found.reasoning;
            // Once a call was made, the whitespace between calls is not content.
            const bool blank = found.content.find_first_not_of(" \n\r\t") == std::string::npos;
            if (!found.content.empty() && !(blank && (s.n_calls > 0 || !found.calls.empty())))
              delta["content"] = found.content;
            if (!found.calls.empty()) {
              delta["tool_calls"] = tool_calls_json(found.calls, s.n_calls, true);
              s.n_calls += found.calls.size();
            }
            if (delta.empty() && lps.empty()) return true;
            return send(chunk({{"index", 0},
                               {"delta", delta},
                               {"logprobs", s.r.logprobs ? chat_logprobs(lps, tokenizer) : json(nullptr)},
                               {"finish_reason", nullptr}}));
          }
          if (found.content.empty() && lps.empty()) return true;
          json lp = s.r.logprobs ? completion_logprobs(lps, tokenizer, s.text_offset) : json(nullptr);
          s.text_offset += found.content.size();
          return send(chunk({{"index", 0}, {"text", found.content}, {"logprobs", lp}, {"finish_reason", nullptr}}));
        };
        bool ok = text_chunk(
            s.r.chat ? s.reply->push(u.text) : ReplyParser::Parts{.reasoning = {}, .content = u.text, .calls = {}},
            u.logprobs);
        if (ok && u.finished) {
          if (s.r.chat) ok = text_chunk(s.reply->flush(), {});
          if (ok && u.finish == Finish::kError) {
            const std::string line = "data: " + dump(error_body(u.error, "server_error", {})) + "\n\n";
            ok = sink.write(line.data(), line.size());
          } else if (ok) {
            const std::string reason =
                s.n_calls > 0 && u.finish == Finish::kStop ? std::string("tool_calls") : finish_reason(u.finish);
            json last = chunk(
                s.r.chat
                    ? json{{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", reason}}
                    : json{{"index", 0},
                           {"text", ""},
                           {"logprobs", nullptr},
                           {"finish_reason", finish_reason(u.finish)}});
            last["usage"] = usage_json(u);
            ok = send(last);
          }
          static constexpr std::string_view kDone = "data: [DONE]\n\n";
          if (ok) ok = sink.write(kDone.data(), kDone.size());
          s.done = true;
          if (ok) sink.done();
          return ok;
        }
        // Silence is broken by a comment now and then: a client that went away shows when a write fails.
        if (ok && std::chrono::steady_clock::now() - s.last_write > kKeepAlive) {
          static constexpr std::string_view kComment = ": keep-alive\n\n";
          s.last_write = std::chrono::steady_clock::now();
          ok = sink.write(kComment.data(), kComment.size());
        }
        if (!ok) s.stream->cancel();
        return ok;
      },
      [this, st](bool success) {
        if (!success || !st->done) st->stream->cancel();
        --streams_open;
      });
}

}  // namespace hetmoe::server
