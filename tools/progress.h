#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace hetmoe {

// A progress line for long jobs: bar, percent, throughput and time left, redrawn in place on a terminal; on a
// pipe or file one plain line per tenth of the work (no carriage returns in logs).
class ProgressBar {
 public:
  // `total` bytes of work; throughput is shown in MB/s.
  ProgressBar(std::FILE* out, double total, std::string label);
  // `done` units finished so far; `what` names the current piece.
  void update(double done, const std::string& what);
  // The final line, with the elapsed time.
  void finish();

 private:
  std::FILE* out_;
  double total_;
  std::string label_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  int last_tenth_ = -1;
  double done_ = 0;
};

}  // namespace hetmoe
