#pragma once

// The picture `bench --svg` and `simulate --svg` write: the policies' prefill and decode tokens/s side by side, and
// the CPU/GPU crossover curves of one expert (time against rows per CPU tier, and moving it plus the device's time),
// with each tier's crossover marked. Plain SVG 1.1, no scripts.

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/machine.h"

namespace hetmoe::cli {

struct PolicyBar {
  std::string policy;
  double prefill_tok_s = 0, decode_tok_s = 0;
};

struct CostCurve {
  std::string label;
  std::vector<int64_t> rows;
  std::vector<double> seconds;
  int64_t crossover = -1;  // a CPU tier's crossover row count, marked on its curve (-1: none)
};

// The picture's words: what it shows, and how the figures were obtained, said on a line of its own so that no title
// hides it ("measured on the emulated device", "predicted by the simulator"); and, when there are no curves, why.
struct SvgLabels {
  std::string title;
  std::string source;
  std::string no_curves;
};
std::string policies_svg(const SvgLabels& labels, const std::vector<PolicyBar>& bars,
                         const std::vector<CostCurve>& curves);
// One expert of shape `e` on each CPU tier of the machine and, with a device, moved and run there: seconds at 1, 2,
// 4, ... 4096 rows, each tier's crossover marked (no curves without a device).
std::vector<CostCurve> crossover_curves(const sched::Machine& machine, const sched::ExpertShape& e);
// Writes the picture to `path` (fails with hetmoe::Error when it cannot).
void write_svg(const std::string& path, const std::string& svg);

}  // namespace hetmoe::cli
