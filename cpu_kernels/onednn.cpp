#include "cpu_kernels/onednn.h"

#if defined(HETMOE_HAVE_ONEDNN)
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#endif

#include <stdexcept>

namespace hetmoe::cpu {

#if defined(HETMOE_HAVE_ONEDNN)
namespace {

struct Shape {
  int64_t m, k, n, w_stride, ldy;
  bool operator==(const Shape&) const = default;
};

struct ShapeHash {
  size_t operator()(const Shape& s) const {
    size_t h = 0;
    for (int64_t v : {s.m, s.k, s.n, s.w_stride, s.ldy}) h = h * 1000003u ^ static_cast<size_t>(v);
    return h;
  }
};

// One engine, stream and primitive cache per calling thread; the first call also limits oneDNN's OpenMP team for
// this thread to itself.
struct PerThread {
  PerThread() : engine(dnnl::engine::kind::cpu, 0), stream(engine) { omp_set_num_threads(1); }
  dnnl::engine engine;
  dnnl::stream stream;
  std::unordered_map<Shape, dnnl::matmul, ShapeHash> primitives;
};

PerThread& per_thread() {
  thread_local PerThread state;
  return state;
}

}  // namespace

bool onednn_available() { return true; }

void onednn_matmul_f32(const float* w, int64_t n_rows, int64_t n_cols, int64_t w_row_stride, const float* x,
                       int64_t n_tokens, float* y, int64_t ldy) {
  using dt = dnnl::memory::data_type;
  PerThread& s = per_thread();
  // src [m, k] row-major; weights [k, n] with element (k, n) at n * w_row_stride + k (the GGUF rows as they lie);
  // dst [m, n] with rows ldy apart.
  const dnnl::memory::desc src_md({n_tokens, n_cols}, dt::f32, dnnl::memory::dims{n_cols, 1});
  const dnnl::memory::desc wei_md({n_cols, n_rows}, dt::f32, dnnl::memory::dims{1, w_row_stride});
  const dnnl::memory::desc dst_md({n_tokens, n_rows}, dt::f32, dnnl::memory::dims{ldy, 1});
  const Shape key{n_tokens, n_cols, n_rows, w_row_stride, ldy};
  auto it = s.primitives.find(key);
  if (it == s.primitives.end()) {
    if (s.primitives.size() >= 256) s.primitives.clear();  // many prompt lengths: start over rather than grow
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), s.engine);
    it = s.primitives.emplace(key, dnnl::matmul(pd)).first;
  }
  dnnl::memory src(src_md, s.engine, const_cast<float*>(x));
  dnnl::memory wei(wei_md, s.engine, const_cast<float*>(w));
  dnnl::memory dst(dst_md, s.engine, y);
  it->second.execute(s.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
  s.stream.wait();
}

#else

bool onednn_available() { return false; }

void onednn_matmul_f32(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t) {
  throw std::logic_error("onednn_matmul_f32: this build has no oneDNN");
}

#endif

}  // namespace hetmoe::cpu
