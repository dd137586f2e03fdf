// hetmoe chat: an interactive conversation with line editing, streaming replies and KV reuse between turns; with
// stdin not a terminal it reads one user message per line and prints only the replies.
#include <fmt/format.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <sys/select.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "runtime/engine/conversation.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/session.h"
#include "runtime/error.h"
#include "runtime/io/input_file.h"
#include "runtime/io/output_file.h"
#include "runtime/model/model.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/terminal_safe.h"
#include "runtime/text/think_filter.h"
#include "runtime/text/tokenizer.h"
#include "tools/commands.h"

namespace hetmoe::cli {
namespace {

namespace fs = std::filesystem;

std::string to_hex(std::string_view bytes) {
  std::string hex;
  hex.reserve(2 * bytes.size());
  for (unsigned char c : bytes) hex += fmt::format("{:02x}", c);
  return hex;
}

std::string from_hex(std::string_view hex) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail("the saved cache's text is not hexadecimal");
  };
  if (hex.size() % 2 != 0) fail("the saved cache's text is not hexadecimal");
  std::string bytes(hex.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<char>(digit(hex[2 * i]) * 16 + digit(hex[2 * i + 1]));
  return bytes;
}

using text::ThinkFilter;

std::atomic<bool> g_interrupt{false};

// SIGINT only raises a flag: generation checks it before every token, the prompt clears its line. The handler is
// io's (installed without SA_RESTART: select() returns, so the prompt notices at once).
void on_sigint(int) { g_interrupt = true; }

class LineReader;
LineReader* g_reader = nullptr;  // the reader whose line readline's callback completes

constexpr const char* kDim = "\033[2m";
constexpr const char* kReset = "\033[0m";

// Reads lines with readline's callback interface, so that Ctrl-C at the prompt can drop the current line
// instead of ending the program. nullopt on end of input (Ctrl-D).
class LineReader {
 public:
  explicit LineReader(bool tty) : tty_(tty) {
    if (tty_) {
      rl_catch_signals = 0;
      rl_catch_sigwinch = 1;
      using_history();
    }
  }

  // A line, at most kMaxLineBytes of it: a longer one is read past and comes back as kTooLong.
  std::optional<std::string> read(const std::string& prompt) {
    if (!tty_) return read_piped();
    g_interrupt = false;  // a Ctrl-C that stopped the last reply is spent: it must not cancel this prompt
    done_ = false;
    line_.reset();
    g_reader = this;
    rl_callback_handler_install(prompt.c_str(), [](char* line) {
      rl_callback_handler_remove();
      if (line) {
        g_reader->line_ = line;
        std::free(line);
      }
      g_reader->done_ = true;
    });
    while (!done_) {
      fd_set fds;
      FD_ZERO(&fds);
      FD_SET(STDIN_FILENO, &fds);
      timeval tv{0, 200000};
      const int ready = select(STDIN_FILENO + 1, &fds, nullptr, nullptr, &tv);
      if (g_interrupt.exchange(false)) {
        rl_replace_line("", 0);
        fmt::print("^C\n");
        rl_on_new_line();
        rl_redisplay();
        continue;
      }
      if (ready > 0) rl_callback_read_char();
    }
    if (line_ && !line_->empty()) add_history(line_->c_str());
    if (line_ && line_->size() > kMaxLineBytes) return std::string(kTooLong);
    return line_;
  }

  static constexpr size_t kMaxLineBytes = size_t{16} << 20;
  static constexpr std::string_view kTooLong{"\0too long", 9};  // no message can be this (it holds a NUL)

 private:
  // std::getline would grow without bound on a stream without newlines.
  static std::optional<std::string> read_piped() {
    std::string line;
    bool any = false, too_long = false;
    for (int c; (c = std::cin.get()) != EOF;) {
      any = true;
      if (c == '\n') break;
      if (line.size() < kMaxLineBytes)
        line += static_cast<char>(c);
      else
        too_long = true;
    }
    if (!any) return std::nullopt;
    if (too_long) return std::string(kTooLong);
    return line;
  }

  bool tty_;
  bool done_ = false;
  std::optional<std::string> line_;
};

class Chat {
 public:
  Chat(const ChatOptions& opt)
      : opt_(opt),
        tty_(isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)),
        tty_out_(isatty(STDOUT_FILENO)),
        engine_(open_engine({opt.model, opt.threads, opt.critical, opt.device})),
        model_(&engine_->model()),
        tokenizer_(open_tokenizer(model_->file())),
        template_(pick_template()),
        session_(*model_, opt.ctx_size > 0 ? opt.ctx_size : std::min<int64_t>(4096, model_->config().n_ctx_train)),
        conversation_(session_, *tokenizer_, template_, text::RenderOptions{.enable_thinking = opt.enable_thinking}),
        sampler_(opt.sampling),
        drafter_(engine::make_drafter(engine::parse_draft_source(opt.draft.source), *model_, session_.n_ctx())),
        reader_(tty_) {
    if (drafter_) session_.observe(drafter_->hidden_observer());
    if (!opt.system.empty()) conversation_.set_system(opt.system);
    conversation_.set_cancel(&g_interrupt);
  }

  // 0, or 1 when a message from a pipe was not sent (a script learns that from the exit status).
  int run() {
    io::set_interrupt_hook(on_sigint);
    if (tty_)
      fmt::print(
          "{}hetmoe chat: {} ({}), template {}, context {}. /help for commands, Ctrl-C stops a reply, "
          "Ctrl-D or /exit leaves.{}\n",
          kDim, model_->config().name.empty() ? model_->config().arch_name : model_->config().name,
          model_->config().arch_name, template_.name(), session_.n_ctx(), kReset);
    for (;;) {
      std::optional<std::string> line = read_message();
      if (!line) break;
      if (line->empty()) continue;
      if ((*line)[0] != '/') ++messages_;
      if (*line == LineReader::kTooLong) {
        refuse(fmt::format("a message of more than {} MiB; not sent", LineReader::kMaxLineBytes >> 20));
        continue;
      }
      if ((*line)[0] == '/') {
        if (!command(*line)) break;
        continue;
      }
      turn(*line);
    }
    if (tty_) fmt::print("\n");
    if (!tty_ && (refused_ > 0 || failed_commands_ > 0)) {
      std::string what;
      if (refused_ > 0) what = fmt::format("{} of {} messages failed", refused_, messages_);
      if (failed_commands_ > 0)
        what += fmt::format("{}{} command{} failed", what.empty() ? "" : ", ", failed_commands_,
                            failed_commands_ == 1 ? "" : "s");
      fmt::print(stderr, "hetmoe: error: {} (see the notes above)\n", what);
      return 1;
    }
    return 0;
  }

 private:
  text::ChatTemplate pick_template() {
    if (!opt_.chat_template.empty()) {
      auto t = text::ChatTemplate::by_name(opt_.chat_template, *tokenizer_);
      if (!t)
        fail("unknown chat template '{}' (known: {})", opt_.chat_template,
             fmt::join(text::ChatTemplate::names(), ", "));
      return *t;
    }
    std::string warning;
    text::ChatTemplate t = text::ChatTemplate::detect(model_->file(), *tokenizer_, &warning);
    if (!warning.empty()) fmt::print(stderr, "hetmoe: warning: {}\n", warning);
    return t;
  }

  // One message: a line, or several joined when a line ends with a backslash.
  std::optional<std::string> read_message() {
    std::optional<std::string> line = reader_.read(tty_ ? "> " : "");
    if (!line || !tty_) return line;
    std::string text = *line;
    while (text != LineReader::kTooLong && !text.empty() && text.back() == '\\') {
      text.back() = '\n';
      std::optional<std::string> more = reader_.read(". ");
      if (!more) break;
      if (*more == LineReader::kTooLong || text.size() + more->size() > LineReader::kMaxLineBytes)
        return std::string(LineReader::kTooLong);
      text += *more;
    }
    return text;
  }

  // A message that was not sent: said, counted for the exit status, and nothing else changed.
  void refuse(const std::string& why) {
    ++refused_;
    note(why);
  }

  void note(const std::string& text) const {
    if (tty_) {
      fmt::print("{}{}{}\n", kDim, text, kReset);
    } else {
      fmt::print(stderr, "{}\n", text);
    }
  }

  // Returns false to leave.
  bool command(const std::string& line) {
    const size_t space = line.find(' ');
    const std::string name = line.substr(0, space);
    const std::string arg = space == std::string::npos ? "" : line.substr(space + 1);
    try {
      if (name == "/exit" || name == "/quit") return false;
      if (name == "/help") {
        note(
            "/clear          forget the conversation (the system message stays)\n"
            "/undo           forget your last message and its reply\n"
            "/system TEXT    set the system message (empty TEXT removes it)\n"
            "/save FILE      write the conversation as JSON\n"
            "/load FILE      read a conversation written by /save\n"
            "/stats          context use and speeds\n"
            "/exit           leave (also Ctrl-D)\n"
            "A line ending in \\ continues on the next line. Ctrl-C stops a reply.");
      } else if (name == "/clear") {
        conversation_.clear();
        note("(conversation cleared)");
      } else if (name == "/undo") {
        note(conversation_.undo() ? "(forgot the last message and its reply)" : "(nothing to undo)");
      } else if (name == "/system") {
        conversation_.set_system(arg);
        note(arg.empty() ? "(system message removed)" : "(system message set)");
      } else if (name == "/save") {
        save(arg);
      } else if (name == "/load") {
        load(arg);
      } else if (name == "/stats") {
        const engine::Session::Counters& c = total_;
        note(fmt::format(
            "context {} of {} tokens, {} turns; prefill {} tokens ({:.1f} tok/s), decode {} tokens ({:.1f} tok/s){}",
            session_.n_past(), session_.n_ctx(), conversation_.n_turns(), c.prefill_tokens,
            c.prefill_tokens / std::max(c.prefill_seconds, 1e-9), c.decode_tokens + c.verify_steps + drafts_.accepted,
            engine::decode_rate(c, drafts_), drafter_ ? engine::draft_summary(drafts_) : ""));
      } else {
        note(fmt::format("unknown command {}; /help lists them", name));
      }
    } catch (const std::exception& e) {
      ++failed_commands_;
      note(fmt::format("error: {}", e.what()));
    }
    return true;
  }

  void save(const std::string& path) {
    if (path.empty()) fail("/save needs a file name");
    nlohmann::json j = {{"format", "hetmoe-chat/1"}, {"messages", nlohmann::json::array()}};
    for (const text::ChatMessage& m : conversation_.messages()) {
      nlohmann::json entry = {{"role", m.role}, {"content", m.content}};
      // A reply cut inside a character: JSON holds U+FFFD there, content_hex the bytes the cache stands for.
      if (text::find_invalid_utf8(m.content)) entry["content_hex"] = to_hex(m.content);
      j["messages"].push_back(std::move(entry));
    }
    // The cache's tokens with the text they stand for: /load evaluates these ids, so the chat goes on as it would
    // have. Tied to the model's vocabulary by its size and the file's name (a load on another model uses the text).
    const engine::Conversation::CacheRecord r = conversation_.cache_record();
    j["cache"] = {{"model", fs::path(model_->file().path()).filename().string()},
                  {"n_vocab", model_->config().n_vocab},
                  {"tokens", r.tokens},
                  {"segment_tokens", r.segment_tokens},
                  {"segment_ends", r.segment_ends},
                  {"text_hex", to_hex(r.text)}};  // the bytes exactly: a reply may end inside a character
    // A reply cut inside a character is not valid UTF-8; JSON gets U+FFFD there.
    io::write_file(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    note(fmt::format("(saved {} messages to {})", conversation_.messages().size(), path));
  }

  void load(const std::string& path) {
    if (path.empty()) fail("/load needs a file name");
    const std::string saved = io::read_file(path, io::kMaxChatBytes, "a saved conversation");
    std::vector<text::ChatMessage> messages;
    std::optional<engine::Conversation::CacheRecord> record;
    try {
      const nlohmann::json j = nlohmann::json::parse(saved);
      for (const nlohmann::json& m : j.at("messages")) {
        const std::string role = m.at("role").get<std::string>();
        if (role != "system" && role != "user" && role != "assistant") fail("{}: unknown role '{}'", path, role);
        const auto hex = m.find("content_hex");
        messages.push_back(
            {role, hex != m.end() ? from_hex(hex->get<std::string>()) : m.at("content").get<std::string>()});
      }
      // The saved tokens, when they were this model's (same file name and vocabulary size).
      if (const auto c = j.find("cache"); c != j.end() &&
                                          c->at("model") == fs::path(model_->file().path()).filename().string() &&
                                          c->at("n_vocab") == model_->config().n_vocab)
        record =
            engine::Conversation::CacheRecord{.tokens = c->at("tokens").get<std::vector<int32_t>>(),
                                              .segment_tokens = c->at("segment_tokens").get<std::vector<int64_t>>(),
                                              .segment_ends = c->at("segment_ends").get<std::vector<size_t>>(),
                                              .text = from_hex(c->at("text_hex").get<std::string>())};
    } catch (const nlohmann::json::exception& e) {
      fail("{} is not a conversation saved by /save ({})", path, e.what());
    }
    if (record) {
      conversation_.restore(std::move(messages), *record);
      note(fmt::format("(loaded {} messages and their {} cached tokens from {})", conversation_.messages().size(),
                       record->tokens.size(), path));
    } else {
      conversation_.set_messages(std::move(messages));
      note(fmt::format("(loaded {} messages from {})", conversation_.messages().size(), path));
    }
  }

  // Makes room for `text`: asks on a terminal, drops the oldest turns otherwise. False: the message is not sent and
  // the conversation is as it was.
  bool make_room(const std::string& text) {
    if (conversation_.fit_margin(text) >= 0) return true;
    if (conversation_.fit_margin(text, 0) < 0) {
      refuse(fmt::format("this message does not fit the context of {} tokens even alone; not sent", session_.n_ctx()));
      return false;
    }
    // The most recent turns that can stay with it.
    const int64_t turns = conversation_.n_turns();
    int64_t most = turns - 1;
    while (most > 0 && conversation_.fit_margin(text, most) < 0) --most;
    if (tty_) {
      note(fmt::format("the context is full ({} tokens): this message fits with at most the last {} of {} turns.",
                       session_.n_ctx(), most, turns));
      for (;;) {
        std::optional<std::string> answer =
            reader_.read(fmt::format("[c]lear, keep the last [N] of {} turns, or [s]kip this message? ", turns));
        if (!answer || answer->empty() || (*answer)[0] == 's') {
          refuse("(not sent)");
          return false;
        }
        if ((*answer)[0] == 'c') {
          conversation_.clear();
          return true;
        }
        char* end = nullptr;
        const long n = std::strtol(answer->c_str(), &end, 10);
        if (end != answer->c_str() && n >= 0 && n <= most) {
          conversation_.keep_last_turns(n);
          return true;
        }
        note(fmt::format("answer c, s or a number of turns from 0 to {}", most));
      }
    }
    conversation_.keep_last_turns(most);
    note(fmt::format("(context full: dropped the oldest {} of {} turns)", turns - most, turns));
    return true;
  }

  void turn(const std::string& text) {
    if (const auto bad = text::find_invalid_utf8(text)) {
      refuse(fmt::format("the message is not valid UTF-8 (byte {}); not sent", *bad));
      return;
    }
    g_interrupt = false;  // a Ctrl-C from here on stops this turn, even one pressed during the prefill
    try {
      if (!make_room(text)) return;
      session_.reset_counters();
      conversation_.add_user(text);
    } catch (const Cancelled&) {
      note("(stopped)");
      return;
    } catch (const std::exception& e) {
      refuse(fmt::format("error: {}; not sent", e.what()));
      return;
    }
    const bool think_open = rendered_ends_inside_think();
    ThinkFilter filter(
        opt_.hide_think ? ThinkFilter::Mode::kHide : (tty_ ? ThinkFilter::Mode::kDim : ThinkFilter::Mode::kPlain),
        template_.think_open(), template_.think_close(), think_open);
    // What is shown hides control tokens; what is recorded keeps them, so that the template renders the reply
    // exactly as the cache holds it and the next turn reuses all of it.
    text::StreamDecoder decoder(*tokenizer_);
    text::StreamDecoder recorder(*tokenizer_, /*render_special=*/true);
    // What goes to a terminal is made safe: no control byte of the model's drives it. A pipe gets the bytes as they
    // are.
    text::TerminalSafe safe;
    auto shown = [&](const std::string& piece) { return tty_out_ ? safe.push(piece) : piece; };
    // A reply that starts inside the prompt's think block holds its opening as the prompt wrote it ("<think>\n" for
    // DeepSeek-R1 and Qwen3.5, "<think>" for DeepSeek-V4), so that the next turn renders it as the cache holds it.
    const std::string& rendered = conversation_.rendered();
    std::string reply = think_open ? rendered.substr(rendered.rfind(template_.think_open())) : "";
    const int64_t before = session_.n_past();
    engine::GenerateOptions gen{.max_tokens = opt_.max_tokens,
                                .interrupt = &g_interrupt,
                                .drafter = drafter_.get(),
                                .draft_max = opt_.draft.max};
    engine::GenerateResult result;
    std::vector<int32_t> generated;  // what the callback saw: the result is lost when generation throws
    try {
      result = engine::generate(session_, last_logits(), sampler_, tokenizer_.get(), gen, [&](int32_t token) {
        generated.push_back(token);
        if (tokenizer_->is_end_of_generation(token)) return true;
        reply += recorder.push(token);
        fmt::print("{}", filter.push(shown(decoder.push(token))));
        std::fflush(stdout);
        return true;
      });
    } catch (const std::exception& e) {
      refuse(fmt::format("error: {}; the reply stops here", e.what()));
    }
    reply += recorder.flush();
    // In order (the operands of + and a call's arguments are evaluated in no fixed order).
    std::string tail = shown(decoder.flush());
    if (tty_out_) tail += safe.flush();
    tail = filter.push(tail);
    tail += filter.flush();
    fmt::print("{}\n", tail);
    std::fflush(stdout);
    const int64_t evaluated = std::min<int64_t>(session_.n_past() - before, static_cast<int64_t>(generated.size()));
    for (int64_t i = 0; i < evaluated; ++i) conversation_.on_generated(generated[static_cast<size_t>(i)]);
    conversation_.add_assistant(reply);

    if (result.stop == engine::StopReason::kInterrupted) note("(stopped)");
    if (result.stop == engine::StopReason::kContextFull) note("(the context is full: the reply was cut)");
    const engine::Session::Counters& c = session_.counters();
    total_.prefill_tokens += c.prefill_tokens;
    total_.prefill_seconds += c.prefill_seconds;
    total_.decode_tokens += c.decode_tokens;
    total_.decode_seconds += c.decode_seconds;
    total_.verify_steps += c.verify_steps;
    total_.verify_tokens += c.verify_tokens;
    total_.verify_seconds += c.verify_seconds;
    drafts_.steps += result.steps;
    drafts_.drafted += result.drafted;
    drafts_.accepted += result.accepted;
    drafts_.draft_seconds += result.draft_seconds;
    note(fmt::format("[prompt {} tokens, {:.1f} tok/s | reply {} tokens, {:.1f} tok/s{} | context {}/{}]",
                     c.prefill_tokens, c.prefill_tokens / std::max(c.prefill_seconds, 1e-9), generated.size(),
                     engine::decode_rate(c, result), drafter_ ? engine::draft_summary(result) : "", session_.n_past(),
                     session_.n_ctx()));
  }

  // The logits after the last prefill: re-evaluating is avoided by keeping them in the session's model call.
  std::span<const float> last_logits() { return session_.last_logits(); }

  bool rendered_ends_inside_think() const {
    const std::string& text = conversation_.rendered();
    const size_t open = text.rfind(template_.think_open());
    return open != std::string::npos && text.find(template_.think_close(), open) == std::string::npos &&
           text.find_first_not_of(" \n", open + template_.think_open().size()) == std::string::npos;
  }

  ChatOptions opt_;
  bool tty_;
  bool tty_out_;  // replies go to a terminal (stdin may still be a pipe)
  std::unique_ptr<engine::Engine> engine_;
  model::Model* model_;
  std::unique_ptr<text::Tokenizer> tokenizer_;
  text::ChatTemplate template_;
  engine::Session session_;
  engine::Conversation conversation_;
  engine::Sampler sampler_;
  std::unique_ptr<engine::Drafter> drafter_;  // null without --draft
  LineReader reader_;
  engine::Session::Counters total_;
  engine::GenerateResult drafts_;       // the replies' steps and drafts, added up (its tokens unused)
  int64_t messages_ = 0, refused_ = 0;  // messages read (commands are not), and those not sent or not answered
  int64_t failed_commands_ = 0;
};

}  // namespace

int chat(const ChatOptions& opt) {
  Chat chat(opt);
  return chat.run();
}

}  // namespace hetmoe::cli
