// libFuzzer target for what the server does with a request and a reply before and after the model: the OpenAI request
// parsing (parse_body, then parse_chat or parse_completion with a reference model's vocabulary and chat template, its
// own or one chosen by name) and the answer assembly of a chat reply (the request's ReplyParser fed arbitrary model
// text, then the calls as JSON).
//
// Input: byte 0 picks the model, byte 1 the endpoint (bit 0: chat), the template (bit 1: by name, the name from the
// bits above) and where the reply is cut for streaming; the rest is the body, then, after the first NUL byte, the
// reply text.
//
// Nothing may crash. The parsers may throw only ApiError with a 4xx status (the server answers anything else with
// 500). The reply gives the same reasoning, content and calls whole and cut in two or three pieces; every call's
// arguments are a JSON object but Hermes's (the model's text as written); the calls' JSON can be written.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/gguf/reader.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/tool_calls.h"
#include "server/openai.h"

namespace {

namespace fs = std::filesystem;
using hetmoe::server::ApiError;
using hetmoe::server::ParsedRequest;
using hetmoe::server::ReplyParser;
using hetmoe::text::ChatTemplate;
using hetmoe::text::Tokenizer;
using hetmoe::text::ToolCall;
using hetmoe::text::ToolCallFormat;

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_openai: %s\n", what);
  std::abort();
}

struct Model {
  std::unique_ptr<Tokenizer> vocab;
  std::unique_ptr<ChatTemplate> chat_template;  // detected from the file
};

std::vector<Model>& models() {
  static std::vector<Model> list;
  return list;
}

// The reply as the server assembles it, the model's text in pieces cut at `cuts`.
ReplyParser::Parts assemble(const ParsedRequest& r, std::string_view reply, std::vector<size_t> cuts) {
  ReplyParser parser(r);
  ReplyParser::Parts a;
  auto take = [&](ReplyParser::Parts p) {
    a.reasoning += p.reasoning;
    a.content += p.content;
    a.calls.insert(a.calls.end(), p.calls.begin(), p.calls.end());
  };
  size_t at = 0;
  cuts.push_back(reply.size());
  for (const size_t cut : cuts) {
    take(parser.push(reply.substr(at, cut - at)));
    at = cut;
  }
  take(parser.flush());
  return a;
}

// The same answer, ids aside (fresh for each call).
bool same(const ReplyParser::Parts& a, const ReplyParser::Parts& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.calls.size() != b.calls.size()) return false;
  for (size_t i = 0; i < a.calls.size(); ++i)
    if (a.calls[i].name != b.calls[i].name || a.calls[i].arguments != b.calls[i].arguments) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  for (const auto& entry : fs::directory_iterator(fs::path(HETMOE_TEST_DATA_DIR) / "models")) {
    if (entry.path().extension() != ".gguf") continue;
    const hetmoe::gguf::GgufFile file = hetmoe::gguf::GgufFile::open(entry.path().string());
    Model m{.vocab = Tokenizer::from_gguf(file), .chat_template = nullptr};
    std::string warning;
    m.chat_template = std::make_unique<ChatTemplate>(ChatTemplate::detect(file, *m.vocab, &warning));
    models().push_back(std::move(m));
  }
  require(!models().empty(), "no model in tests/data/models");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const Model& model = models()[data[0] % models().size()];
  const uint8_t flags = data[1];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t nul = rest.find('\0');
  const std::string_view body = rest.substr(0, nul);
  const std::string_view reply = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  const bool chat = flags & 1;
  const std::vector<std::string> names = ChatTemplate::names();
  std::optional<ChatTemplate> named;
  if (flags & 2) named = ChatTemplate::by_name(names[(flags >> 2) % names.size()], *model.vocab);
  const ChatTemplate& chat_template = named ? *named : *model.chat_template;

  ParsedRequest r;
  try {
    const nlohmann::json j = hetmoe::server::parse_body(body);
    const hetmoe::server::RequestDefaults defaults;
    r = chat ? hetmoe::server::parse_chat(j, *model.vocab, chat_template, defaults)
             : hetmoe::server::parse_completion(j, *model.vocab, defaults);
  } catch (const ApiError& e) {
    require(e.status >= 400 && e.status < 500, "a refusal that is not a 4xx");
    return 0;
  }
  require(!r.job.prompt.empty(), "an accepted request with an empty prompt");
  for (const int32_t id : r.job.prompt) require(id >= 0 && id < model.vocab->n_vocab(), "a prompt id out of range");
  if (!chat) return 0;

  const ReplyParser::Parts whole = assemble(r, reply, {});
  const size_t cut = reply.empty() ? 0 : (flags >> 2) * 7919u % (reply.size() + 1);
  require(same(whole, assemble(r, reply, {cut})), "the reply cut in two answers otherwise than whole");
  require(same(whole, assemble(r, reply, {cut / 2, cut})), "the reply cut in three answers otherwise than whole");
  for (const ToolCall& call : whole.calls) {
    if (r.tool_format == ToolCallFormat::kHermes) continue;  // its arguments are the model's text as written
    const nlohmann::json args = nlohmann::json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    require(args.is_object(), "a parsed call's arguments are not a JSON object");
  }
  (void)hetmoe::server::tool_calls_json(whole.calls, 0, true)
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
