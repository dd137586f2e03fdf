#pragma once

// Checks of a Device's ops shared by the emulated device's unit tests and the CUDA tests.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/ref.h"
#include "runtime/device/device.h"

namespace hetmoe::test_support {

// matmul of `rows` rows of `cols` values of `type` against n activation rows, then silu_mul of the result with
// itself, on stream s, against the dequantized rows in double: |error| <= rel * sum |w x| per output.
inline void check_matmul_and_silu(device::Device& d, int s, quant::GgmlType type, int64_t cols, int64_t rows, int64_t n,
                                  double rel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  const size_t rb = quant::row_bytes(type, cols);
  std::vector<float> wf(rows * cols), x(n * cols);
  for (float& v : wf) v = dist(rng);
  for (float& v : x) v = dist(rng) * 10;
  std::vector<uint8_t> w(rb * rows);
  for (int64_t r = 0; r < rows; ++r) quant::quantize_row(type, &wf[r * cols], w.data() + r * rb, cols);
  device::DeviceMemory dw(d, w.size()), dx(d, x.size() * 4), dy(d, n * rows * 4), dh(d, n * rows * 4);
  d.copy_to_device(s, dw.get(), w.data(), w.size());
  d.copy_to_device(s, dx.get(), x.data(), x.size() * 4);
  d.matmul(s, {type, cols, rows, rb, dw.get()}, dx.as<float>(), n, dy.as<float>());
  d.silu_mul(s, dy.as<float>(), dy.as<float>(), n * rows, dh.as<float>());
  std::vector<float> y(n * rows), h(n * rows);
  d.copy_to_host(s, y.data(), dy.get(), y.size() * 4);
  d.copy_to_host(s, h.data(), dh.get(), h.size() * 4);
  d.synchronize();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> wr(cols);
    quant::dequantize_row(type, w.data() + r * rb, wr.data(), cols);
    for (int64_t t = 0; t < n; ++t) {
      double want = 0, scale = 0;
      for (int64_t i = 0; i < cols; ++i) {
        want += static_cast<double>(wr[i]) * x[t * cols + i];
        scale += std::abs(static_cast<double>(wr[i]) * x[t * cols + i]);
      }
      const float yv = y[t * rows + r];
      ASSERT_NEAR(yv, want, rel * scale + 1e-6)
          << quant::type_info(type).name << " cols " << cols << " rows " << rows << " n " << n << " r " << r;
      ASSERT_NEAR(h[t * rows + r], yv / (1 + std::exp(-yv)) * yv, 1e-5f + 1e-4f * std::abs(yv * yv));
    }
  }
}

}  // namespace hetmoe::test_support
