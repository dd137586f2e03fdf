#pragma once

#include <cmath>
#include <limits>
#include <span>

namespace hetmoe::test_support {

// The relative RMS error of `got` against `want`: sqrt(sum (got - want)^2 / sum want^2); infinity when the sizes
// differ.
inline double relative_rms(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

}  // namespace hetmoe::test_support
