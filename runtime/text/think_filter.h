#pragma once

#include <string>
#include <string_view>

namespace hetmoe::text {

// How many bytes at the end of `text` could be the start of `marker` (the longest such end shorter than the marker):
// what a filter of streamed text holds back until the next piece decides.
size_t marker_start_at_end(std::string_view text, std::string_view marker);

// Shows a reasoning model's <think>...</think> block dimmed, plainly or not at all, on streamed text whose
// markers may arrive split across tokens: a possible start of a marker is held back until it is decided.
class ThinkFilter {
 public:
  enum class Mode { kDim, kPlain, kHide };
  ThinkFilter(Mode mode, std::string_view open, std::string_view close, bool start_inside)
      : mode_(mode), open_(open), close_(close), inside_(start_inside) {}

  std::string push(std::string_view text);
  std::string flush();
  bool inside() const { return inside_; }

 private:
  std::string emit(std::string_view text) const;

  Mode mode_;
  std::string open_, close_;
  bool inside_;
  std::string pending_;
};

}  // namespace hetmoe::text
