// `hetmoe chat` driven like a user would: through a pipe (one message per line, replies only on stdout) and
// through a pseudo-terminal (line editing, Ctrl-C, commands). The tiny model's replies are random text; the tests
// check the mechanics: turns, KV reuse, interruption, /clear, /save and /load, context overflow, bad input.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/small_fs.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;

const std::string kModel = (fs::path(HETMOE_TEST_DATA_DIR) / "models" / "tiny-deepseek3-Q4_K_M.gguf").string();

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Piped {
  int status = -1;
  std::string out, err;
};

// Runs `hetmoe chat ARGS` with `input` on stdin through a pipe, on `model` (the tiny DeepSeek-V3 by default).
Piped chat_piped(const std::string& args, const std::string& input, const std::string& model = kModel) {
  const fs::path dir = fs::temp_directory_path() / ("hetmoe_chat_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in", std::ios::binary) << input;
  const std::string cmd = std::string(HETMOE_BIN) + " chat -m " + model + " -t 1 " + args + " <" +
                          (dir / "in").string() + " >" + (dir / "out").string() + " 2>" + (dir / "err").string();
  const int raw = std::system(cmd.c_str());
  Piped r{WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw), read_file(dir / "out"), read_file(dir / "err")};
  fs::remove_all(dir);
  return r;
}

// The prompt-token counts of the stats lines ("[prompt N tokens, ...").
std::vector<int> prompt_counts(const std::string& err) {
  std::vector<int> counts;
  const std::regex re(R"(\[prompt (\d+) tokens)");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it) counts.push_back(std::stoi((*it)[1]));
  return counts;
}

const std::string kLong =
    "Tell me everything you know about mixtures of experts, routers, shared experts, and how a runtime decides "
    "which experts run on the CPU and which on the GPU, in detail please.";

TEST(ChatPiped, RepliesOnlyOnStdoutAndReusesTheCache) {
  // Long sampled replies: control tokens inside them must not break the reuse.
  const Piped r = chat_piped("--chat-template deepseek3 --temp 1 --seed 5 -n 300", kLong + "\nhi\n");
  ASSERT_EQ(r.status, 0) << r.err;
  // Each reply ends with a newline; the tiny model's random text may hold newlines of its own.
  EXPECT_GE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  EXPECT_EQ(r.out.find("[prompt"), std::string::npos) << "statistics belong on stderr:\n" << r.out;
  EXPECT_EQ(r.out.find("> "), std::string::npos) << "no prompt without a terminal:\n" << r.out;
  const std::vector<int> prompts = prompt_counts(r.err);
  ASSERT_EQ(prompts.size(), 2u) << r.err;
  // The second turn evaluates only its own text (and the end of the first reply), not the first turn again.
  EXPECT_LT(prompts[1], prompts[0] / 2) << r.err;
}

// Greedy replies with n-gram drafts are the plain replies, turn after turn (the cache keeps what each reply kept).
// On an F32 file (make-model's tiny DeepSeek-V3): its verification batches differ from one row only in summation
// order, so no rounding event parts the replies (the quantized files' tile kernels can flip a near-tie; the engine's
// tests hold those to the batching rules).
TEST(ChatPiped, DraftsLeaveTheRepliesAsTheyAre) {
  const fs::path model = fs::temp_directory_path() / ("hetmoe_chat_f32_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_EQ(std::system((std::string(HETMOE_BIN) + " make-model --preset tiny-deepseek-v3 --type F32 -o " +
                         model.string() + " >/dev/null 2>&1")
                            .c_str()),
            0);
  const std::string input = "say it again and again and again\nand once more, again and again\n";
  const Piped plain = chat_piped("--chat-template deepseek3 --temp 0 -n 60", input, model.string());
  const Piped drafted =
      chat_piped("--chat-template deepseek3 --temp 0 -n 60 --draft ngram --draft-max 6", input, model.string());
  fs::remove(model);
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(drafted.status, 0) << drafted.err;
  EXPECT_EQ(drafted.out, plain.out);
  EXPECT_NE(drafted.err.find("accepted"), std::string::npos) << drafted.err;
  EXPECT_EQ(prompt_counts(drafted.err), prompt_counts(plain.err)) << drafted.err;
}

TEST(ChatPiped, ClearStartsOverAndCommandsWork) {
  const Piped r =
      chat_piped("--chat-template deepseek3 --temp 0 -n 4", kLong + "\n/clear\n" + kLong + "\n/stats\n/bogus\n");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<int> prompts = prompt_counts(r.err);
  ASSERT_EQ(prompts.size(), 2u) << r.err;
  EXPECT_EQ(prompts[1], prompts[0]) << "after /clear the same message costs a full prefill again";
  EXPECT_NE(r.err.find("(conversation cleared)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("context "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("unknown command /bogus"), std::string::npos) << r.err;
}

TEST(ChatPiped, SaveAndLoadKeepTheConversation) {
  const fs::path file = fs::temp_directory_path() / ("hetmoe_chat_save_" + std::to_string(::getpid()) + ".json");
  const Piped r =
      chat_piped("--chat-template deepseek3 --temp 0 -n 4 --system 'be brief'",
                 "first question\n/save " + file.string() + "\n/clear\n/load " + file.string() + "\nagain\n");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string saved = read_file(file);
  fs::remove(file);
  EXPECT_NE(saved.find("\"first question\""), std::string::npos) << saved;
  EXPECT_NE(saved.find("\"be brief\""), std::string::npos) << saved;
  EXPECT_NE(r.err.find("(loaded 3 messages and their "), std::string::npos) << r.err;
  // /load evaluates the saved tokens itself: the next turn evaluates only its own part, as it would have without
  // the /clear.
  const std::vector<int> prompts = prompt_counts(r.err);
  ASSERT_EQ(prompts.size(), 2u) << r.err;
  EXPECT_LT(prompts[1], prompts[0]) << r.err;
}

// Going back to an earlier turn (/undo) continues exactly as a run without the undone turn, and /save then /load as
// the uninterrupted run: greedy replies equal to the byte. On an attention model (the cache keeps the common prefix),
// on Qwen3.5's hybrid, whose recurrent state goes back through a checkpoint and evaluates the kept tokens again, and
// on DeepSeek-V4, whose window ring and compressor rows do the same (its template opens a think block).
TEST(ChatPiped, UndoSaveAndLoadContinueAsTheUninterruptedRun) {
  const fs::path data = fs::path(HETMOE_TEST_DATA_DIR) / "models";
  for (const auto& [model, args] : {std::pair<fs::path, std::string>{data / "tiny-deepseek3-Q4_K_M.gguf",
                                                                     "--chat-template deepseek3 --temp 0 -n 6"},
                                    {data / "tiny-qwen35moe-Q4_K_M.gguf", "--temp 0 -n 6"},
                                    {data / "tiny-deepseek4-Q4_K_M.gguf", "--temp 0 -n 6"}}) {
    SCOPED_TRACE(model.filename().string());
    // clang 14 (the sanitizer build's compiler) captures no structured binding.
    auto run = [&, &model = model, &args = args](const std::string& input) {
      const Piped r = chat_piped(args, input, model.string());
      EXPECT_EQ(r.status, 0) << r.err;
      return r.out;
    };
    const std::string first = run("first question\n");
    const std::string all = run("first question\nsecond one\nand a third\n");
    ASSERT_TRUE(all.starts_with(first)) << all;
    const std::string rest = all.substr(first.size());  // the replies to the second and third questions
    // A detour, undone: the second and third replies are those of the run without it.
    const std::string detour = run("first question\nsomething else entirely\n");
    EXPECT_EQ(run("first question\nsomething else entirely\n/undo\nsecond one\nand a third\n"), detour + rest);
    // Saved after two turns, loaded into a new chat: its cached tokens come back (not the replies' text tokenized
    // again), and the third reply is the uninterrupted run's.
    const fs::path file = fs::temp_directory_path() / ("hetmoe_chat_undo_" + std::to_string(::getpid()) + ".json");
    const std::string two = run("first question\nsecond one\n/save " + file.string() + "\n");
    ASSERT_TRUE(all.starts_with(two)) << two;
    EXPECT_EQ(run("/load " + file.string() + "\nand a third\n"), all.substr(two.size()));
    fs::remove(file);
  }
}

// The context positions in use after each turn ("| context N/C]").
std::vector<int> context_used(const std::string& err) {
  std::vector<int> used;
  const std::regex re(R"(\| context (\d+)/)");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it) used.push_back(std::stoi((*it)[1]));
  return used;
}

TEST(ChatPiped, ContextOverflowDropsOldTurnsAndKeepsRunning) {
  const Piped r = chat_piped("--chat-template deepseek3 --temp 0 -n 8 -c 400",
                             kLong + "\n" + kLong + "\n" + kLong + "\n" + std::string(2000, 'x') + "\nshort\n");
  // The message too long even alone is refused: the exit status says so, and it changed nothing.
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("does not fit the context"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hetmoe: error: 1 of 5 messages failed"), std::string::npos) << r.err;
  // Only one message (the one after the refused one) dropped a turn, and the note says so once.
  const std::regex dropped(R"(\(context full: dropped the oldest (\d+) of (\d+) turns\))");
  EXPECT_EQ(std::distance(std::sregex_iterator(r.err.begin(), r.err.end(), dropped), std::sregex_iterator()), 1)
      << r.err;
  EXPECT_EQ(prompt_counts(r.err).size(), 4u) << "four of the five messages were answered:\n" << r.err;
  // "short" went on from the turns that fit beside it (the refused message dropped none of them): more context in
  // use than one long turn takes.
  const std::vector<int> used = context_used(r.err);
  ASSERT_EQ(used.size(), 4u) << r.err;
  EXPECT_GT(used[3], used[0]) << r.err;
}

TEST(ChatPiped, InvalidUtf8IsRefusedNotFatal) {
  const Piped r = chat_piped("--chat-template deepseek3 --temp 0 -n 4", "bad \xff\xfe bytes\nfine\n");
  EXPECT_EQ(r.status, 1) << r.err;  // a script learns that a message was not sent
  EXPECT_NE(r.err.find("not valid UTF-8"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hetmoe: error: 1 of 2 messages failed"), std::string::npos) << r.err;
  EXPECT_EQ(prompt_counts(r.err).size(), 1u) << r.err;
}

TEST(ChatPiped, AConversationTheTemplateCannotRenderIsReportedAndTheChatGoesOn) {
  // Mistral's format needs user and assistant turns to alternate; a loaded file with two user turns in a row
  // cannot be rendered. The message says so, and /clear gets the chat going again.
  const fs::path file = fs::temp_directory_path() / ("hetmoe_chat_bad_" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})";
  const Piped r = chat_piped("--chat-template mistral --temp 0 -n 2", "/load " + file.string() + "\nhi\n/clear\nhi\n");
  fs::remove(file);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_EQ(prompt_counts(r.err).size(), 1u) << "only the message after /clear is answered:\n" << r.err;
}

// A "message" of more than 16 MiB without a newline is read past and refused; the chat goes on.
TEST(ChatPiped, AnEndlessLineIsRefused) {
  const Piped r = chat_piped("--temp 0 -n 2", std::string((16 << 20) + 100, 'z') + "\nhi\n");
  EXPECT_EQ(r.status, 1) << r.err.substr(0, 500);
  EXPECT_NE(r.err.find("a message of more than 16 MiB; not sent"), std::string::npos) << r.err.substr(0, 500);
  EXPECT_EQ(prompt_counts(r.err).size(), 1u) << r.err.substr(0, 500);
}

// /save on a full disk says so and leaves the conversation saved before as it was.
TEST(ChatPiped, SaveOnAFullDiskKeepsTheOldFile) {
  const fs::path dir = fs::temp_directory_path() / ("hetmoe_chat_full_" + std::to_string(::getpid()));
  struct Cleanup {
    fs::path dir;
    ~Cleanup() { fs::remove_all(dir); }  // after the file system is unmounted (declared first, destroyed last)
  } cleanup{dir};
  test_support::SmallFs small(dir, 64);
  if (!small.mounted()) GTEST_SKIP() << small.error();
  const fs::path saved = dir / "chat.json";
  std::ofstream(saved) << "{\"format\": \"hetmoe-chat/1\", \"messages\": []}";
  {
    std::ofstream filler(dir / "filler");
    filler << std::string(1 << 20, 'f');  // more than the file system holds: it fills to the last byte
  }
  const std::string before = read_file(saved);
  const Piped r = chat_piped("--temp 0 -n 4", "a question\n/save " + saved.string() + "\n");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("cannot write " + saved.string() + ": No space left"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hetmoe: error: 1 command failed"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(saved), before);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(ChatPiped, UnknownTemplateAndMissingTemplate) {
  const Piped bad = chat_piped("--chat-template nope", "hi\n");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("unknown chat template 'nope'"), std::string::npos) << bad.err;
  const Piped fallback = chat_piped("--temp 0 -n 2", "hi\n");  // the tiny file has no chat template
  EXPECT_EQ(fallback.status, 0) << fallback.err;
  EXPECT_NE(fallback.err.find("warning"), std::string::npos) << fallback.err;
}

// A child on a pseudo-terminal, read with timeouts.
class Pty {
 public:
  explicit Pty(const std::vector<std::string>& args) {
    winsize ws{24, 120, 0, 0};
    pid_ = forkpty(&fd_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Pty() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  void send(const std::string& s) { ASSERT_EQ(write(fd_, s.data(), s.size()), static_cast<ssize_t>(s.size())); }
  // Reads until `pattern` appears in the output after `from`, or the timeout; returns whether it appeared.
  bool expect(const std::string& pattern, double seconds = 20) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (out_.find(pattern, from_) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char buf[4096];
        const ssize_t n = read(fd_, buf, sizeof buf);
        if (n <= 0) return out_.find(pattern, from_) != std::string::npos;
        out_.append(buf, static_cast<size_t>(n));
      }
    }
    from_ = out_.find(pattern, from_) + pattern.size();
    return true;
  }
  int wait_exit(double seconds = 20) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      char buf[4096];
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) > 0 && read(fd_, buf, sizeof buf) > 0) continue;
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    return -1;
  }
  const std::string& output() const { return out_; }
  // Where the last expect() matched: just past its pattern.
  size_t position() const { return from_; }

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
  std::string out_;
  size_t from_ = 0;
};

TEST(ChatTerminal, TurnsCtrlCClearAndExit) {
  // Replies of at most 64 tokens keep the test quick under sanitizers; Ctrl-C is sent during the second turn's long
  // prefill, so it does not depend on how long the model would talk.
  Pty pty({HETMOE_BIN, "chat", "-m", kModel, "-t", "1", "--chat-template", "deepseek3", "--temp", "0.9", "--seed", "3",
           "-c", "4096", "-n", "64"});
  ASSERT_TRUE(pty.expect("> ")) << pty.output();
  pty.send("hello there\r");
  ASSERT_TRUE(pty.expect("[prompt ")) << pty.output();
  ASSERT_TRUE(pty.expect("> ")) << pty.output();
  // A long message takes seconds to prefill; Ctrl-C pressed meanwhile stops the turn before the reply starts.
  std::string story;
  for (int i = 0; i < 20; ++i) story += kLong + " ";  // about 2,500 tokens: seconds of prefill on one thread
  pty.send(story + "\r");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  pty.send("\x03");  // Ctrl-C: stops the reply, not the program
  ASSERT_TRUE(pty.expect("(stopped)")) << pty.output();
  const size_t stopped = pty.position();
  ASSERT_TRUE(pty.expect("> ")) << pty.output();
  // One prompt, and no ghost of it: the Ctrl-C that stopped the reply is not taken again by the prompt.
  pty.expect("never printed", 0.6);
  const std::string after = pty.output().substr(stopped);
  EXPECT_EQ(after.find("^C"), std::string::npos) << after;
  EXPECT_EQ(after.find("> "), after.rfind("> ")) << after;
  pty.send("abc\x03");  // Ctrl-C at the prompt drops the line
  ASSERT_TRUE(pty.expect("^C")) << pty.output();
  pty.send("/clear\r");
  ASSERT_TRUE(pty.expect("(conversation cleared)")) << pty.output();
  pty.send("/exit\r");
  EXPECT_EQ(pty.wait_exit(), 0) << pty.output();
}

// The tiny model's random replies are full of control bytes and broken UTF-8: on a terminal none of it gets through.
TEST(ChatTerminal, RepliesAreTerminalSafe) {
  Pty pty({HETMOE_BIN, "chat", "-m", kModel, "-t", "1", "--temp", "1.5", "--seed", "7", "-n", "400"});
  ASSERT_TRUE(pty.expect("> ")) << pty.output();
  // Turns until the replies shown hold 400 bytes (a sampled end of generation can end one early).
  std::string shown;
  for (int turn = 0; turn < 8 && shown.size() <= 400; ++turn) {
    const size_t from = pty.position();
    pty.send("hello\r");
    ASSERT_TRUE(pty.expect("[prompt ")) << pty.output();
    std::string part = pty.output().substr(from);
    // What is not the model's: hetmoe's dimming, readline's bracketed-paste mode, the terminal's CR before each LF.
    for (const std::string own : {"\x1b[2m", "\x1b[0m", "\x1b[?2004h", "\x1b[?2004l", "\r"})
      for (size_t at; (at = part.find(own)) != std::string::npos;) part.erase(at, own.size());
    shown += part;
    ASSERT_TRUE(pty.expect("> ")) << pty.output();
  }
  ASSERT_GT(shown.size(), 400u) << shown;
  for (const char c : shown) {
    const auto b = static_cast<unsigned char>(c);
    EXPECT_FALSE((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f) << "byte " << int(b) << " in: " << shown;
  }
  EXPECT_NE(shown.find("\\x"), std::string::npos) << "no control byte shown escaped:\n" << shown;
  for (size_t i = 0; i < shown.size();) {  // valid UTF-8 throughout (U+FFFD where the model wrote none)
    const auto b = static_cast<unsigned char>(shown[i]);
    const size_t n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 ? 2 : 0;
    ASSERT_GT(n, 0u) << "invalid lead byte at " << i;
    ASSERT_LE(i + n, shown.size());
    for (size_t k = 1; k < n; ++k) ASSERT_EQ(static_cast<unsigned char>(shown[i + k]) & 0xC0, 0x80) << i;
    i += n;
  }
  pty.send("/exit\r");
  EXPECT_EQ(pty.wait_exit(), 0) << pty.output();
}

TEST(ChatTerminal, FullContextOffersClearOrKeep) {
  Pty pty({HETMOE_BIN, "chat", "-m", kModel, "-t", "1", "--chat-template", "deepseek3", "--temp", "0", "-n", "4", "-c",
           "300"});
  ASSERT_TRUE(pty.expect("> ")) << pty.output();
  for (int i = 0; i < 2; ++i) {
    pty.send(kLong + "\r");
    ASSERT_TRUE(pty.expect("[prompt ")) << pty.output();
    ASSERT_TRUE(pty.expect("> ")) << pty.output();
  }
  pty.send(kLong + "\r");  // does not fit beside the first two turns
  ASSERT_TRUE(pty.expect("keep the last [N] of 2 turns")) << pty.output();
  pty.send("1\r");
  ASSERT_TRUE(pty.expect("[prompt ")) << pty.output();
  ASSERT_TRUE(pty.expect("> ")) << pty.output();
  pty.send(std::string(3000, 'y') + "\r");  // too long even alone: refused at once, nothing changes
  ASSERT_TRUE(pty.expect("does not fit the context")) << pty.output();
  ASSERT_TRUE(pty.expect("> ")) << pty.output();
  pty.send("/stats\r");
  ASSERT_TRUE(pty.expect(", 2 turns")) << pty.output();
  pty.send("/exit\r");
  EXPECT_EQ(pty.wait_exit(), 0) << pty.output();
}

}  // namespace
}  // namespace hetmoe
