#pragma once

// A machine as the cost model sees it, read from a JSON file: a hardware profile ("hetmoe-hw/1", written by hand for
// machines you do not have, every assumption stated in it) or the profile `hetmoe calibrate` writes for this one
// ("hetmoe-profile/1": measured curves, and the link and device when calibrate was given one).

#include <optional>
#include <string>
#include <vector>

#include "scheduler/cost_model.h"

namespace hetmoe::sched {

struct Machine {
  std::string name;
  std::vector<std::string> assumptions;
  std::string cpu_name;
  int sockets = 1;
  int cores = 0;
  double dram_bytes_per_s = 0;  // all sockets together
  double dram_bytes = 0;        // capacity
  std::vector<CpuTier> tiers;   // in the order given; the last is the best the CPU has
  std::optional<Link> link;
  std::string gpu_name;
  std::optional<GpuRates> gpu;

  const CpuTier& best_tier() const { return tiers.back(); }
  CostModel cost_model() const;
};

// A profile's text (the scheduler reads no files: engine::load_machine does). Throws std::runtime_error with a
// one-line message naming `where` and the field for bad JSON, an unknown format or a missing or invalid value.
Machine parse_machine(const std::string& text, const std::string& where);
// The machine as a "hetmoe-hw/1" document.
std::string machine_json(const Machine& m);

}  // namespace hetmoe::sched
