#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/text/think_filter.h"

namespace hetmoe::text {
namespace {

// Feeds the text in chunks of every size from 1 to its length: markers split anywhere must still be found.
std::string run(ThinkFilter::Mode mode, bool start_inside, const std::string& text, size_t chunk) {
  ThinkFilter f(mode, "<think>", "</think>", start_inside);
  std::string out;
  for (size_t i = 0; i < text.size(); i += chunk) out += f.push(text.substr(i, chunk));
  return out + f.flush();
}

TEST(ThinkFilter, HidesDimsOrKeepsTheBlockWhereverTheMarkersSplit) {
  const std::string text = "<think>\nweigh it</think>The answer is <thin not a tag.";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    EXPECT_EQ(run(ThinkFilter::Mode::kHide, false, text, chunk), "The answer is <thin not a tag.") << chunk;
    EXPECT_EQ(run(ThinkFilter::Mode::kPlain, false, text, chunk), text) << chunk;
    const std::string dim = run(ThinkFilter::Mode::kDim, false, text, chunk);
    EXPECT_NE(dim.find("\033[2m"), std::string::npos);
    EXPECT_EQ(dim.substr(dim.rfind("\033[0m") + 4), "The answer is <thin not a tag.") << chunk;
  }
}

TEST(ThinkFilter, StartsInsideWhenThePromptOpenedTheBlock) {
  // DeepSeek-R1's generation prompt ends with "<think>\n": the reply starts inside the block.
  EXPECT_EQ(run(ThinkFilter::Mode::kHide, true, "hmm\n</think>\n\nHello", 3), "\n\nHello");
  EXPECT_EQ(run(ThinkFilter::Mode::kHide, false, "no thinking at all", 4), "no thinking at all");
}

}  // namespace
}  // namespace hetmoe::text
