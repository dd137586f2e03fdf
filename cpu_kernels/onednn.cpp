#include "cpu_kernels/onednn.h"

#if defined(HETMOE_HAVE_ONEDNN)
#include <omp.h>
#include <pthread.h>

#include <csignal>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#endif

#include <stdexcept>

namespace hetmoe::cpu {

#if defined(HETMOE_HAVE_ONEDNN)
namespace {

struct Shape {
  int64_t m, k, n, w_stride, ldy, ldx = 0;
  bool k_major = false;  // the weights as [k][n] rows (onednn_matmul_f32_kn), else [n][k]
  bool operator==(const Shape&) const = default;
};

struct ShapeHash {
  size_t operator()(const Shape& s) const {
    size_t h = s.k_major ? 1 : 0;
    for (int64_t v : {s.m, s.k, s.n, s.w_stride, s.ldy, s.ldx}) h = h * 1000003u ^ static_cast<size_t>(v);
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

// hetmoe pins its own threads (ThreadPool), and oneDNN runs one OpenMP thread per calling thread. LLVM's libomp (a
// clang build links it) binds every thread that calls it to the mask of the first thread that did: a pinned pool
// worker calling first left the main thread pinned to the worker's core (decode at 31 instead of 79 tok/s, one bench
// run in four), and the main thread calling first unpinned the workers. Its binding is switched off before it starts
// (a KMP_AFFINITY the user set stays); GCC's libgomp binds nothing unless asked.
[[maybe_unused]] const int openmp_binding_off = setenv("KMP_AFFINITY", "disabled", 0);

// oneDNN's JIT f32 GEMM kernels of the 2.x releases (Debian 12 ships 2.7; fixed upstream in 2026) point rsp at a heap
// buffer while they run, so a signal handled meanwhile writes its frame into the heap (chat's Ctrl-C during a long
// prompt's attention corrupted it). The calling thread holds off every signal it can for the call; one that arrives
// meanwhile is handled when the call returns, or by another thread.
class SignalsHeld {
 public:
  SignalsHeld() {
    sigset_t all;
    sigfillset(&all);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT}) sigdelset(&all, sig);  // faults stay faults
    pthread_sigmask(SIG_BLOCK, &all, &old_);
  }
  ~SignalsHeld() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t old_;
};

// y [m, n] (rows ldy apart) = x [m, k] (rows ldx apart) times the weights [k, n]: element (k, n) at n * w_stride + k
// (k_major false: the GGUF rows as they lie) or at k * w_stride + n.
void run_matmul(const float* w, int64_t n, int64_t k, int64_t w_stride, bool k_major, const float* x, int64_t ldx,
                int64_t m, float* y, int64_t ldy) {
  using dt = dnnl::memory::data_type;
  PerThread& s = per_thread();
  const dnnl::memory::desc src_md({m, k}, dt::f32, dnnl::memory::dims{ldx, 1});
  const dnnl::memory::desc wei_md({k, n}, dt::f32,
                                  k_major ? dnnl::memory::dims{w_stride, 1} : dnnl::memory::dims{1, w_stride});
  const dnnl::memory::desc dst_md({m, n}, dt::f32, dnnl::memory::dims{ldy, 1});
  const Shape key{m, k, n, w_stride, ldy, ldx, k_major};
  auto it = s.primitives.find(key);
  if (it == s.primitives.end()) {
    if (s.primitives.size() >= 256) s.primitives.clear();  // many prompt lengths: start over rather than grow
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), s.engine);
    it = s.primitives.emplace(key, dnnl::matmul(pd)).first;
  }
  dnnl::memory src(src_md, s.engine, const_cast<float*>(x));
  dnnl::memory wei(wei_md, s.engine, const_cast<float*>(w));
  dnnl::memory dst(dst_md, s.engine, y);
  const SignalsHeld held;
  it->second.execute(s.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
  s.stream.wait();
}

}  // namespace

bool onednn_available() { return true; }

void onednn_matmul_f32(const float* w, int64_t n_rows, int64_t n_cols, int64_t w_row_stride, const float* x,
                       int64_t n_tokens, float* y, int64_t ldy) {
  run_matmul(w, n_rows, n_cols, w_row_stride, false, x, n_cols, n_tokens, y, ldy);
}

void onednn_matmul_f32_kn(const float* w, int64_t n_rows, int64_t n_cols, int64_t w_col_stride, const float* x,
                          int64_t ldx, int64_t n_tokens, float* y, int64_t ldy) {
  run_matmul(w, n_rows, n_cols, w_col_stride, true, x, ldx, n_tokens, y, ldy);
}

#else

bool onednn_available() { return false; }

void onednn_matmul_f32(const float*, int64_t, int64_t, int64_t, const float*, int64_t, float*, int64_t) {
  throw std::logic_error("onednn_matmul_f32: this build has no oneDNN");
}

void onednn_matmul_f32_kn(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t) {
  throw std::logic_error("onednn_matmul_f32_kn: this build has no oneDNN");
}

#endif

}  // namespace hetmoe::cpu
