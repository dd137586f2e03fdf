// TerminalSafe: what a model writes cannot drive the terminal; text passes unchanged.
#include <gtest/gtest.h>

#include <string>

#include "runtime/text/terminal_safe.h"

namespace hetmoe::text {
namespace {

std::string safe(const std::string& bytes) {
  TerminalSafe t;
  std::string out = t.push(bytes);
  return out + t.flush();
}

TEST(TerminalSafe, TextNewlinesTabsAndUnicodePass) {
  const std::string text = "Hello,\tworld!\nÜber 東京 🙂 ~";
  EXPECT_EQ(safe(text), text);
}

TEST(TerminalSafe, ControlsAndEscapeSequencesAreShownEscaped) {
  EXPECT_EQ(safe("bell\a form\f cr\r del\x7f nul" + std::string(1, '\0')),
            "bell\\x07 form\\x0c cr\\x0d del\\x7f nul\\x00");
  EXPECT_EQ(safe("\x1b[2J\x1b]0;title\a"), "\\x1b[2J\\x1b]0;title\\x07");
  EXPECT_EQ(safe("c1 \xC2\x9B"
                 "31m"),
            "c1 \\u009b31m");  // U+009B is CSI on some terminals
}

TEST(TerminalSafe, InvalidUtf8BecomesReplacementCharacters) {
  EXPECT_EQ(safe("a\x80\x80"
                 "b"),
            "a\xEF\xBF\xBD"
            "b");  // lone continuation bytes: one U+FFFD
  EXPECT_EQ(safe("a\xE2\x82"
                 "b"),
            "a\xEF\xBF\xBD"
            "b");                                   // a sequence cut short
  EXPECT_EQ(safe("\xC0\xAF"), "\xEF\xBF\xBD");      // overlong
  EXPECT_EQ(safe("\xED\xA0\x80"), "\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(safe("\xFF"), "\xEF\xBF\xBD");
  EXPECT_EQ(safe("end\xE6\x9D"), "end\xEF\xBF\xBD");  // incomplete at the end: flush
}

TEST(TerminalSafe, OnlyALineEndingCarriageReturnPasses) {
  EXPECT_EQ(safe("dos\r\nline"), "dos\r\nline");
  EXPECT_EQ(safe("over\rwrite"), "over\\x0dwrite");
  EXPECT_EQ(safe("end\r"), "end\\x0d");
  TerminalSafe t;
  EXPECT_EQ(t.push("split\r"), "split");  // the CR waits for the next byte
  EXPECT_EQ(t.push("\nnext"), "\r\nnext");
}

TEST(TerminalSafe, ACharacterSplitAcrossPushesIsHeldBack) {
  TerminalSafe t;
  const std::string tokyo = "東";  // E6 9D B1
  EXPECT_EQ(t.push(tokyo.substr(0, 1)), "");
  EXPECT_EQ(t.push(tokyo.substr(1, 1)), "");
  EXPECT_EQ(t.push(tokyo.substr(2) + "!"), tokyo + "!");
  EXPECT_EQ(t.flush(), "");
}

}  // namespace
}  // namespace hetmoe::text
