#include "cpu_kernels/matmul.h"

#include <algorithm>
#include <array>

#include "cpu_kernels/onednn.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"
#include "quant/ref.h"

namespace hetmoe::cpu {

namespace {

// Values one thread converts at least before a conversion is shared out (16 rows of 2048: a few microseconds).
constexpr int64_t kMinParallelValues = 16 * 2048;

// The activation rows converted to the vec_dot_type of `w`: a view of x itself for F32 weights, else a per-thread
// scratch buffer of the call site `Site` (kept between calls, so decode does not allocate).
template <typename Site>
const uint8_t* convert_activation(const KernelTable& k, ThreadPool& pool, const WeightMatrix& w, const float* x,
                                  int64_t n_tokens, size_t* row_bytes) {
  const quant::GgmlType act_type = quant::type_info(w.type).vec_dot_type;
  if (act_type == quant::GgmlType::F32) {
    *row_bytes = static_cast<size_t>(w.n_cols) * sizeof(float);
    return reinterpret_cast<const uint8_t*>(x);
  }
  *row_bytes = quant::activation_row_bytes(w.type, w.n_cols);
  std::span<uint8_t> storage = scratch<uint8_t, Site>(*row_bytes * static_cast<size_t>(n_tokens));
  const size_t rb = *row_bytes;
  // Shared out only when each thread gets enough to convert: a parallel loop costs a hand-over (about a microsecond
  // between two cores here), more than converting a decode step's 16 short rows of attn_k_b takes.
  const int64_t grain = std::max<int64_t>(4, (kMinParallelValues + w.n_cols - 1) / std::max<int64_t>(1, w.n_cols));
  pool.parallel_for(n_tokens, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) k.to_activation(w.type, x + t * w.n_cols, storage.data() + t * rb, w.n_cols);
  });
  return storage.data();
}

// F32 weights in batches of kTileMinActs or more go to oneDNN where the build has it (the ref tier stays scalar).
bool uses_onednn(const KernelTable& k, const WeightMatrix& w, int64_t n_tokens) {
  return w.type == quant::GgmlType::F32 && n_tokens >= kTileMinActs && k.isa != Isa::kRef && onednn_available();
}

// Tokens per dot_rows call: the activation rows of one chunk stay in L1/L2 while a tile of weight rows passes.
constexpr int64_t kTokenChunk = 16;

// Rows of gate (then of up) per dot_many call in a decode step's SwiGLU: a few hundred kB of each matrix in turn.
constexpr int64_t kDecodeSpan = 256;

// Blocks [b0, b1) of kTileRows rows of a matrix of n_rows rows: a full block goes to tile_fn(first row) when `tiles`,
// the other rows to rows_fn(first row, end row) in runs of consecutive blocks (a decode step's dot_many then puts the
// activation's side together once per run, not once per block). Block boundaries are fixed multiples of kTileRows,
// so which rows take the tile path depends on the matrix alone, never on how the threads split it: results do not
// change with the thread count.
template <typename TileFn, typename RowsFn>
void run_blocks(int64_t b0, int64_t b1, int64_t n_rows, bool tiles, TileFn& tile_fn, RowsFn& rows_fn) {
  int64_t run = b0 * kTileRows;  // the first row not yet done
  for (int64_t b = b0; tiles && b < b1; ++b) {
    const int64_t r0 = b * kTileRows;
    if (r0 + kTileRows > n_rows) break;
    if (run < r0) rows_fn(run, r0);
    tile_fn(r0);
    run = r0 + kTileRows;
  }
  const int64_t end = std::min(n_rows, b1 * kTileRows);
  if (run < end) rows_fn(run, end);
}

// Rows [0, n_rows) over the pool in blocks of kTileRows, as run_blocks takes them.
template <typename TileFn, typename RowsFn>
void for_row_blocks(ThreadPool& pool, int64_t n_rows, bool tiles, TileFn&& tile_fn, RowsFn&& rows_fn) {
  const int64_t blocks = (n_rows + kTileRows - 1) / kTileRows;
  pool.parallel_for_balanced(blocks, 2,
                             [&](int64_t b0, int64_t b1) { run_blocks(b0, b1, n_rows, tiles, tile_fn, rows_fn); });
}

}  // namespace

void block_dots(const KernelTable& k, GemmTileFn tile, const WeightMatrix& w, int64_t r, const uint8_t* act,
                size_t act_row, int64_t n_act, float* dst) {
  if (tile) return tile(w.n_cols, w.row(r), w.row_bytes, act, act_row, n_act, dst, kTileRows);
  k.dot_few(w.type, w.n_cols, w.row(r), w.row_bytes, kTileRows, act, act_row, n_act, dst, kTileRows);
}

void matmul_heads(const KernelTable& k, ThreadPool& pool, const WeightMatrix& w, const HeadsLayout& layout,
                  const float* x, int64_t n_tokens, float* y) {
  const int64_t heads = layout.n_heads, rows = w.n_rows / heads, cols = w.n_cols;
  if (n_tokens <= 0 || rows <= 0) return;
  // Gather each (token, head) input row, then convert them all at once; row t * heads + h.
  std::span<float> gathered = scratch<float, struct HeadsGatherSite>(static_cast<size_t>(n_tokens * heads * cols));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(x + t * layout.x_token_stride + h * layout.x_head_stride, cols, &gathered[(t * heads + h) * cols]);
  size_t act_row = 0;
  const uint8_t* act = convert_activation<struct HeadsActSite>(k, pool, w, gathered.data(), n_tokens * heads, &act_row);
  // Units of kTileRows rows inside one head (a head's last one may be short), so that a unit's head is found once:
  // a division per row costs as much as the dot of a short row (attn_k_b: rows of 128 values).
  const GemmTileFn tile = n_tokens >= kTileMinActs ? k.tile_for(w.type) : nullptr;
  const int64_t units_per_head = (rows + kTileRows - 1) / kTileRows;
  pool.parallel_for_balanced(heads * units_per_head, 2, [&](int64_t u0, int64_t u1) {
    if (!tile) {
      // Decode and a few tokens: each head's rows of the piece in one dot_few call, without dot_rows' chunking (short
      // rows feel it), the activation's side put together once per head and piece rather than once per unit of 16
      // rows. Token t's input for head h is converted row t * heads + h.
      for (int64_t u = u0; u < u1;) {
        const int64_t h = u / units_per_head, end = std::min(u1, (h + 1) * units_per_head);
        const int64_t r0 = u % units_per_head * kTileRows, r1 = std::min(rows, (end - h * units_per_head) * kTileRows);
        k.dot_few(w.type, cols, w.row(h * rows + r0), w.row_bytes, r1 - r0, act + static_cast<size_t>(h) * act_row,
                  heads * act_row, n_tokens, y + h * layout.y_head_stride + r0,
                  static_cast<size_t>(layout.y_token_stride));
        u = end;
      }
      return;
    }
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t h = u / units_per_head, r0 = u % units_per_head * kTileRows;
      const int64_t r1 = std::min(rows, r0 + kTileRows);
      const uint8_t* head_act = act + static_cast<size_t>(h) * act_row;
      float* head_y = y + h * layout.y_head_stride;
      if (tile && r1 - r0 == kTileRows) {
        tile(cols, w.row(h * rows + r0), w.row_bytes, head_act, heads * act_row, n_tokens, head_y + r0,
             layout.y_token_stride);
        continue;
      }
      k.dot_few(w.type, cols, w.row(h * rows + r0), w.row_bytes, r1 - r0, head_act, heads * act_row, n_tokens,
                head_y + r0, static_cast<size_t>(layout.y_token_stride));
    }
  });
}

void swiglu_matmul(const KernelTable& k, ThreadPool& pool, const WeightMatrix& gate, const WeightMatrix& up,
                   const float* x, int64_t n_tokens, float* out) {
  if (n_tokens <= 0 || gate.n_rows <= 0) return;
  size_t gate_row = 0, up_row = 0;
  const uint8_t* gate_act = convert_activation<struct SwigluGateActSite>(k, pool, gate, x, n_tokens, &gate_row);
  const bool same = quant::same_vec_dot_type(gate.type, up.type);
  const uint8_t* up_act =
      same ? gate_act : convert_activation<struct SwigluUpActSite>(k, pool, up, x, n_tokens, &up_row);
  if (same) up_row = gate_row;
  const int64_t n_rows = gate.n_rows;
  if (uses_onednn(k, gate, n_tokens) || uses_onednn(k, up, n_tokens)) {
    // F32 gate or up in a batch: each matrix goes the way matmul takes it (oneDNN), then the SiLU product.
    std::span<float> g = scratch<float, struct SwigluOnednnGateSite>(n_tokens * n_rows);
    std::span<float> u = scratch<float, struct SwigluOnednnUpSite>(n_tokens * n_rows);
    matmul(k, pool, gate, x, n_tokens, g.data(), n_rows);
    matmul(k, pool, up, x, n_tokens, u.data(), n_rows);
    k.swiglu(n_tokens * n_rows, g.data(), u.data(), out);
    return;
  }
  if (n_tokens == 1) {
    // Decode: each piece a thread takes reads its gate rows, then its up rows, kDecodeSpan rows at a time, so that a
    // thread streams one matrix for hundreds of kB before it turns to the other (by blocks of kTileRows it turned every
    // 18 kB). Each row is its own dot_many result whatever the grouping.
    pool.parallel_for_balanced((n_rows + kTileRows - 1) / kTileRows, 2, [&](int64_t b0, int64_t b1) {
      const int64_t r_end = std::min(n_rows, b1 * kTileRows);
      for (int64_t r0 = b0 * kTileRows; r0 < r_end; r0 += kDecodeSpan) {
        const int64_t rows = std::min(kDecodeSpan, r_end - r0);
        float g[kDecodeSpan], u[kDecodeSpan];
        k.dot_many(gate.type, gate.n_cols, gate.row(r0), gate.row_bytes, rows, gate_act, g);
        k.dot_many(up.type, up.n_cols, up.row(r0), up.row_bytes, rows, up_act, u);
        k.swiglu(rows, g, u, out + r0);
      }
    });
    return;
  }
  const GemmTileFn gate_tile = n_tokens >= kTileMinActs ? k.tile_for(gate.type) : nullptr;
  const GemmTileFn up_tile = n_tokens >= kTileMinActs ? k.tile_for(up.type) : nullptr;
  // A matrix with a tile kernel takes it for every full block (whatever the other one does), so each of gate and up
  // follows the same path as matmul would give it alone.
  for_row_blocks(
      pool, n_rows, gate_tile || up_tile,
      [&](int64_t r) {
        // Gate and up for all tokens into per-thread buffers [token][kTileRows], then the SiLU product.
        std::span<float> g = scratch<float, struct SwigluTileGateSite>(n_tokens * kTileRows);
        std::span<float> u = scratch<float, struct SwigluTileUpSite>(n_tokens * kTileRows);
        block_dots(k, gate_tile, gate, r, gate_act, gate_row, n_tokens, g.data());
        block_dots(k, up_tile, up, r, up_act, up_row, n_tokens, u.data());
        for (int64_t t = 0; t < n_tokens; ++t)
          k.swiglu(kTileRows, g.data() + t * kTileRows, u.data() + t * kTileRows, out + t * n_rows + r);
      },
      [&](int64_t r0, int64_t r1) {
        if (n_tokens < kTileMinActs) {
          // A few tokens: gate then up for a span of rows and all of them in one dot_few call each.
          constexpr int64_t kSpan = 64;
          float g[kTileMinActs * kSpan], u[kTileMinActs * kSpan];
          for (int64_t s0 = r0; s0 < r1; s0 += kSpan) {
            const int64_t rows = std::min(kSpan, r1 - s0);
            k.dot_few(gate.type, gate.n_cols, gate.row(s0), gate.row_bytes, rows, gate_act, gate_row, n_tokens, g,
                      kSpan);
            k.dot_few(up.type, up.n_cols, up.row(s0), up.row_bytes, rows, up_act, up_row, n_tokens, u, kSpan);
            for (int64_t t = 0; t < n_tokens; ++t)
              for (int64_t r = 0; r < rows; ++r)
                out[t * n_rows + s0 + r] = silu_times(g[t * kSpan + r], u[t * kSpan + r]);
          }
          return;
        }
        float g[kTokenChunk], u[kTokenChunk];
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenChunk) {
            const int64_t nt = std::min(kTokenChunk, n_tokens - t0);
            k.dot_rows(gate.type, gate.n_cols, gate.row(r), gate_act + t0 * gate_row, gate_row, nt, g);
            k.dot_rows(up.type, up.n_cols, up.row(r), up_act + t0 * up_row, up_row, nt, u);
            for (int64_t t = 0; t < nt; ++t) out[(t0 + t) * n_rows + r] = silu_times(g[t], u[t]);
          }
      });
}

void matmul(const KernelTable& k, ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
            int64_t ldy) {
  if (n_tokens <= 0 || w.n_rows <= 0) return;
  // F32 weights in batches: oneDNN's f32 matmul on the rows in place, by fixed blocks of rows (the blocks, not the
  // thread count, decide each call's shape, so results do not change with the threads).
  if (uses_onednn(k, w, n_tokens)) {
    constexpr int64_t kBlockRows = 64;
    const int64_t blocks = (w.n_rows + kBlockRows - 1) / kBlockRows;
    const auto* wf = reinterpret_cast<const float*>(w.data);
    const int64_t stride = static_cast<int64_t>(w.row_bytes / sizeof(float));
    pool.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * kBlockRows, nr = std::min(kBlockRows, w.n_rows - r0);
        onednn_matmul_f32(wf + r0 * stride, nr, w.n_cols, stride, x, n_tokens, y + r0, ldy);
      }
    });
    return;
  }
  const MatmulOutput out{w, y, ldy};
  matmuls(k, pool, {&out, 1}, x, n_tokens);
}

void matmuls(const KernelTable& k, ThreadPool& pool, std::span<const MatmulOutput> outs, const float* x,
             int64_t n_tokens) {
  if (n_tokens <= 0 || outs.empty()) return;
  const WeightMatrix& w0 = outs[0].w;
  bool fused = outs.size() <= kMaxFused;
  for (const MatmulOutput& o : outs)
    fused = fused && o.w.n_cols == w0.n_cols && quant::same_vec_dot_type(o.w.type, w0.type) &&
            !uses_onednn(k, o.w, n_tokens);
  if (!fused) {
    for (const MatmulOutput& o : outs) matmul(k, pool, o.w, x, n_tokens, o.y, o.ldy);
    return;
  }
  size_t act_row = 0;
  const uint8_t* act = convert_activation<struct MatmulActSite>(k, pool, w0, x, n_tokens, &act_row);
  // Batches of kTileMinActs tokens or more go through the tier's tile kernel where it has one (kTileRows rows unpacked
  // once for all tokens); otherwise each weight row is unpacked once per chunk of tokens (dot_rows) and stays in L1.
  // The matrices' blocks are numbered one after another, so one loop shares all of them out.
  std::array<GemmTileFn, kMaxFused> tile{};
  std::array<int64_t, kMaxFused + 1> first{};
  for (size_t i = 0; i < outs.size(); ++i) {
    tile[i] = n_tokens >= kTileMinActs ? k.tile_for(outs[i].w.type) : nullptr;
    first[i + 1] = first[i] + (std::max<int64_t>(0, outs[i].w.n_rows) + kTileRows - 1) / kTileRows;
  }
  pool.parallel_for_balanced(first[outs.size()], 2, [&](int64_t b0, int64_t b1) {
    for (size_t i = 0; i < outs.size(); ++i) {
      const int64_t lo = std::max(b0, first[i]), hi = std::min(b1, first[i + 1]);
      if (lo >= hi) continue;
      const WeightMatrix& w = outs[i].w;
      float* y = outs[i].y;
      const int64_t ldy = outs[i].ldy;
      const GemmTileFn t = tile[i];
      auto tile_fn = [&](int64_t r) { t(w.n_cols, w.row(r), w.row_bytes, act, act_row, n_tokens, y + r, ldy); };
      auto rows_fn = [&](int64_t r0, int64_t r1) {
        k.dot_few(w.type, w.n_cols, w.row(r0), w.row_bytes, r1 - r0, act, act_row, n_tokens, y + r0,
                  static_cast<size_t>(ldy));
      };
      run_blocks(lo - first[i], hi - first[i], w.n_rows, t != nullptr, tile_fn, rows_fn);
    }
  });
}

}  // namespace hetmoe::cpu
