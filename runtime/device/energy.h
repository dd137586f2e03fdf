#pragma once

// Energy for `hetmoe bench`: the CPU packages' RAPL counters (Linux powercap, /sys/class/powercap/*-rapl:N/energy_uj,
// Intel and recent AMD kernels) and the GPU's NVML energy counter (libnvidia-ml, loaded at run time, Volta or newer)
// where readable; otherwise the caller uses a modelled figure and labels it so.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hetmoe::device {

class EnergyMeter {
 public:
  // Reads the packages under `powercap_root` and, when `gpu` is set, the first NVIDIA GPU through NVML.
  explicit EnergyMeter(std::string powercap_root = "/sys/class/powercap", bool gpu = true);
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  // Whether any counter is readable, and which ("RAPL 2 packages + NVML", ...).
  bool measured() const { return !packages_.empty() || nvml_ != nullptr; }
  std::string source() const;

  // Joules since construction (counters that wrapped are unwrapped once per read: call at least every few minutes).
  double joules();

 private:
  struct Package {
    std::string path;
    uint64_t last = 0, range = 0;
    double total = 0;
  };
  std::optional<uint64_t> read_uj(const std::string& path) const;
  std::vector<Package> packages_;
  void* nvml_ = nullptr;  // dlopen handle
  void* gpu_ = nullptr;   // nvmlDevice_t
  unsigned long long gpu_start_mj_ = 0;
};

// A modelled energy per decoded token where no counter is readable: `threads` busy cores at 7 W each plus 5 W of
// uncore for the token's time, and 60 pJ per DRAM byte read (assumed figures, printed with the result).
double modelled_joules_per_token(int threads, double seconds_per_token, double dram_bytes_per_token);
inline constexpr const char* kModelledEnergy = "modelled: 7 W per busy core + 5 W uncore + 60 pJ per DRAM byte";

}  // namespace hetmoe::device
