#include "runtime/text/think_filter.h"

#include <algorithm>

namespace hetmoe::text {

std::string ThinkFilter::emit(std::string_view text) const {
  if (text.empty() || !inside_) return std::string(text);
  switch (mode_) {
    case Mode::kHide:
      return "";
    case Mode::kPlain:
      return std::string(text);
    case Mode::kDim:
      return "\033[2m" + std::string(text) + "\033[0m";
  }
  return std::string(text);
}

std::string ThinkFilter::push(std::string_view text) {
  pending_ += text;
  std::string out;
  for (;;) {
    const std::string& marker = inside_ ? close_ : open_;
    const size_t pos = pending_.find(marker);
    if (pos != std::string::npos) {
      out += emit(std::string_view(pending_).substr(0, pos));
      // The markers themselves are shown with the block (dimmed) unless it is hidden.
      const bool was_inside = inside_;
      inside_ = true;
      if (mode_ != Mode::kHide) out += emit(marker);
      inside_ = !was_inside;
      pending_.erase(0, pos + marker.size());
      continue;
    }
    // Hold back the longest tail that could still become the marker.
    const size_t hold = marker_start_at_end(pending_, marker);
    out += emit(std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
    return out;
  }
}

size_t marker_start_at_end(std::string_view text, std::string_view marker) {
  if (marker.empty()) return 0;
  size_t hold = std::min(marker.size() - 1, text.size());
  while (hold > 0 && marker.compare(0, hold, text, text.size() - hold, hold) != 0) --hold;
  return hold;
}

std::string ThinkFilter::flush() {
  std::string out = emit(pending_);
  pending_.clear();
  return out;
}

}  // namespace hetmoe::text
