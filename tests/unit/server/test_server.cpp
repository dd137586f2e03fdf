// The server in process, over loopback HTTP: answers equal to a plain session's greedy run, streamed and not; the
// same tokens for a request alone and among seven others; errors as OpenAI error objects with their statuses; the
// slot of a client that goes away mid-stream freed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/session.h"
#include "runtime/model/model.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "server/batcher.h"
#include "server/http_server.h"
#include "server/openai.h"

namespace hetmoe::server {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string model_path(const std::string& name) { return (fs::path(HETMOE_TEST_DATA_DIR) / "models" / name).string(); }

// A model, its batcher and its HTTP server on a free loopback port, serving on a thread of its own.
struct Served {
  explicit Served(const std::string& name, BatcherOptions b = {.parallel = 4, .slot_ctx = 256}, ServerOptions o = {})
      : model(model::Model::load(model_path(name), 2)),
        tokenizer(text::Tokenizer::from_gguf(model->file())),
        chat_template(*text::ChatTemplate::by_name("chatml", *tokenizer)),
        batcher(*model, tokenizer.get(), b) {
    o.port = 0;
    o.model_name = "tiny";
    o.defaults.sampling.temperature = 0;
    http = std::make_unique<HttpServer>(batcher, *model, *tokenizer, chat_template, o);
    port = http->bind();
    thread = std::thread([this] { http->listen(); });
  }
  ~Served() {
    batcher.stop(std::chrono::milliseconds(0));
    http->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body) const {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  std::unique_ptr<model::Model> model;
  std::unique_ptr<text::Tokenizer> tokenizer;
  text::ChatTemplate chat_template;
  Batcher batcher;
  std::unique_ptr<HttpServer> http;
  int port = 0;
  std::thread thread;
};

// What a plain session's greedy run continues the prompt with (as `hetmoe run --temp 0` does), as text.
std::string greedy_text(model::Model& m, const text::Tokenizer& t, const std::vector<int32_t>& prompt, int n) {
  engine::Session s(m, 256);
  std::span<const float> l = s.eval(prompt);
  text::StreamDecoder decoder(t);
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    if (t.is_end_of_generation(next)) break;
    out += decoder.push(next);
    if (i + 1 < n) l = s.eval(std::vector<int32_t>{next});
  }
  return out + decoder.flush();
}

json body_of(const httplib::Result& r) { return json::parse(r->body, nullptr, false); }

// Model text as the server's JSON carries it (bytes that are not UTF-8 become U+FFFD).
std::string as_json_text(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

TEST(Server, CompletionsEqualTheGreedyRunStreamedOrNot) {
  Served s("tiny-qwen3moe-Q4_K_M.gguf");
  const std::string prompt = "The quick brown fox";
  const std::string expected =
      as_json_text(greedy_text(*s.model, *s.tokenizer, s.tokenizer->encode(prompt, true, true), 12));
  auto r = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = body_of(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], expected);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");

  // Streamed: the chunks' texts add up to the same, then a last chunk with the finish reason and usage, then [DONE].
  auto sr = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 12}, {"stream", true}});
  ASSERT_TRUE(sr);
  ASSERT_EQ(sr->status, 200);
  std::string text, finish;
  bool done = false, usage = false;
  std::istringstream lines(sr->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: ", 0) != 0) continue;
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    const json c = json::parse(line.substr(6));
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    usage = usage || c.contains("usage");
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(text, expected);
  // The second request found the first's prompt in a slot's cache.
  EXPECT_GT(s.batcher.stats().cached_tokens, 0);
}

// With n-gram drafts the server's replies are the plain greedy runs' (their verification batches equal to rounding;
// these prompts part nowhere near a tie), drafts are evaluated and accepted, and a slot's cache holds only what the
// reply kept: a second request continuing the first's prompt and reply finds it cached and gets the plain run's text.
TEST(Server, DraftedRepliesEqualThePlainGreedyRuns) {
  Served s(
      "tiny-qwen3moe-Q4_K_M.gguf",
      {.parallel = 2, .slot_ctx = 256, .draft = engine::DraftSource::kNgram, .draft_max = 4, .adaptive_drafts = false});
  for (const std::string prompt : {"one two three four one two three four one two", "The quick brown fox"}) {
    SCOPED_TRACE(prompt);
    const std::vector<int32_t> ids = s.tokenizer->encode(prompt, true, true);
    const std::string expected = as_json_text(greedy_text(*s.model, *s.tokenizer, ids, 40));
    for (int again = 0; again < 2; ++again) {
      auto r = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}});
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      const json j = body_of(r);
      EXPECT_EQ(j["choices"][0]["text"], expected) << again;
      EXPECT_EQ(j["usage"]["completion_tokens"], 40);
    }
  }
  const BatcherStats st = s.batcher.stats();
  EXPECT_GT(st.drafted_tokens, 0);
  EXPECT_GT(st.accepted_tokens, 0);
  EXPECT_GT(st.cached_tokens, 0);
}

// MTP drafts in the server: each slot drafts with the block over its own session's hidden states; the replies are
// the plain greedy runs' (these prompts part nowhere near a tie), the second request reusing a slot's cache.
TEST(Server, MtpDraftedRepliesEqualThePlainGreedyRuns) {
  Served s(
      "tiny-glm4moe-Q4_K_M.gguf",
      {.parallel = 2, .slot_ctx = 256, .draft = engine::DraftSource::kMtp, .draft_max = 3, .adaptive_drafts = false});
  for (const std::string prompt : {"one two three four one two three four one two", "The quick brown fox"}) {
    SCOPED_TRACE(prompt);
    const std::vector<int32_t> ids = s.tokenizer->encode(prompt, true, true);
    const std::string expected = as_json_text(greedy_text(*s.model, *s.tokenizer, ids, 24));
    for (int again = 0; again < 2; ++again) {
      auto r = s.post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}});
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      EXPECT_EQ(body_of(r)["choices"][0]["text"], expected) << again;
    }
  }
  EXPECT_GT(s.batcher.stats().drafted_tokens, 0);
  EXPECT_GT(s.batcher.stats().cached_tokens, 0);
}

// Drafts sized by each sequence's budget (the default): one request at a time (its steps its own, so timed) and two
// at once (shared steps: acceptance counted, time not) still give the plain greedy runs' replies, and a repeated
// passage, whose n-gram drafts the model accepts, gets drafted.
TEST(Server, AdaptiveDraftsKeepTheGreedyReplies) {
  Served s("tiny-qwen3moe-Q4_K_M.gguf",
           {.parallel = 2, .slot_ctx = 256, .draft = engine::DraftSource::kNgram, .draft_max = 4});
  const std::string prompt = "one two three four one two three four one two";
  const std::vector<int32_t> ids = s.tokenizer->encode(prompt, true, true);
  const std::string expected = as_json_text(greedy_text(*s.model, *s.tokenizer, ids, 40));
  const json request = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}};
  auto r = s.post("/v1/completions", request);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(body_of(r)["choices"][0]["text"], expected);
  std::optional<httplib::Result> both[2];
  {
    std::vector<std::jthread> clients;
    for (auto& result : both) clients.emplace_back([&] { result.emplace(s.post("/v1/completions", request)); });
  }
  for (auto& result : both) {
    ASSERT_TRUE(result && *result);
    ASSERT_EQ((*result)->status, 200) << (*result)->body;
    EXPECT_EQ(body_of(*result)["choices"][0]["text"], expected);
  }
  EXPECT_GT(s.batcher.stats().drafted_tokens, 0);
}

// The tokens a chat reply chose (each token's bytes) and the alone run's margins (top-1 minus top-2 log probability).
struct Reply {
  std::vector<json> tokens;
  std::vector<double> logprobs, margins;
};
Reply chat_reply(const Served& s, const std::string& user) {
  auto r = s.post("/v1/chat/completions", {{"messages", json::array({json{{"role", "user"}, {"content", user}}})},
                                           {"max_tokens", 10},
                                           {"ignore_eos", true},
                                           {"logprobs", true},
                                           {"top_logprobs", 2}});
  Reply out;
  if (!r || r->status != 200) {
    ADD_FAILURE() << (r ? r->body : std::string("no answer"));
    return out;
  }
  const json body = body_of(r);
  for (const json& t : body["choices"][0]["logprobs"]["content"]) {
    out.tokens.push_back(t["bytes"]);
    out.logprobs.push_back(t["logprob"].get<double>());
    out.margins.push_back(t["top_logprobs"][0]["logprob"].get<double>() -
                          t["top_logprobs"][1]["logprob"].get<double>());
  }
  return out;
}

// Eight chat requests one at a time, then the same eight at once (their rows in the same forward passes): each gets
// the same tokens with the same log probabilities (to 0.05), up to a step where a rounding of the batch's kernels
// chose the other of two tokens whose margin alone was below 0.1 (the reference README's rule for rounding events;
// these random-weight models have margins of 0.01 often). A rounding can also move a router's choice between two
// experts of nearly equal score, which moves the log probabilities from that step on while the token may stay: one
// request of the eight may part that way. Most steps are compared.
TEST(Server, ARequestGetsTheSameTokensAloneAndAmongSevenOthers) {
  for (const std::string name : {"tiny-deepseek3-Q4_K_M.gguf", "tiny-qwen35moe-Q4_K_M.gguf"}) {
    SCOPED_TRACE(name);
    Served s(name, {.parallel = 8, .slot_ctx = 256});
    std::vector<std::string> users;
    for (int i = 0; i < 8; ++i) users.push_back(fmt::format("Question {}: what is {} times {}?", i, i + 2, 7 - i));
    std::vector<Reply> alone;
    for (const std::string& u : users) alone.push_back(chat_reply(s, u));
    const int64_t steps_before = s.batcher.stats().steps, rows_before = s.batcher.stats().step_rows;
    std::vector<std::future<Reply>> futures;
    for (const std::string& u : users)
      futures.push_back(std::async(std::launch::async, [&s, u] { return chat_reply(s, u); }));
    int compared = 0, routing_parted = 0;
    for (size_t i = 0; i < users.size(); ++i) {
      const Reply together = futures[i].get();
      ASSERT_EQ(alone[i].tokens.size(), 10u);
      ASSERT_EQ(together.tokens.size(), 10u);
      for (size_t k = 0; k < 10; ++k, ++compared) {
        if (together.tokens[k] != alone[i].tokens[k]) {
          EXPECT_LT(alone[i].margins[k], 0.1) << "request " << i << " token " << k << " parted at a clear margin";
          break;
        }
        if (std::abs(together.logprobs[k] - alone[i].logprobs[k]) > 0.05) {
          ++routing_parted;
          break;
        }
      }
    }
    EXPECT_LE(routing_parted, 1) << "requests whose log probabilities parted with the same tokens";
    EXPECT_GE(compared, 40);
    // They did share forward passes: more rows than steps.
    const BatcherStats after = s.batcher.stats();
    EXPECT_GT(after.step_rows - rows_before, 2 * (after.steps - steps_before));
  }
}

// Refusals are OpenAI error objects with the right status, and the server stays healthy.
TEST(Server, BadRequestsGetErrorObjects) {
  Served s("tiny-qwen3moe-Q4_K_M.gguf", {.parallel = 2, .slot_ctx = 64}, {.max_body_bytes = 4096});
  auto status_of = [&](const std::string& path, const std::string& body) {
    auto r = s.client().Post(path.c_str(), body, "application/json");
    if (!r) return std::make_pair(0, json());
    return std::make_pair(r->status, body_of(r));
  };
  for (const auto& [body, param] :
       std::vector<std::pair<std::string, std::string>>{{"{not json", ""},
                                                        {"[1,2]", ""},
                                                        {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
                                                        {R"({"prompt": "x", "max_tokens": -3})", "max_tokens"},
                                                        {R"({"prompt": "x", "top_p": 7})", "top_p"},
                                                        {R"({"prompt": "x", "stop": [1]})", "stop"},
                                                        {R"({"prompt": [1, 99999999]})", "prompt"},
                                                        {R"({"prompt": "x", "n": 2})", "n"},
                                                        {R"({"max_tokens": 3})", "prompt"}}) {
    const auto [status, j] = status_of("/v1/completions", body);
    EXPECT_EQ(status, 400) << body;
    EXPECT_TRUE(j.contains("error")) << body;
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << body;
    }
  }
  // A prompt longer than a slot's context.
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word ";
  auto [status, j] = status_of("/v1/completions", json{{"prompt", long_prompt}}.dump());
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["type"], "context_length_exceeded");
  // Messages of a role the template has no place for, or without content.
  EXPECT_EQ(status_of("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})").first, 400);
  EXPECT_EQ(status_of("/v1/chat/completions", R"({"messages": []})").first, 400);
  // A body over the limit.
  const auto big = status_of("/v1/completions", json{{"prompt", std::string(10000, 'a')}}.dump());
  EXPECT_EQ(big.first, 413);
  EXPECT_TRUE(big.second.contains("error"));
  EXPECT_EQ(status_of("/v1/nothing", "{}").first, 404);
  auto h = s.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(s.batcher.stats().busy_slots, 0);
}

TEST(Server, TheApiKeyIsRequiredWhenSet) {
  Served s("tiny-qwen3moe-Q4_K_M.gguf", {.parallel = 1, .slot_ctx = 64}, {.api_key = "sesame"});
  const std::string body = json{{"prompt", "hi"}, {"max_tokens", 2}}.dump();
  auto none = s.client().Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(body_of(none)["error"]["type"], "authentication_error");
  for (const std::string key : {"Bearer sesam", "Bearer sesame2", "sesame", "Bearer "}) {
    auto r = s.client().Post("/v1/completions", {{"Authorization", key}}, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << key;
  }
  auto ok = s.client().Post("/v1/completions", {{"Authorization", "Bearer sesame"}}, body, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  // /health needs no key (a load balancer's probe).
  EXPECT_EQ(s.client().Get("/health")->status, 200);
}

TEST(Server, AFullQueueGets503WithRetryAfter) {
  Served s("tiny-qwen3moe-Q4_K_M.gguf", {.parallel = 1, .slot_ctx = 256, .max_queue = 1});
  // One long request runs, one waits; the next finds the queue full.
  auto first = std::async(std::launch::async, [&] {
    return s.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 200}});
  });
  while (s.batcher.stats().busy_slots == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto second = std::async(std::launch::async, [&] {
    return s.post("/v1/completions", {{"prompt", "b"}, {"max_tokens", 2}});
  });
  while (s.batcher.stats().queued == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto third = s.post("/v1/completions", {{"prompt", "c"}, {"max_tokens", 2}});
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 503);
  EXPECT_EQ(third->get_header_value("Retry-After"), "1");
  EXPECT_EQ(first.get()->status, 200);
  EXPECT_EQ(second.get()->status, 200);
  EXPECT_EQ(s.batcher.stats().rejected, 1);
}

// A client that reads two chunks of a long stream and hangs up: its sequence is cancelled within a few steps and
// its slot is free again.
TEST(Server, AClientThatGoesAwayFreesItsSlot) {
  // The requests ignore the end-of-generation token, so that only the client's going away ends them early: the
  // tiny model writes thousands of tokens a second, and the 16000 asked for take several times the client's timeout.
  Served s("tiny-qwen3moe-Q4_K_M.gguf", {.parallel = 1, .slot_ctx = 16384});
  {
    httplib::Client c = s.client();
    int chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.set_header("Content-Type", "application/json");
    req.body =
        json{{"prompt", "tell a long story"}, {"max_tokens", 400}, {"stream", true}, {"ignore_eos", true}}.dump();
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
    c.send(req);
  }
  for (int i = 0; i < 500 && s.batcher.stats().busy_slots > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  BatcherStats st = s.batcher.stats();
  EXPECT_EQ(st.busy_slots, 0);
  EXPECT_EQ(st.cancelled, 1);
  EXPECT_LT(st.generated_tokens, 400);
  // A whole answer's client that gives up waiting (its read times out, it closes the connection): the same.
  {
    httplib::Client c = s.client();
    c.set_read_timeout(0, 200'000);
    auto r = c.Post("/v1/completions",
                    json{{"prompt", "tell a long story"}, {"max_tokens", 16000}, {"ignore_eos", true}}.dump(),
                    "application/json");
    EXPECT_FALSE(r);
  }
  for (int i = 0; i < 500 && s.batcher.stats().busy_slots > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  st = s.batcher.stats();
  EXPECT_EQ(st.busy_slots, 0);
  EXPECT_EQ(st.cancelled, 2);
  EXPECT_LT(st.generated_tokens, 400 + 16000);
  // The slot serves the next request.
  auto r = s.post("/v1/completions", {{"prompt", "again"}, {"max_tokens", 3}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// Stopping (SIGTERM's path): no new request is taken (503), the ones in flight finish within the grace, the rest
// are cancelled.
TEST(Server, StoppingFinishesOrCancelsWhatIsInFlight) {
  for (const bool grace : {true, false}) {
    SCOPED_TRACE(grace ? "with grace" : "without");
    Served s("tiny-qwen3moe-Q4_K_M.gguf", {.parallel = 1, .slot_ctx = 512});
    Job job;
    job.prompt = {1, 2, 3};
    job.sampling.temperature = 0;
    job.max_tokens = 300;
    auto running = s.batcher.submit(job);
    auto waiting = s.batcher.submit(job);
    while (s.batcher.stats().busy_slots == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::thread stopper(
        [&] { s.batcher.stop(grace ? std::chrono::milliseconds(60000) : std::chrono::milliseconds(0)); });
    while (!s.batcher.stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto refused = s.post("/v1/completions", {{"prompt", "late"}, {"max_tokens", 2}});
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 503);
    EXPECT_EQ(s.client().Get("/health")->status, 503);
    stopper.join();
    for (const auto& st : {running, waiting}) {
      Stream::Update u;
      int64_t tokens = 0;
      do {
        u = st->take(std::chrono::milliseconds(10));
        tokens += u.tokens;
      } while (!u.finished);
      EXPECT_EQ(u.finish, grace ? Finish::kLength : Finish::kCancelled);
      if (grace) {
        EXPECT_EQ(tokens, 300);
      }
    }
  }
}

// Tools go into the prompt as the template writes them (Qwen3's here), with calls and results in the history; a
// required call is opened by the prompt; tools the request gets wrong are 400.
TEST(Server, ToolsReachThePromptAndBadToolsAre400) {
  Served s("tiny-qwen3moe-Q4_K_M.gguf", {.parallel = 1, .slot_ctx = 1024});
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "The weather in a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  const json history = json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"}])");
  auto prompt_tokens = [&](json body) {
    body["max_tokens"] = 1;
    auto r = s.post("/v1/chat/completions", body);
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    return body_of(r)["usage"]["prompt_tokens"].get<int64_t>();
  };
  const int64_t plain = prompt_tokens({{"messages", history}});
  const int64_t with_tools = prompt_tokens({{"messages", history}, {"tools", tools}});
  EXPECT_GT(with_tools, plain + 50);  // the tool list and its instructions
  EXPECT_EQ(prompt_tokens({{"messages", history}, {"tools", tools}, {"tool_choice", "none"}}), plain);
  // A reply's reasoning_content goes back where the template keeps it (Qwen3: the reply after the last query).
  json reasoned = history;
  reasoned[1]["reasoning_content"] = "The user wants the weather, so I call the tool for Paris.";
  EXPECT_GT(prompt_tokens({{"messages", reasoned}}), plain + 5);
  // A forced call: the prompt ends with the call's opening, which the reply then continues.
  const int64_t forced =
      prompt_tokens({{"messages", history},
                     {"tools", tools},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_GT(forced, with_tools + 5);
  for (const json& bad : {json{{"messages", history}, {"tools", "get_weather"}},
                          json{{"messages", history}, {"tools", json::array({{{"type", "retrieval"}}})}},
                          // A field of the wrong type where a string is looked for (once a 500).
                          json{{"messages", history}, {"tools", json::array({{{"type", {{"name", "f"}}}}})}},
                          json{{"messages", history}, {"tools", tools}, {"tool_choice", "sometimes"}},
                          json{{"messages", history},
                               {"tools", tools},
                               {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
                          json{{"messages", json::array({{{"role", "assistant"}, {"tool_calls", "x"}}})}},
                          json{{"messages", json::array({{{"role", "assistant"}, {"reasoning_content", 1}}})}}}) {
    auto r = s.post("/v1/chat/completions", bad);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad.dump();
  }
}

// gpt-oss: a calling message's reasoning (reasoning_content as this server answers it, or gpt-oss's own `thinking`)
// goes back as the analysis message its template writes before the call. DeepSeek-V4:
// a developer message stays a developer message (its template writes it as a user turn); elsewhere it is a system one.
TEST(Server, CallReasoningAndDeveloperMessagesGoWhereTheTemplatesPutThem) {
  const std::unique_ptr<model::Model> model = model::Model::load(model_path("tiny-qwen3moe-Q4_K_M.gguf"), 1);
  const std::unique_ptr<text::Tokenizer> tokenizer = text::Tokenizer::from_gguf(model->file());
  const text::ChatTemplate oss = *text::ChatTemplate::by_name("gpt-oss", *tokenizer);
  auto prompt = [&](const text::ChatTemplate& t, const json& messages) {
    const ParsedRequest r = parse_chat(json{{"messages", messages}}, *tokenizer, t, {});
    return tokenizer->decode(r.job.prompt, /*render_special=*/true);
  };
  json call = json::parse(R"([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
          "function": {"name": "get_weather", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "18C"}])");
  const std::string analysis = "<|start|>assistant<|channel|>analysis<|message|>I need the tool.<|end|>";
  EXPECT_EQ(prompt(oss, call).find(analysis), std::string::npos);
  for (const char* key : {"reasoning_content", "thinking"}) {
    json with = call;
    with[1][key] = "I need the tool.";
    EXPECT_NE(prompt(oss, with).find(analysis + "<|start|>assistant to=functions.get_weather"), std::string::npos)
        << key;
    // With content too: `thinking` is refused (as the template refuses it), `reasoning_content` left out (the
    // content is the analysis then).
    with[1]["content"] = "Checking.";
    if (std::string(key) == "thinking") {
      EXPECT_THROW(parse_chat(json{{"messages", with}}, *tokenizer, oss, {}), ApiError);
    } else {
      EXPECT_NE(prompt(oss, with).find("<|channel|>analysis<|message|>Checking.<|end|>"), std::string::npos);
    }
  }
  const json developer = json::parse(R"([{"role": "developer", "content": "Be brief."},
      {"role": "user", "content": "Hi"}])");
  const text::ChatTemplate v4 = *text::ChatTemplate::by_name("deepseek-v4", *tokenizer);
  EXPECT_NE(prompt(v4, developer).find("<｜User｜>Be brief.\n\nHi<｜Assistant｜>"), std::string::npos);
  const text::ChatTemplate chatml = *text::ChatTemplate::by_name("chatml", *tokenizer);
  EXPECT_NE(prompt(chatml, developer).find("<|im_start|>system\nBe brief.<|im_end|>"), std::string::npos);
}

TEST(Server, TokenizeDetokenizeModelsAndMetrics) {
  Served s("tiny-qwen3moe-Q4_K_M.gguf");
  auto t = s.post("/tokenize", {{"content", "hello world"}});
  ASSERT_TRUE(t);
  const std::vector<int32_t> ids = body_of(t)["tokens"];
  EXPECT_EQ(ids, s.tokenizer->encode("hello world", false, true));
  auto d = s.post("/detokenize", {{"tokens", ids}});
  ASSERT_TRUE(d);
  EXPECT_EQ(body_of(d)["content"], "hello world");
  auto m = s.client().Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(body_of(m)["data"][0]["id"], "tiny");
  ASSERT_EQ(s.post("/v1/completions", {{"prompt", "count"}, {"max_tokens", 4}})->status, 200);
  auto metrics = s.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("hetmoe_requests_total 1\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("hetmoe_generated_tokens_total 4\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("# TYPE hetmoe_slots_busy gauge"), std::string::npos);
  EXPECT_NE(metrics->body.find("hetmoe_cpu_expert_bytes_total "), std::string::npos);
}

}  // namespace
}  // namespace hetmoe::server
