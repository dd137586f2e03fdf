#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hetmoe::model {

// Per-layer key and value rows in F32, one row per position. MLA models keep one latent row per position that
// serves as both key and value (v_width 0).
class KvCache {
 public:
  KvCache() = default;
  // Fails with a clear error when the cache cannot be allocated.
  KvCache(int64_t n_layer, int64_t n_ctx, int64_t k_width, int64_t v_width);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t k_width() const { return k_width_; }
  int64_t v_width() const { return v_width_; }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  float* k(int64_t layer, int64_t pos) { return k_.data() + (layer * n_ctx_ + pos) * k_width_; }
  float* v(int64_t layer, int64_t pos) { return v_.data() + (layer * n_ctx_ + pos) * v_width_; }

 private:
  int64_t n_ctx_ = 0;
  int64_t k_width_ = 0;
  int64_t v_width_ = 0;
  std::vector<float> k_;  // [n_layer][n_ctx][k_width]
  std::vector<float> v_;  // [n_layer][n_ctx][v_width]
};

}  // namespace hetmoe::model
