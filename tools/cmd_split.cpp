// hetmoe split: a model's routed experts as a low-bit GPU part W^Q and a CPU residual W^R.
#include <fmt/format.h>

#include <cstdio>
#include <optional>

#include "quant/ggml_type.h"
#include "runtime/model/split_writer.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace hetmoe::cli {

int split(SplitOptions opt, bool report) {
  std::optional<ProgressBar> bar;
  opt.measure_errors = report;
  const std::vector<SplitTensorReport> tensors =
      split_model(opt, [&](double done, double total, const std::string& tensor) {
        if (!bar) bar.emplace(stderr, total, "split");
        bar->update(done, tensor);
      });
  if (bar) bar->finish();
  if (opt.critical_from == model::CriticalFrom::kSource)
    fmt::print("wrote {}: {} expert tensors kept as they are, each with its W^Q\n", opt.out, tensors.size());
  else
    fmt::print("wrote {}: {} expert tensors split into W^Q and W^R\n", opt.out, tensors.size());
  if (!report) return 0;
  fmt::print("{:<32} {:<7} {:<9} {:<6} {:>14} {:>14}\n", "tensor", "source", "W^Q",
             opt.critical_from == model::CriticalFrom::kSource ? "CPU" : "W^R", "err W^Q",
             opt.critical_from == model::CriticalFrom::kSource ? "err critical" : "err W^Q+W^R");
  double gpu = 0, combined = 0;
  for (const SplitTensorReport& t : tensors) {
    fmt::print("{:<32} {:<7} {:<9} {:<6} {:>14.5f} {:>14.5f}\n", t.name, quant::type_info(t.source_type).name,
               quant::type_info(t.gpu_type).name, quant::type_info(t.residual_type).name, t.gpu_error,
               t.combined_error);
    gpu += t.gpu_error;
    combined += t.combined_error;
  }
  if (!tensors.empty())
    fmt::print("{:<32} {:<7} {:<9} {:<6} {:>14.5f} {:>14.5f}\n", "mean", "", "", "", gpu / tensors.size(),
               combined / tensors.size());
  fmt::print("(relative Frobenius error against the source weights, ||W - W'|| / ||W||)\n");
  return 0;
}

}  // namespace hetmoe::cli
