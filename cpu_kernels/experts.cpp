#include "cpu_kernels/experts.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "cpu_kernels/numa/memory.h"
#include "cpu_kernels/ops.h"
#include "cpu_kernels/scratch.h"
#include "quant/ref.h"

namespace hetmoe::cpu {
namespace {

// Rows of gate/up per unit of the first pass: fine enough that the cost-weighted split between threads is even.
constexpr int64_t kGateRows = 32;
// Output rows per unit of the second pass; the unit's partial sums for all items stay in L1/L2.
constexpr int64_t kDownRows = 32;
// Rows per unit of one token's matrices read one at a time (pass 1's gate or up, pass 2's down); a thread reads the
// units of one matrix that its piece holds in one dot_many call (matrix_run_end). Units of 32 rows cost 5.4 us a
// layer to lay out (a V2-Lite decode step: 704 units in pass 1).
constexpr int64_t kOneStreamRows = 128;
// Partial sums one span of the second pass may hold (floats): 64 kB.
constexpr int64_t kPartialFloats = 16384;
// Activation rows per dot_rows call (the weight row is unpacked once for them).
constexpr int64_t kItemChunk = 16;
// Items (expert, token) whose activation rows one thread copies into place: a decode step's 6-9 rows of a few kB
// take under a microsecond, less than handing a loop to another core.
constexpr int64_t kSerialFillItems = 16;

// Per-thread scratch that the passes' prepare steps size before any unit runs: each site is one type for the whole
// function (a site named first inside a lambda would be a type, and so a buffer, of that lambda's own).
struct ExpertTileGateSite;
struct ExpertTileUpSite;
struct ExpertTileDownSite;
struct ExpertPartialSite;

// Which of an expert's pass-1 matrices a unit reads: both (several tokens: each weight row is unpacked once for the
// gate and the up of all of them), or one (a single token: gate and up as separate units).
enum class Part : uint8_t { kGateAndUp, kGate, kUp };

// A block of rows of one expert's matrix (pass 1) or of the output (pass 2), with its cost (rows x tokens).
struct Unit {
  int64_t expert = 0;
  int64_t r0 = 0, r1 = 0;
  double cost = 0;
  Part part = Part::kGateAndUp;
};

// Work units grouped by NUMA node: node k's threads run node k's units, each thread starting on one contiguous range
// of about equal cost. Contiguous ranges keep each thread's reads long sequential streams that the hardware
// prefetchers follow (units taken one at a time from a shared counter break them up); the cost weighting balances
// experts with many tokens against experts with one in prefill, and what it gets wrong threads even out by taking
// the ends of each other's ranges (run_ranges). Without a placement, all threads form one node.
class NodeUnits {
 public:
  NodeUnits(const ThreadPool& pool, std::span<Unit> storage) : pool_(pool), storage_(storage) {
    const ThreadPlacement* p = pool.placement();
    n_nodes_ = p ? static_cast<int64_t>(p->threads_of_node.size()) : 1;
    if (n_nodes_ + 1 > static_cast<int64_t>(node_first_.size()))
      throw std::invalid_argument("expert executor: more than 64 NUMA nodes");
  }
  int64_t n_nodes() const { return n_nodes_; }
  // Rows of an n_rows matrix that node k owns (partition_rows; everything without a placement).
  std::pair<int64_t, int64_t> node_rows(int64_t k, int64_t n_rows, size_t row_bytes) const {
    const ThreadPlacement* p = pool_.placement();
    if (!p || n_nodes_ == 1) return {0, n_rows};
    std::span<std::pair<int64_t, int64_t>> ranges =
        scratch<std::pair<int64_t, int64_t>, struct NodeRowsSite>(p->threads_of_node.size());
    // Node boundaries on whole pages and on whole tiles (so a tile never straddles two nodes, and the rows that take
    // the tile path do not depend on the placement).
    partition_rows(*p, n_rows, std::lcm(page_aligned_rows(row_bytes), kTileRows), ranges.data());
    return ranges[k];
  }
  // Units must be added node by node: all of node 0's, then node 1's, ...
  void begin_node(int64_t k) { node_first_[k] = size_; }
  void add(const Unit& u) { storage_[size_++] = u; }
  // Rows [rows.first, rows.second) of `expert` in units of `block` rows, each costing its rows x `tokens`.
  void add_rows(int64_t expert, std::pair<int64_t, int64_t> rows, int64_t block, int64_t tokens,
                Part part = Part::kGateAndUp) {
    for (int64_t r = rows.first; r < rows.second; r += block) {
      const int64_t r1 = std::min(rows.second, r + block);
      add({expert, r, r1, static_cast<double>(tokens * (r1 - r)), part});
    }
  }
  void end_nodes() {
    node_first_[n_nodes_] = size_;
    double c = 0;
    for (int64_t i = 0; i < size_; ++i) storage_[i].cost = c += storage_[i].cost;  // running totals
  }

  // fn(unit) for each unit, in order, on the thread that takes it; prepare() first on every thread of the pool.
  template <typename Prepare, typename Fn>
  void run(ThreadPool& pool, Prepare&& prepare, Fn&& fn) const {
    run_ranges(pool, prepare, [&](const Unit* begin, const Unit* end) {
      for (const Unit* u = begin; u < end; ++u) fn(*u);
    });
  }

  // fn(begin, end) for runs of consecutive units until all are done. Each thread starts on its own contiguous range
  // and takes it from the front a piece at a time (a quarter of what is left, at least kOwnPiece units); a thread
  // whose range is done takes half of what is left of another range of its node from the back. The costs only
  // estimate the work (8 rows through a tile kernel cost about 4 rows' time, not 8; a VM's vCPUs run at different
  // speeds), and a range's end moving to the thread that is free makes up for it; the pieces stay long runs.
  // Which thread runs a unit, and how long its runs are, thus change from call to call: every thread calls
  // prepare() before it takes any, to size its per-thread scratch for the largest piece it could get, so that a
  // warm decode loop allocates nothing whoever takes what.
  template <typename Prepare, typename Fn>
  void run_ranges(ThreadPool& pool, Prepare&& prepare, Fn&& fn) const {
    std::span<RangeClaim> claims = scratch<RangeClaim, struct UnitClaimSite>(static_cast<size_t>(pool.size()));
    claim_ranges(pool, claims);
    pool.parallel_for(pool.size(), 1, [&](int64_t thread, int64_t) {
      prepare();
      run_claims(claims, thread, piece,
                 [&](int64_t begin, int64_t end) { fn(storage_.data() + begin, storage_.data() + end); });
    });
  }

  // Each thread's contiguous range of its node's units, of about equal cost, into claims (one per pool thread).
  void claim_ranges(const ThreadPool& pool, std::span<RangeClaim> claims) const {
    const ThreadPlacement* p = pool.placement();
    const int64_t n_pool = pool.size();
    for (int64_t thread = 0; thread < n_pool; ++thread) {
      int64_t node = 0, rank = thread, n_threads = n_pool;
      if (p) {
        for (node = 0; node < n_nodes_; ++node) {
          const std::vector<int>& ts = p->threads_of_node[node];
          const auto it = std::find(ts.begin(), ts.end(), static_cast<int>(thread));
          if (it == ts.end()) continue;
          rank = it - ts.begin();
          n_threads = static_cast<int64_t>(ts.size());
          break;
        }
      }
      RangeClaim& c = claims[thread];
      c.reset(0, 0, node);  // empty (a thread on no node of the placement takes nothing)
      if (node == n_nodes_) continue;
      const int64_t first = node_first_[node], last = node_first_[node + 1];
      if (first == last) continue;
      const double base = first > 0 ? storage_[first - 1].cost : 0.0, total = storage_[last - 1].cost - base;
      auto boundary = [&](int64_t j) -> int64_t {
        if (j == n_threads) return last;
        const double target = base + total * static_cast<double>(j) / static_cast<double>(n_threads);
        return std::upper_bound(storage_.begin() + first, storage_.begin() + last, target,
                                [](double v, const Unit& u) { return v < u.cost; }) -
               storage_.begin();
      };
      c.reset(boundary(rank), boundary(rank + 1), node);
    }
  }

  // The owner takes a quarter of what is left (at least kOwnPiece units), another thread half of it.
  static int64_t piece(int64_t left, bool from_back) { return from_back ? left / 2 : std::max(kOwnPiece, left / 4); }

  std::span<const Unit> units() const { return storage_.first(static_cast<size_t>(size_)); }

 private:
  static constexpr int64_t kOwnPiece = 2;

  const ThreadPool& pool_;
  std::span<Unit> storage_;
  int64_t n_nodes_ = 1;
  int64_t size_ = 0;
  std::array<int64_t, 65> node_first_{};
};

// One token and no residual: pass 1 reads the expert's gate rows and its up rows as separate units, so that a thread
// streams one matrix at a time. Reading both in alternation, a block of each in turn, cost about 10 % of the rate (a
// Q4_K harness in 2 MB pages, one and two threads: 52-56 GB/s against 57-60 for the same units one matrix at a time).
bool one_stream(const ExpertFfn& f, int64_t m) { return m == 1 && !f.has_residual(); }

// Byte offsets of each expert's converted activation rows in one buffer, one row per item.
struct ActLayout {
  size_t row_bytes = 0;
  size_t offset = 0;
};

// Where each expert's converted inputs (gate, up), hidden rows and converted hidden rows go.
struct Plan {
  ActLayout gate, up, down;
  ActLayout gate_r, up_r, down_r;  // the residual matrices' inputs, where the expert has them
  size_t hidden = 0;               // float offset of the expert's [items][n_ff] hidden rows
  size_t up_products = 0;          // one-token experts: float offset of the up products (n_ff floats)
};

// Rows [r0, r1) of one matrix of a one-token expert (one_stream) in pass 1, in one dot_many call: the gate's products
// into the hidden row and the up's beside it (the expert's conversion takes their SiLU product).
void one_stream_rows(const KernelTable& k, const ExpertFfn& f, const Plan& p, Part part, int64_t r0, int64_t r1,
                     const uint8_t* act, float* hidden, float* up_products) {
  const bool gate = part == Part::kGate;
  const WeightMatrix& w = gate ? f.gate : f.up;
  float* dst = gate ? hidden + p.hidden : up_products + p.up_products;
  k.dot_many(w.type, w.n_cols, w.row(r0), w.row_bytes, r1 - r0, act + (gate ? p.gate : p.up).offset, dst + r0);
}

// Rows [r0, r1) of an expert's gate and up for its m (< kTileMinActs) tokens: per kGateRows rows, the gate's rows then
// the up's (and the residual's) in one dot_few call each, each row unpacked once for the tokens; into its hidden rows.
void few_gate_up_rows(const KernelTable& k, const ExpertFfn& f, const Plan& p, int64_t m, int64_t r0, int64_t r1,
                      const uint8_t* act, float* hidden) {
  float g[kTileMinActs * kGateRows], up[kTileMinActs * kGateRows];
  float gr[kTileMinActs * kGateRows], ur[kTileMinActs * kGateRows];
  const int64_t n_ff = f.gate.n_rows;
  float* h = hidden + p.hidden;
  for (int64_t s0 = r0; s0 < r1; s0 += kGateRows) {
    const int64_t rows = std::min(kGateRows, r1 - s0);
    auto dots = [&](const WeightMatrix& w, const ActLayout& layout, float* dst) {
      k.dot_few(w.type, w.n_cols, w.row(s0), w.row_bytes, rows, act + layout.offset, layout.row_bytes, m, dst,
                kGateRows);
    };
    dots(f.gate, p.gate, g);
    dots(f.up, p.up, up);
    if (f.has_residual()) {
      dots(f.gate_r, p.gate_r, gr);
      dots(f.up_r, p.up_r, ur);
      for (int64_t q = 0; q < m * kGateRows; ++q) {
        g[q] += gr[q];
        up[q] += ur[q];
      }
    }
    for (int64_t j = 0; j < m; ++j)
      for (int64_t r = 0; r < rows; ++r)
        h[j * n_ff + s0 + r] = f.hidden(s0 + r, g[j * kGateRows + r], up[j * kGateRows + r]);
  }
}

// Down rows [c0, c0 + nr) (nr <= kDownRows) of an expert for its m (< kTileMinActs) tokens in one dot_few call (and
// the residual's): y[j * kDownRows + r - c0], before the bias and the routing weight.
void few_down_rows(const KernelTable& k, const ExpertFfn& f, const Plan& p, int64_t m, int64_t c0, int64_t nr,
                   const uint8_t* down_act, float* y) {
  k.dot_few(f.down.type, f.down.n_cols, f.down.row(c0), f.down.row_bytes, nr, down_act + p.down.offset,
            p.down.row_bytes, m, y, kDownRows);
  if (!f.has_residual()) return;
  float yr[kTileMinActs * kDownRows];
  k.dot_few(f.down_r.type, f.down_r.n_cols, f.down_r.row(c0), f.down_r.row_bytes, nr, down_act + p.down_r.offset,
            p.down_r.row_bytes, m, yr, kDownRows);
  for (int64_t q = 0; q < m * kDownRows; ++q) y[q] += yr[q];
}

// The end of the run of units from units[i] that continue one matrix's rows (same expert and part, each starting
// where the last ended): a thread's piece reads such a run in one dot_many call. The units stay small for balance
// (the pieces at a loop's end), the calls long: a V2-Lite layer's experts, one call per unit of 128 rows, read at
// 0.88-0.89 of the rate of big matrices of the same formats, in runs at 0.93-0.96 (harness, two threads).
size_t matrix_run_end(std::span<const Unit> units, size_t i) {
  size_t j = i + 1;
  while (j < units.size() && units[j].expert == units[i].expert && units[j].part == units[i].part &&
         units[j].r0 == units[j - 1].r1)
    ++j;
  return j;
}

// An expert's hidden rows (m of them) in its down projection's activation types; for a one-token expert, first the
// SiLU product of its gate and up products.
void convert_hidden(const KernelTable& k, const ExpertFfn& f, const Plan& p, int64_t m, float* hidden,
                    const float* up_products, uint8_t* down_act) {
  const int64_t n_ff = f.gate.n_rows;
  if (one_stream(f, m)) {
    float* h = hidden + p.hidden;
    f.hidden_run(k, 0, n_ff, h, up_products + p.up_products, h);
  }
  for (int64_t j = 0; j < m; ++j)
    k.to_activation(f.down.type, hidden + p.hidden + j * n_ff, down_act + p.down.offset + j * p.down.row_bytes, n_ff);
  if (f.has_residual() && p.down_r.offset != p.down.offset)
    for (int64_t j = 0; j < m; ++j)
      k.to_activation(f.down_r.type, hidden + p.hidden + j * n_ff, down_act + p.down_r.offset + j * p.down_r.row_bytes,
                      n_ff);
}

// How far an expert is in the one-token loop: its gate and up units not yet done, then whether its hidden row is
// converted (both through std::atomic_ref); a cache line each, as the threads update them.
struct alignas(64) ExpertProgress {
  int64_t left = 0;
  uint32_t ready = 0;
};

// A few tokens (decode: one; a verification step or a few sequences decoded together: fewer than kTileMinActs) whose
// experts have no residual: pass 1, each expert's conversion and pass 2 in one parallel loop. Each thread takes its
// range of the gate and up units, then its range of the down units (each expert's down rows as units of their own,
// expert after expert, so that a thread streams whole matrices one at a time; both split by cost, so a thread's down
// units are mostly those of the experts whose gate and up it read). The thread that finishes an expert's last gate or
// up unit converts its hidden rows; a down unit whose expert is not converted yet waits for it. So a thread done with
// its part of pass 1 streams down rows while the other finishes, where two barriers and a loop for the conversions
// stood between the passes. An expert with one token reads its gate and its up as separate units (dot_many), one with
// a few reads both per unit (dot_few). Each item's weighted rows go into a row of their own, summed per token in rank
// order once all are done, as the span path sums them: the same floats as the passes apart.
void few_token_experts(const KernelTable& k, ThreadPool& pool, const ExpertBatch& batch, const NodeUnits& gate_units,
                       std::span<const Plan> plan, const uint8_t* act, float* hidden, float* up_products,
                       uint8_t* down_act, int64_t n_embd, bool sparse, float* out) {
  const int64_t n_experts = static_cast<int64_t>(batch.experts.size()), per_token = batch.per_token;
  auto items = [&](int64_t e) { return batch.first[e + 1] - batch.first[e]; };
  NodeUnits down_units(pool, scratch<Unit, struct DownExpertUnitSite>(n_experts * (n_embd / kDownRows + 66)));
  for (int64_t node = 0; node < down_units.n_nodes(); ++node) {
    down_units.begin_node(node);
    for (int64_t e = 0; e < n_experts; ++e)
      if (items(e) > 0)
        down_units.add_rows(e, down_units.node_rows(node, n_embd, batch.experts[e].down.row_bytes), kOneStreamRows,
                            items(e));
  }
  down_units.end_nodes();
  std::span<ExpertProgress> progress = scratch<ExpertProgress, struct ExpertProgressSite>(n_experts);
  for (ExpertProgress& e : progress) e = {};
  for (const Unit& u : gate_units.units()) ++progress[u.expert].left;
  const auto n_pool = static_cast<size_t>(pool.size());
  std::span<RangeClaim> gate_claims = scratch<RangeClaim, struct OneTokenGateClaimSite>(n_pool);
  std::span<RangeClaim> down_claims = scratch<RangeClaim, struct OneTokenDownClaimSite>(n_pool);
  gate_units.claim_ranges(pool, gate_claims);
  down_units.claim_ranges(pool, down_claims);
  // partial[(t * per_token + k) * n_embd + r]: the weighted output row of token t's item in slot k (zeros where a
  // slot has none).
  std::span<float> partial = scratch<float, struct ExpertOneTokenPartialSite>(batch.n_tokens * per_token * n_embd);
  if (sparse) std::fill(partial.begin(), partial.end(), 0.0f);
  std::atomic<bool> failed{false};  // a unit threw: whoever waits for an expert stops waiting

  auto gate_part = [&](int64_t begin, int64_t end) {
    const std::span<const Unit> units =
        gate_units.units().subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    for (size_t i = 0; i < units.size();) {
      const size_t j = matrix_run_end(units, i);
      const int64_t e = units[i].expert, n_units = static_cast<int64_t>(j - i), m = items(e);
      if (units[i].part == Part::kGateAndUp)
        few_gate_up_rows(k, batch.experts[e], plan[e], m, units[i].r0, units[j - 1].r1, act, hidden);
      else
        one_stream_rows(k, batch.experts[e], plan[e], units[i].part, units[i].r0, units[j - 1].r1, act, hidden,
                        up_products);
      i = j;
      // The last units' thread sees every unit's rows: each decrement releases them and the last one acquires all.
      if (std::atomic_ref<int64_t>(progress[e].left).fetch_sub(n_units, std::memory_order_acq_rel) != n_units) continue;
      convert_hidden(k, batch.experts[e], plan[e], m, hidden, up_products, down_act);
      std::atomic_ref<uint32_t>(progress[e].ready).store(1, std::memory_order_release);
    }
  };
  auto down_part = [&](int64_t begin, int64_t end) {
    const std::span<const Unit> units =
        down_units.units().subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    for (size_t u = 0; u < units.size();) {
      const size_t j = matrix_run_end(units, u);
      const int64_t e = units[u].expert, r0 = units[u].r0, r1 = units[j - 1].r1, m = items(e);
      u = j;
      while (std::atomic_ref<uint32_t>(progress[e].ready).load(std::memory_order_acquire) == 0) {
        if (failed.load(std::memory_order_relaxed)) return;
        cpu_relax();
      }
      const ExpertFfn& f = batch.experts[e];
      const int64_t i0 = batch.first[e];
      auto dst_of = [&](int64_t i) { return &partial[(batch.token[i] * per_token + batch.rank[i]) * n_embd]; };
      if (m == 1) {
        float* dst = dst_of(i0);
        k.dot_many(f.down.type, f.down.n_cols, f.down.row(r0), f.down.row_bytes, r1 - r0,
                   down_act + plan[e].down.offset, dst + r0);
        for (int64_t r = r0; r < r1; ++r) dst[r] = (f.down_bias ? dst[r] + f.down_bias[r] : dst[r]) * batch.weight[i0];
        continue;
      }
      float y[kTileMinActs * kDownRows];
      for (int64_t c0 = r0; c0 < r1; c0 += kDownRows) {
        const int64_t nr = std::min(kDownRows, r1 - c0);
        few_down_rows(k, f, plan[e], m, c0, nr, down_act, y);
        for (int64_t jj = 0; jj < m; ++jj) {
          float* dst = dst_of(i0 + jj);
          for (int64_t r = c0; r < c0 + nr; ++r) {
            const float v = f.down_bias ? y[jj * kDownRows + r - c0] + f.down_bias[r] : y[jj * kDownRows + r - c0];
            dst[r] = v * batch.weight[i0 + jj];
          }
        }
      }
    }
  };
  pool.parallel_for(pool.size(), 1, [&](int64_t thread, int64_t) {
    try {
      run_claims(gate_claims, thread, NodeUnits::piece, gate_part);
      run_claims(down_claims, thread, NodeUnits::piece, down_part);
    } catch (...) {
      failed.store(true, std::memory_order_relaxed);
      throw;
    }
  });
  // Per token, in rank order, a row at a time through the tier's axpy (a multiply by 1 is exact, so each add is the
  // plain add's): the scalar loop took 6 us a layer.
  for (int64_t t = 0; t < batch.n_tokens; ++t) {
    const float* rows = &partial[t * per_token * n_embd];
    std::copy_n(rows, n_embd, out + t * n_embd);
    for (int64_t kk = 1; kk < per_token; ++kk) k.axpy(n_embd, 1.0f, rows + kk * n_embd, out + t * n_embd);
  }
}

}  // namespace

void ExpertBatch::clear(int64_t tokens, int64_t items_per_token) {
  n_tokens = tokens;
  per_token = items_per_token;
  experts.clear();
  first.assign(1, 0);
  token.clear();
  rank.clear();
  weight.clear();
}

void ExpertBatch::add_expert(const ExpertFfn& ffn) {
  experts.push_back(ffn);
  first.push_back(first.back());
}

void ExpertBatch::add_item(int32_t t, int32_t k, float w) {
  token.push_back(t);
  rank.push_back(k);
  weight.push_back(w);
  ++first.back();
}

void run_experts(const KernelTable& k, ThreadPool& pool, const ExpertBatch& batch, const float* x, int64_t n_embd,
                 float* out) {
  const int64_t n_experts = static_cast<int64_t>(batch.experts.size());
  const int64_t n_items = static_cast<int64_t>(batch.token.size());
  if (batch.n_tokens == 0) return;
  const int64_t n_slots_all = batch.n_tokens * batch.per_token;
  if (n_items > n_slots_all) throw std::invalid_argument("expert batch: more items than tokens x per_token");
  // Slots without an item (their expert runs elsewhere, on a device say) add nothing.
  const bool sparse = n_items < n_slots_all;
  if (n_experts == 0) return std::fill(out, out + batch.n_tokens * n_embd, 0.0f);

  std::span<Plan> plan = scratch<Plan, struct ExpertPlanSite>(n_experts);
  size_t act_bytes = 0, down_bytes = 0, hidden_floats = 0, up_floats = 0;
  int64_t max_units = 0, max_m = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    const ExpertFfn& f = batch.experts[e];
    const int64_t m = batch.first[e + 1] - batch.first[e];
    max_m = std::max(max_m, m);
    Plan& p = plan[e];
    p.gate = {quant::activation_row_bytes(f.gate.type, f.gate.n_cols), act_bytes};
    act_bytes += p.gate.row_bytes * m;
    const bool same = quant::same_vec_dot_type(f.gate.type, f.up.type);
    p.up = same ? p.gate : ActLayout{quant::activation_row_bytes(f.up.type, f.up.n_cols), act_bytes};
    if (!same) act_bytes += p.up.row_bytes * m;
    p.down = {quant::activation_row_bytes(f.down.type, f.down.n_cols), down_bytes};
    down_bytes += p.down.row_bytes * m;
    if (f.has_residual()) {
      // Each residual input shares its part's rows when the activation types agree, else has rows of its own.
      auto layout = [&](const WeightMatrix& r, const WeightMatrix& part, const ActLayout& part_layout, size_t& bytes) {
        if (quant::same_vec_dot_type(r.type, part.type)) return part_layout;
        const ActLayout l{quant::activation_row_bytes(r.type, r.n_cols), bytes};
        bytes += l.row_bytes * m;
        return l;
      };
      p.gate_r = layout(f.gate_r, f.gate, p.gate, act_bytes);
      p.up_r = quant::same_vec_dot_type(f.up_r.type, f.gate_r.type) ? p.gate_r : layout(f.up_r, f.up, p.up, act_bytes);
      p.down_r = layout(f.down_r, f.down, p.down, down_bytes);
    }
    p.hidden = hidden_floats;
    hidden_floats += static_cast<size_t>(m * f.gate.n_rows);
    if (one_stream(f, m)) {
      p.up_products = up_floats;
      up_floats += static_cast<size_t>(f.up.n_rows);
    }
    max_units += 2 * ((f.gate.n_rows + kGateRows - 1) / kGateRows + 64);  // + one partial block per node
  }
  // Pass 1's units: blocks of each expert's gate/up rows, on the node that holds them, costing rows x tokens.
  NodeUnits gate_units(pool, scratch<Unit, struct GateUnitSite>(max_units));
  for (int64_t node = 0; node < gate_units.n_nodes(); ++node) {
    gate_units.begin_node(node);
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t m = batch.first[e + 1] - batch.first[e];
      const ExpertFfn& f = batch.experts[e];
      if (m == 0) continue;
      auto add_units = [&](const WeightMatrix& w, Part part) {
        const int64_t block = part == Part::kGateAndUp ? kGateRows : kOneStreamRows;
        gate_units.add_rows(e, gate_units.node_rows(node, w.n_rows, w.row_bytes), block, m, part);
      };
      if (one_stream(f, m)) {
        add_units(f.gate, Part::kGate);
        add_units(f.up, Part::kUp);
      } else {
        add_units(f.gate, Part::kGateAndUp);
      }
    }
  }
  gate_units.end_nodes();
  std::span<uint8_t> act = scratch<uint8_t, struct ExpertActSite>(act_bytes);
  std::span<float> hidden = scratch<float, struct ExpertHiddenSite>(hidden_floats);
  std::span<float> up_products = scratch<float, struct ExpertUpSite>(up_floats);
  std::span<uint8_t> down_act = scratch<uint8_t, struct ExpertDownActSite>(down_bytes);

  // Each token's input row converted once per activation type the experts need (most layers: one), then copied to
  // the rows of each expert that token goes to: a decode step converts once, not once per expert.
  size_t widest = 0;
  for (int64_t e = 0; e < n_experts; ++e) widest = std::max({widest, plan[e].gate.row_bytes, plan[e].up.row_bytes});
  std::span<uint8_t> converted =
      scratch<uint8_t, struct ExpertTokenActSite>(2 * widest * static_cast<size_t>(batch.n_tokens));
  // Two slots: the gate's activation type of the first expert, and the up's when it differs; experts whose types
  // differ from both (a shared expert quantized otherwise) convert per item.
  const quant::GgmlType slot_weight[2] = {n_experts > 0 ? batch.experts[0].gate.type : quant::GgmlType::F32,
                                          n_experts > 0 ? batch.experts[0].up.type : quant::GgmlType::F32};
  const size_t slot_row[2] = {n_experts > 0 ? plan[0].gate.row_bytes : 0, n_experts > 0 ? plan[0].up.row_bytes : 0};
  const size_t slot_base[2] = {0, slot_row[0] * static_cast<size_t>(batch.n_tokens)};
  const int n_slots = n_experts > 0 && !quant::same_vec_dot_type(slot_weight[0], slot_weight[1]) ? 2 : 1;
  pool.parallel_for(batch.n_tokens, 4, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int s = 0; s < n_slots; ++s)
        k.to_activation(slot_weight[s], x + t * n_embd, converted.data() + slot_base[s] + t * slot_row[s], n_embd);
  });
  // A decode step's few rows (copies of one converted row) on this thread: a parallel loop would cost more.
  const int64_t fill_grain = n_items <= kSerialFillItems ? n_experts : 1;
  pool.parallel_for(n_experts, fill_grain, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const ExpertFfn& f = batch.experts[e];
      const Plan& p = plan[e];
      auto fill = [&](quant::GgmlType weight_type, const ActLayout& layout) {
        int slot = -1;
        for (int s = 0; s < n_slots; ++s)
          if (quant::same_vec_dot_type(weight_type, slot_weight[s])) slot = s;
        for (int64_t i = batch.first[e]; i < batch.first[e + 1]; ++i) {
          const int64_t j = i - batch.first[e], t = batch.token[i];
          uint8_t* dst = act.data() + layout.offset + j * layout.row_bytes;
          if (slot >= 0)
            std::memcpy(dst, converted.data() + slot_base[slot] + t * slot_row[slot], layout.row_bytes);
          else
            k.to_activation(weight_type, x + t * n_embd, dst, n_embd);
        }
      };
      fill(f.gate.type, p.gate);
      if (p.up.offset != p.gate.offset) fill(f.up.type, p.up);
      if (!f.has_residual()) continue;
      // A layout shared with one filled before (same offset) holds its rows already.
      if (p.gate_r.offset != p.gate.offset && p.gate_r.offset != p.up.offset) fill(f.gate_r.type, p.gate_r);
      if (p.up_r.offset != p.gate.offset && p.up_r.offset != p.up.offset && p.up_r.offset != p.gate_r.offset)
        fill(f.up_r.type, p.up_r);
    }
  });

  // A few tokens whose experts have no residual (decode, a verification step): the passes and the conversions in one
  // loop.
  bool few_tokens = batch.n_tokens < kTileMinActs;
  for (int64_t e = 0; e < n_experts; ++e) few_tokens = few_tokens && !batch.experts[e].has_residual();
  if (few_tokens)
    return few_token_experts(k, pool, batch, gate_units, plan, act.data(), hidden.data(), up_products.data(),
                             down_act.data(), n_embd, sparse, out);

  // Pass 1: hidden = silu(gate x) * up x, by units of kGateRows rows of one expert (of one of its two matrices for a
  // one-token expert, whose SiLU product the conversion after this pass takes). The tile path's per-thread blocks
  // hold [token][kTileRows] of the expert with the most tokens.
  const auto tile_block = [](int64_t m) { return m >= kTileMinActs ? m * kTileRows : 0; };
  auto size_gate_tiles = [&] {
    scratch<float, ExpertTileGateSite>(tile_block(max_m));
    scratch<float, ExpertTileUpSite>(tile_block(max_m));
  };
  gate_units.run(pool, size_gate_tiles, [&](const Unit& unit) {
    const int64_t e = unit.expert;
    const ExpertFfn& f = batch.experts[e];
    const Plan& p = plan[e];
    const int64_t m = batch.first[e + 1] - batch.first[e], n_ff = f.gate.n_rows;
    const int64_t r0 = unit.r0, r1 = unit.r1;
    int64_t first_rest = r0;
    // A split expert with its residual takes the row path (its low-bit part has no tile kernel).
    const bool tiles = m >= kTileMinActs && !f.has_residual();
    const GemmTileFn gate_tile = tiles ? k.tile_for(f.gate.type) : nullptr;
    const GemmTileFn up_tile = tiles ? k.tile_for(f.up.type) : nullptr;
    if (gate_tile || up_tile) {
      // Full blocks of kTileRows rows for all the expert's tokens at once (prefill), [token][kTileRows] per thread;
      // a matrix without a tile kernel fills its block row by row (as swiglu_matmul does).
      std::span<float> g = scratch<float, ExpertTileGateSite>(tile_block(m));
      std::span<float> u = scratch<float, ExpertTileUpSite>(tile_block(m));
      float* h = hidden.data() + p.hidden;
      for (; first_rest + kTileRows <= r1; first_rest += kTileRows) {
        const int64_t r = first_rest;
        block_dots(k, gate_tile, f.gate, r, act.data() + p.gate.offset, p.gate.row_bytes, m, g.data());
        block_dots(k, up_tile, f.up, r, act.data() + p.up.offset, p.up.row_bytes, m, u.data());
        for (int64_t j = 0; j < m; ++j)
          f.hidden_run(k, r, kTileRows, &g[j * kTileRows], &u[j * kTileRows], &h[j * n_ff + r]);
      }
    }
    if (unit.part != Part::kGateAndUp)  // an expert with one token among experts with more (prefill)
      return one_stream_rows(k, f, p, unit.part, unit.r0, unit.r1, act.data(), hidden.data(), up_products.data());
    if (m < kTileMinActs) return few_gate_up_rows(k, f, p, m, first_rest, r1, act.data(), hidden.data());
    float g[kItemChunk], up[kItemChunk];
    for (int64_t c0 = 0; c0 < m; c0 += kItemChunk) {
      const int64_t nc = std::min(kItemChunk, m - c0);
      const uint8_t* ga = act.data() + p.gate.offset + c0 * p.gate.row_bytes;
      const uint8_t* ua = act.data() + p.up.offset + c0 * p.up.row_bytes;
      float* h = hidden.data() + p.hidden + c0 * n_ff;
      for (int64_t r = first_rest; r < r1; ++r) {
        k.dot_rows(f.gate.type, f.gate.n_cols, f.gate.row(r), ga, p.gate.row_bytes, nc, g);
        k.dot_rows(f.up.type, f.up.n_cols, f.up.row(r), ua, p.up.row_bytes, nc, up);
        if (f.has_residual()) {
          float gr[kItemChunk], ur[kItemChunk];
          k.dot_rows(f.gate_r.type, f.gate_r.n_cols, f.gate_r.row(r),
                     act.data() + p.gate_r.offset + c0 * p.gate_r.row_bytes, p.gate_r.row_bytes, nc, gr);
          k.dot_rows(f.up_r.type, f.up_r.n_cols, f.up_r.row(r), act.data() + p.up_r.offset + c0 * p.up_r.row_bytes,
                     p.up_r.row_bytes, nc, ur);
          for (int64_t j = 0; j < nc; ++j) {
            g[j] += gr[j];
            up[j] += ur[j];
          }
        }
        for (int64_t j = 0; j < nc; ++j) h[j * n_ff + r] = f.hidden(r, g[j], up[j]);
      }
    }
  });

  // One-token experts' SiLU products, then the hidden rows in the down projections' activation types.
  pool.parallel_for(n_experts, 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e)
      convert_hidden(k, batch.experts[e], plan[e], batch.first[e + 1] - batch.first[e], hidden.data(),
                     up_products.data(), down_act.data());
  });

  const int64_t per_token = batch.per_token;
  // Pass 2: by blocks of output rows, every expert's down rows, then each token's weighted sum in rank order.
  // Output rows go to nodes as the first expert's down rows do (all experts of a layer share a layout).
  NodeUnits down_units(pool, scratch<Unit, struct DownUnitSite>(n_embd / kDownRows + 66));
  for (int64_t node = 0; node < down_units.n_nodes(); ++node) {
    down_units.begin_node(node);
    down_units.add_rows(0, down_units.node_rows(node, n_embd, n_experts > 0 ? batch.experts[0].down.row_bytes : 0),
                        kDownRows, 1);
  }
  down_units.end_nodes();
  auto down_span = [&](int64_t r0, int64_t r1) {
    const int64_t span_rows = r1 - r0;
    // partial[(t * per_token + k) * span_rows + r - r0]: item (t, k)'s weighted output rows of this block.
    std::span<float> partial = scratch<float, ExpertPartialSite>(n_slots_all * span_rows);
    if (sparse) std::fill(partial.begin(), partial.begin() + n_slots_all * span_rows, 0.0f);
    float y[kItemChunk];
    for (int64_t e = 0; e < n_experts; ++e) {
      const ExpertFfn& f = batch.experts[e];
      const Plan& p = plan[e];
      const int64_t i0 = batch.first[e], m = batch.first[e + 1] - i0;
      int64_t first_rest = r0;
      const GemmTileFn down_tile = m >= kTileMinActs && !f.has_residual() ? k.tile_for(f.down.type) : nullptr;
      if (down_tile) {
        std::span<float> y8 = scratch<float, ExpertTileDownSite>(tile_block(m));
        const uint8_t* a = down_act.data() + p.down.offset;
        for (; first_rest + kTileRows <= r1; first_rest += kTileRows) {
          down_tile(f.down.n_cols, f.down.row(first_rest), f.down.row_bytes, a, p.down.row_bytes, m, y8.data(),
                    kTileRows);
          for (int64_t j = 0; j < m; ++j) {
            const int64_t i = i0 + j;
            float* dst = &partial[(batch.token[i] * per_token + batch.rank[i]) * span_rows + (first_rest - r0)];
            for (int64_t q = 0; q < kTileRows; ++q) {
              const float b = f.down_bias ? f.down_bias[first_rest + q] : 0.0f;
              dst[q] = (y8[j * kTileRows + q] + b) * batch.weight[i];
            }
          }
        }
      }
      if (m == 1 && !f.has_residual()) {
        // One token (decode): the expert's rows of this span in calls of kDownRows rows.
        float y1[kDownRows];
        const int64_t i = i0;
        float* dst = &partial[(batch.token[i] * per_token + batch.rank[i]) * span_rows];
        for (int64_t c0 = first_rest; c0 < r1; c0 += kDownRows) {
          const int64_t nr = std::min(kDownRows, r1 - c0);
          k.dot_many(f.down.type, f.down.n_cols, f.down.row(c0), f.down.row_bytes, nr, down_act.data() + p.down.offset,
                     y1);
          for (int64_t r = c0; r < c0 + nr; ++r)
            dst[r - r0] = (f.down_bias ? y1[r - c0] + f.down_bias[r] : y1[r - c0]) * batch.weight[i];
        }
        continue;
      }
      if (m < kTileMinActs) {
        // A few tokens: the expert's rows of this span for all of them in one dot_few call (per part).
        float yf[kTileMinActs * kDownRows];
        for (int64_t c0 = first_rest; c0 < r1; c0 += kDownRows) {
          const int64_t nr = std::min(kDownRows, r1 - c0);
          few_down_rows(k, f, p, m, c0, nr, down_act.data(), yf);
          for (int64_t j = 0; j < m; ++j) {
            const int64_t i = i0 + j;
            float* dst = &partial[(batch.token[i] * per_token + batch.rank[i]) * span_rows];
            for (int64_t r = c0; r < c0 + nr; ++r) {
              const float v = f.down_bias ? yf[j * kDownRows + r - c0] + f.down_bias[r] : yf[j * kDownRows + r - c0];
              dst[r - r0] = v * batch.weight[i];
            }
          }
        }
        continue;
      }
      for (int64_t c0 = 0; c0 < m; c0 += kItemChunk) {
        const int64_t nc = std::min(kItemChunk, m - c0);
        const uint8_t* a = down_act.data() + p.down.offset + c0 * p.down.row_bytes;
        for (int64_t r = first_rest; r < r1; ++r) {
          k.dot_rows(f.down.type, f.down.n_cols, f.down.row(r), a, p.down.row_bytes, nc, y);
          if (f.has_residual()) {
            float yr[kItemChunk];
            k.dot_rows(f.down_r.type, f.down_r.n_cols, f.down_r.row(r),
                       down_act.data() + p.down_r.offset + c0 * p.down_r.row_bytes, p.down_r.row_bytes, nc, yr);
            for (int64_t j = 0; j < nc; ++j) y[j] += yr[j];
          }
          if (f.down_bias)
            for (int64_t j = 0; j < nc; ++j) y[j] += f.down_bias[r];
          for (int64_t j = 0; j < nc; ++j) {
            const int64_t i = i0 + c0 + j;
            partial[(batch.token[i] * per_token + batch.rank[i]) * span_rows + (r - r0)] = y[j] * batch.weight[i];
          }
        }
      }
    }
    for (int64_t t = 0; t < batch.n_tokens; ++t) {
      const float* s = partial.data() + t * per_token * span_rows;
      float* o = out + t * n_embd + r0;
      for (int64_t r = 0; r < span_rows; ++r) {
        float v = s[r];
        for (int64_t kk = 1; kk < per_token; ++kk) v += s[kk * span_rows + r];
        o[r] = v;
      }
    }
  };
  // Each thread takes its contiguous range of output rows in spans of up to `span` rows: one span covers the whole
  // range when the items are few (decode: every expert's down rows stream through once, one expert after the
  // other), down to one unit when they are many (prefill: the span's partial sums stay in cache).
  const int64_t span =
      std::max<int64_t>(kDownRows, (kPartialFloats / std::max<int64_t>(1, n_slots_all)) / kDownRows * kDownRows);
  auto size_down_blocks = [&] {
    scratch<float, ExpertPartialSite>(n_slots_all * std::min(span, n_embd));
    scratch<float, ExpertTileDownSite>(tile_block(max_m));
  };
  down_units.run_ranges(pool, size_down_blocks, [&](const Unit* first_unit, const Unit* end_unit) {
    const int64_t range_end = (end_unit - 1)->r1;
    for (int64_t r0 = first_unit->r0; r0 < range_end; r0 += span) down_span(r0, std::min(range_end, r0 + span));
  });
}

}  // namespace hetmoe::cpu
