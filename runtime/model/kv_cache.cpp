#include "runtime/model/kv_cache.h"

#include <new>

#include "runtime/error.h"

namespace hetmoe::model {

KvCache::KvCache(int64_t n_layer, int64_t n_ctx, int64_t k_width, int64_t v_width)
    : n_ctx_(n_ctx), k_width_(k_width), v_width_(v_width) {
  const double gib = static_cast<double>(n_layer) * n_ctx * (k_width + v_width) * sizeof(float) / (1 << 30);
  try {
    k_.assign(static_cast<size_t>(n_layer * n_ctx * k_width), 0.0f);
    v_.assign(static_cast<size_t>(n_layer * n_ctx * v_width), 0.0f);
  } catch (const std::bad_alloc&) {
    fail("not enough memory for a KV cache of {} positions ({:.2f} GiB); use a smaller --ctx-size", n_ctx, gib);
  }
}

}  // namespace hetmoe::model
