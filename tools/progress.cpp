#include "tools/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

namespace hetmoe {
namespace {

std::string duration(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

ProgressBar::ProgressBar(std::FILE* out, double total, std::string label)
    : out_(out),
      total_(std::max(total, 1.0)),
      label_(std::move(label)),
      tty_(out && isatty(fileno(out))),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void ProgressBar::update(double done, const std::string& what) {
  if (!out_) return;
  done_ = done;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction = std::clamp(done / total_, 0.0, 1.0);
  // A rate over less than a second says little (a first tensor copied in microseconds read as terabytes a second).
  const double rate = elapsed >= 1 ? done / elapsed : 0;
  const std::string speed = rate > 0 ? fmt::format("{:.1f} MB/s", rate / 1e6) : "? MB/s";
  const std::string left = rate > 0 ? duration((total_ - done) / rate) : "?";
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && fraction < 1) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    fmt::print(out_, "\r{} [{}{}] {:5.1f}%  {:>12}  {} left  {:<40.40}", label_, std::string(filled, '#'),
               std::string(kWidth - filled, '.'), 100 * fraction, speed, left, what);
  } else {
    const int tenth = static_cast<int>(fraction * 10);
    if (tenth == last_tenth_) return;
    last_tenth_ = tenth;
    fmt::print(out_, "{} {:3}%  {}  {} left  {}\n", label_, tenth * 10, speed, left, what);
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (!out_) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  fmt::print(out_, "{}{} done: {:.1f} MB in {} ({:.1f} MB/s)\n", tty_ ? "\r\033[K" : "", label_, done_ / 1e6,
             duration(elapsed), elapsed > 0 ? done_ / elapsed / 1e6 : 0.0);
  std::fflush(out_);
}

}  // namespace hetmoe
