#include "runtime/device/energy.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

namespace hetmoe::device {
namespace {

// NVML's C API as far as bench uses it (the driver's library is opened at run time, never linked).
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlHandleByIndex = int (*)(unsigned, void**);
using NvmlTotalEnergy = int (*)(void*, unsigned long long*);

}  // namespace

EnergyMeter::EnergyMeter(std::string powercap_root, bool gpu) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // Top-level zones only ("intel-rapl:0", "amd-rapl:1"): their sub-zones (cores, dram) are parts of them.
  for (const fs::directory_entry& e : fs::directory_iterator(powercap_root, ec)) {
    const std::string name = e.path().filename().string();
    const size_t colon = name.find(':');
    if (colon == std::string::npos || name.find("rapl") == std::string::npos ||
        name.find(':', colon + 1) != std::string::npos)
      continue;
    Package p{.path = (e.path() / "energy_uj").string(), .last = 0, .range = 0, .total = 0};
    const std::optional<uint64_t> now = read_uj(p.path);
    if (!now) continue;
    p.last = *now;
    p.range = read_uj((e.path() / "max_energy_range_uj").string()).value_or(0);
    packages_.push_back(p);
  }
  if (!gpu) return;
  nvml_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!nvml_) return;
  auto init = reinterpret_cast<NvmlInit>(dlsym(nvml_, "nvmlInit_v2"));
  auto handle = reinterpret_cast<NvmlHandleByIndex>(dlsym(nvml_, "nvmlDeviceGetHandleByIndex_v2"));
  auto energy = reinterpret_cast<NvmlTotalEnergy>(dlsym(nvml_, "nvmlDeviceGetTotalEnergyConsumption"));
  unsigned long long start = 0;
  if (!init || !handle || !energy || init() != 0 || handle(0, &gpu_) != 0 || energy(gpu_, &start) != 0) {
    dlclose(nvml_);
    nvml_ = nullptr;
    return;
  }
  gpu_start_mj_ = start;
}

EnergyMeter::~EnergyMeter() {
  if (!nvml_) return;
  if (auto shutdown = reinterpret_cast<NvmlShutdown>(dlsym(nvml_, "nvmlShutdown"))) shutdown();
  dlclose(nvml_);
}

std::optional<uint64_t> EnergyMeter::read_uj(const std::string& path) const {
  std::ifstream f(path);
  uint64_t v = 0;
  if (!(f >> v)) return std::nullopt;
  return v;
}

std::string EnergyMeter::source() const {
  std::string s;
  if (!packages_.empty()) s = fmt::format("RAPL, {} package{}", packages_.size(), packages_.size() > 1 ? "s" : "");
  if (nvml_) s += s.empty() ? "NVML" : " + NVML";
  return s.empty() ? std::string(kModelledEnergy) : s;
}

double EnergyMeter::joules() {
  double j = 0;
  for (Package& p : packages_) {
    const uint64_t now = read_uj(p.path).value_or(p.last);
    const uint64_t delta = now >= p.last ? now - p.last : now + p.range - p.last;  // one wrap at most
    p.total += static_cast<double>(delta) * 1e-6;
    p.last = now;
    j += p.total;
  }
  if (nvml_) {
    unsigned long long mj = gpu_start_mj_;
    auto energy = reinterpret_cast<NvmlTotalEnergy>(dlsym(nvml_, "nvmlDeviceGetTotalEnergyConsumption"));
    if (energy && energy(gpu_, &mj) == 0) j += static_cast<double>(mj - gpu_start_mj_) * 1e-3;
  }
  return j;
}

double modelled_joules_per_token(int threads, double seconds_per_token, double dram_bytes_per_token) {
  return (7.0 * threads + 5.0) * seconds_per_token + 60e-12 * dram_bytes_per_token;
}

}  // namespace hetmoe::device
