#include "scheduler/cost_model.h"

#include <algorithm>
#include <stdexcept>

namespace hetmoe::sched {

Curve::Curve(std::vector<int64_t> rows, std::vector<double> seconds)
    : rows_(std::move(rows)), seconds_(std::move(seconds)) {
  if (rows_.empty() || rows_.size() != seconds_.size())
    throw std::invalid_argument("a cost curve needs as many times as row counts, at least one");
  for (size_t i = 0; i < rows_.size(); ++i) {
    if (rows_[i] <= 0 || seconds_[i] < 0 || (i > 0 && rows_[i] <= rows_[i - 1]))
      throw std::invalid_argument("a cost curve needs positive, ascending row counts and non-negative times");
  }
}

double Curve::at(int64_t rows) const {
  if (rows <= 0 || rows_.empty()) return 0;
  if (rows <= rows_.front()) return seconds_.front();
  const auto hi = std::lower_bound(rows_.begin(), rows_.end(), rows);
  size_t j = static_cast<size_t>(hi - rows_.begin());
  if (j == rows_.size()) {
    if (rows_.size() == 1) return seconds_[0] * static_cast<double>(rows) / static_cast<double>(rows_[0]);
    j = rows_.size() - 1;  // past the last point: the last segment's line
  }
  const double x0 = static_cast<double>(rows_[j - 1]), x1 = static_cast<double>(rows_[j]);
  const double t = (static_cast<double>(rows) - x0) / (x1 - x0);
  return seconds_[j - 1] + t * (seconds_[j] - seconds_[j - 1]);
}

double CpuTier::seconds(const ExpertShape& e, double bytes, int64_t rows) const {
  // A residual has the expert's whole shape: the same flops per row, fewer bytes.
  return stream_seconds(bytes, e.flops_per_row(), rows);
}

double CpuTier::stream_seconds(double bytes, double flops_per_row, int64_t rows) const {
  if (rows <= 0) return 0;
  if (!curve.empty()) return curve.at(rows) * bytes / curve_bytes;
  return overhead_s + std::max(bytes / bytes_per_s, flops_per_row * static_cast<double>(rows) / flops_per_s);
}

double GpuRates::seconds(double weight_bytes, double flops) const {
  return launch_s + std::max(weight_bytes / bytes_per_s, flops / flops_per_s);
}

CostModel::CostModel(std::vector<CpuTier> cpu, Link link, std::optional<GpuRates> gpu)
    : cpu_(std::move(cpu)), link_(link), gpu_(gpu) {
  if (cpu_.empty()) throw std::invalid_argument("a cost model needs at least one CPU tier");
  for (const CpuTier& t : cpu_) {
    const bool measured = !t.curve.empty() && t.curve_bytes > 0;
    const bool modelled = t.curve.empty() && t.bytes_per_s > 0 && t.flops_per_s > 0;
    if (!measured && !modelled)
      throw std::invalid_argument("CPU tier '" + t.isa +
                                  "' needs a measured curve with its expert's bytes, or bytes_per_s and flops_per_s");
  }
  if (gpu_ && (gpu_->bytes_per_s <= 0 || gpu_->flops_per_s <= 0))
    throw std::invalid_argument("the device needs positive bytes_per_s and flops_per_s");
  if (gpu_ && link_.bytes_per_s <= 0) throw std::invalid_argument("the host-device link needs positive bytes_per_s");
}

const CpuTier& CostModel::tier(const std::string& isa) const {
  for (const CpuTier& t : cpu_)
    if (t.isa == isa) return t;
  throw std::invalid_argument("the cost model has no CPU tier '" + isa + "'");
}

double CostModel::cpu_seconds(const std::string& isa, const ExpertShape& e, int64_t rows) const {
  return tier(isa).seconds(e, e.bytes, rows);
}

double CostModel::residual_seconds(const std::string& isa, const ExpertShape& e, int64_t rows) const {
  return e.residual_bytes > 0 ? tier(isa).seconds(e, e.residual_bytes, rows) : 0;
}

double CostModel::gpu_seconds(const ExpertShape& e, int64_t rows) const {
  if (!gpu_ || rows <= 0) return 0;
  return gpu_->seconds(e.device_bytes, e.flops_per_row() * static_cast<double>(rows));
}

std::optional<int64_t> CostModel::crossover(const std::string& isa, const ExpertShape& e, int64_t max_rows) const {
  if (!gpu_) return std::nullopt;
  // The first row count that pays, by a scan: measured curves need not be convex (a tier's batch kernels start at
  // some row count), so bisection could miss it.
  for (int64_t r = 1; r <= max_rows; ++r)
    if (moved_seconds(e, r) <= cpu_seconds(isa, e, r)) return r;
  return std::nullopt;
}

double CostModel::moved_gpu_seconds(const ExpertShape& e, int64_t rows) const {
  ExpertShape whole = e;  // once moved, the device holds the whole expert
  whole.device_bytes = e.bytes;
  return gpu_seconds(whole, rows);
}

}  // namespace hetmoe::sched
