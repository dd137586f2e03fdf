#pragma once

// The cost model of the offload scheduler: how long one expert's FFN takes on the CPU for r rows (tokens routed to
// it), how long moving its weights to the device takes, and how long the device then takes; and from these the
// crossover, the row count from which moving an expert is no slower than running it where it lies.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hetmoe::sched {

// Seconds against rows, piecewise linear through measured points (rows ascending, at least one). Below the first
// point it is the first point's time (the weights are read whatever the rows), past the last it follows the last
// segment's slope (a single point: proportional to rows past it).
class Curve {
 public:
  Curve() = default;
  // Throws std::invalid_argument for empty, unequal, unsorted or negative input.
  Curve(std::vector<int64_t> rows, std::vector<double> seconds);
  double at(int64_t rows) const;
  bool empty() const { return rows_.empty(); }
  const std::vector<int64_t>& rows() const { return rows_; }
  const std::vector<double>& seconds() const { return seconds_; }

 private:
  std::vector<int64_t> rows_;
  std::vector<double> seconds_;
};

// One expert as the scheduler sees it: its weights' bytes where the CPU holds them, the bytes of its device part (W^Q
// of a split model; equal to bytes otherwise), the bytes of the residual W^R (split models, else 0), and its shape.
struct ExpertShape {
  double bytes = 0;
  double device_bytes = 0;
  double residual_bytes = 0;
  int64_t n_embd = 0, n_ff = 0;
  // Multiply-adds of gate, up and down for one row, times two: floating-point operations per row.
  double flops_per_row() const { return 6.0 * static_cast<double>(n_embd) * static_cast<double>(n_ff); }
  // An unsplit expert of `bytes`: it runs, and moves, whole.
  static ExpertShape whole(double bytes, int64_t n_embd, int64_t n_ff) {
    return {.bytes = bytes, .device_bytes = bytes, .residual_bytes = 0, .n_embd = n_embd, .n_ff = n_ff};
  }
};

// The CPU's expert FFN time on one ISA tier: a measured curve for an expert of curve_bytes (hetmoe calibrate), scaled
// by bytes for other experts; or, for a machine described rather than measured, overhead + max(bytes / bandwidth,
// flops / rate).
struct CpuTier {
  std::string isa;
  Curve curve;
  double curve_bytes = 0;
  double bytes_per_s = 0, flops_per_s = 0, overhead_s = 0;  // the modelled form (when the curve is empty)
  double seconds(const ExpertShape& e, double bytes, int64_t rows) const;
  // Any weights streamed for `rows` rows at flops_per_row each (a dense layer, attention): the measured curve scaled
  // by bytes (the expert's mix of reading and arithmetic stands for every matrix), or the modelled form.
  double stream_seconds(double bytes, double flops_per_row, int64_t rows) const;
};

// The host-device link: latency + bytes / bandwidth per copy.
struct Link {
  double bytes_per_s = 0;
  double latency_s = 0;
  double seconds(double bytes) const { return bytes <= 0 ? 0 : latency_s + bytes / bytes_per_s; }
};

// The device's rates for an expert FFN: launch cost + max(weight bytes / memory bandwidth, flops / rate).
struct GpuRates {
  double memory_bytes = 0;  // device memory
  double bytes_per_s = 0;
  double flops_per_s = 0;
  double launch_s = 0;
  double seconds(double weight_bytes, double flops) const;
};

class CostModel {
 public:
  CostModel(std::vector<CpuTier> cpu, Link link, std::optional<GpuRates> gpu);

  const std::vector<CpuTier>& tiers() const { return cpu_; }
  const CpuTier& tier(const std::string& isa) const;  // throws std::invalid_argument for a tier it does not have
  const Link& link() const { return link_; }
  const std::optional<GpuRates>& gpu() const { return gpu_; }

  // The whole expert (W, or W^Q + W^R) on the CPU, in place.
  double cpu_seconds(const std::string& isa, const ExpertShape& e, int64_t rows) const;
  // Only the residual W^R on the CPU (a resident split expert's critical rows).
  double residual_seconds(const std::string& isa, const ExpertShape& e, int64_t rows) const;
  // Copying `bytes` to the device.
  double move_seconds(double bytes) const { return link_.seconds(bytes); }
  // The expert's device part (its W^Q for a split model) on the device for `rows` rows.
  double gpu_seconds(const ExpertShape& e, int64_t rows) const;
  // A MOVE: the whole expert (W, or W^Q + W^R) copied over, then run on the device; and the device's share alone.
  double moved_seconds(const ExpertShape& e, int64_t rows) const {
    return move_seconds(e.bytes) + moved_gpu_seconds(e, rows);
  }
  double moved_gpu_seconds(const ExpertShape& e, int64_t rows) const;

  // The crossover of an ISA tier: the smallest row count r <= max_rows with move + GPU time <= CPU time, moving the
  // whole expert (W for an unsplit model). nullopt without a device or when moving never pays up to max_rows.
  std::optional<int64_t> crossover(const std::string& isa, const ExpertShape& e, int64_t max_rows = 1 << 16) const;

 private:
  std::vector<CpuTier> cpu_;
  Link link_;
  std::optional<GpuRates> gpu_;
};

}  // namespace hetmoe::sched
