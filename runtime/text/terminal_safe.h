#pragma once

#include <string>
#include <string_view>

namespace hetmoe::text {

// Makes a model's output safe to print on a terminal, streaming: what a model writes must not ring the bell, move
// the cursor, retitle the window or start an escape sequence. Newline and tab pass; every other C0 control, DEL
// and the C1 controls (U+0080..U+009F, which some terminals read as ESC [) are shown escaped ("\x1b", "\u009b"), so
// an escape sequence prints as its text; a CR passes only as part of CR LF (alone it could overwrite the line);
// bytes that are not UTF-8 become U+FFFD, one per broken sequence. A character split across two pushes is held back
// until it is complete (flush ends it).
class TerminalSafe {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;  // an incomplete UTF-8 sequence at the end of the last push
};

}  // namespace hetmoe::text
