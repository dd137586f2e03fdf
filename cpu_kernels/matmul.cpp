#include "cpu_kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "quant/ref.h"

namespace hetmoe::cpu {

void matmul(const KernelTable& k, ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
            int64_t ldy) {
  if (n_tokens <= 0 || w.n_rows <= 0) return;
  const quant::GgmlType act_type = quant::type_info(w.type).vec_dot_type;
  const VecDotFn dot = k.dot_for(w.type);

  // F32 weights take the activation as it is; every other type needs it converted once per token.
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  size_t act_row = w.n_cols * sizeof(float);
  std::vector<uint8_t> converted;
  if (act_type != quant::GgmlType::F32) {
    act_row = quant::activation_row_bytes(w.type, w.n_cols);
    converted.resize(act_row * n_tokens);
    QuantizeActivationFn convert = k.activation_for(act_type);
    pool.parallel_for(n_tokens, 4, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) convert(x + t * w.n_cols, converted.data() + t * act_row, w.n_cols);
    });
    act = converted.data();
  }

  // A chunk of 16 rows keeps each thread's slice of W streaming while all tokens reuse it from cache.
  pool.parallel_for(w.n_rows, 16, [&](int64_t r0, int64_t r1) {
    constexpr int64_t kRowTile = 16;
    for (int64_t rt = r0; rt < r1; rt += kRowTile) {
      int64_t rt_end = std::min(r1, rt + kRowTile);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const uint8_t* a = act + t * act_row;
        float* yt = y + t * ldy;
        for (int64_t r = rt; r < rt_end; ++r) yt[r] = dot(w.n_cols, w.row(r), a);
      }
    }
  });
}

}  // namespace hetmoe::cpu
