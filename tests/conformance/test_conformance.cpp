// End-to-end agreement with llama.cpp v0.5.0 on the tiny reference models (README of ../shared/ref, section 8.2):
// per-layer hidden states, routing, logits and greedy continuations, with the tolerance of each weight class.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cpu_kernels/kernel_table.h"
#include "cpu_kernels/ops.h"
#include "runtime/model/model.h"
#include "tests/support/reference.h"

namespace hetmoe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<int32_t> kPrompt = {3,   17, 42, 100, 7,  255, 256, 300, 11,  64,  128, 5,
                                      400, 77, 19, 450, 23, 99,  1,   2,   310, 222, 8,   511};

// Where a reference file lies: the suite's own copy in tests/data, else ../shared/ref.
std::optional<fs::path> find_ref(const std::string& sub, const std::string& name) {
  for (const fs::path& root : {fs::path(HETMOE_TEST_DATA_DIR), fs::path(HETMOE_SHARED_REF)}) {
    fs::path p = root / sub / name;
    if (fs::exists(p)) return p;
  }
  return std::nullopt;
}

struct Tolerance {
  double l_out_first;  // rel L2 per token, first layer
  double l_out_later;  // later layers
  double probs;        // max abs diff of router probabilities and weights
  double topk_margin;  // sets must agree where the reference selection margin is at least this
  double logits_rel;
  double logits_abs;   // < 0: not checked
  double top1_margin;  // top-1 and greedy tokens must agree where the reference margin is at least this
};

constexpr Tolerance kF32{1e-4, 1e-4, 1e-5, 0.0, 1e-4, 1e-3, 0.0};
constexpr Tolerance kF16{5e-3, 5e-3, 3e-3, 5e-3, 5e-3, 1.5e-2, 3e-2};
constexpr Tolerance kQuant{1e-2, 5e-2, 1e-2, 1e-2, 5e-2, -1, 0.1};
// IQ files (reference README 8.2): the first layer and the router probabilities get more room.
constexpr Tolerance kIq{3e-2, 5e-2, 2e-2, 1e-2, 5e-2, -1, 0.1};

struct Case {
  std::string model;     // file in models/
  std::string expected;  // file in expected/
  Tolerance tol;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.expected; }

class Recorder : public model::Trace {
 public:
  void values(int64_t layer, std::string_view name, const float* data, int64_t rows, int64_t cols) override {
    values_[{layer, std::string(name)}].assign(data, data + rows * cols);
  }
  void ids(int64_t layer, std::string_view name, const int32_t* data, int64_t rows, int64_t cols) override {
    ids_[{layer, std::string(name)}].assign(data, data + rows * cols);
  }
  const std::vector<float>* values(int64_t layer, const std::string& name) const {
    auto it = values_.find({layer, name});
    return it == values_.end() ? nullptr : &it->second;
  }
  const std::vector<int32_t>* ids(int64_t layer, const std::string& name) const {
    auto it = ids_.find({layer, name});
    return it == ids_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::pair<int64_t, std::string>, std::vector<float>> values_;
  std::map<std::pair<int64_t, std::string>, std::vector<int32_t>> ids_;
};

double rel_l2(const float* a, const json& ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double r = ref[i].get<double>();
    num += (a[i] - r) * (a[i] - r);
    den += r * r;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The reference's selection margin for one token: the last selected score minus the best unselected one, using
// the biased score and, with expert groups, also the margin between the kept and the dropped groups.
double selection_margin(const model::ModelConfig& c, const json& probs, const float* bias) {
  const int64_t ne = c.n_expert;
  std::vector<double> s(ne);
  for (int64_t e = 0; e < ne; ++e) s[e] = probs[e].get<double>() + (bias ? bias[e] : 0.0);
  double group_margin = INFINITY;
  std::vector<bool> eligible(ne, true);
  if (c.n_group > 1) {
    const int64_t per = ne / c.n_group;
    std::vector<std::pair<double, int64_t>> gs;
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<double> v(s.begin() + g * per, s.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs.push_back({v[0] + (per > 1 ? v[1] : 0.0), g});
    }
    std::sort(gs.rbegin(), gs.rend());
    group_margin = gs[c.n_group_used - 1].first - gs[c.n_group_used].first;
    for (int64_t i = c.n_group_used; i < c.n_group; ++i)
      for (int64_t e = 0; e < per; ++e) eligible[gs[i].second * per + e] = false;
  }
  std::vector<double> v;
  for (int64_t e = 0; e < ne; ++e)
    if (eligible[e]) v.push_back(s[e]);
  std::sort(v.rbegin(), v.rend());
  const double expert_margin =
      static_cast<int64_t>(v.size()) > c.n_expert_used ? v[c.n_expert_used - 1] - v[c.n_expert_used] : INFINITY;
  return std::min(group_margin, expert_margin);
}

int32_t argmax(const float* v, int64_t n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

// Forces llama.cpp's expert choice (ids and final mixing weights) on every prompt token whose expert set differs from
// the reference's, so that the token stays on llama.cpp's path and every later check still applies to it. Such a
// difference is legitimate only where the reference's selection margin is below the tolerance (checked by the test).
class ForceReferenceRouting : public model::RoutingOverride {
 public:
  // softmax_selected: the reference's weights are the chosen experts' router logits (gpt-oss), whose softmax mixes.
  ForceReferenceRouting(const json& ref, int64_t n_prompt, bool softmax_selected)
      : n_prompt_(n_prompt), softmax_selected_(softmax_selected) {
    for (const json& layer : ref["internals"])
      if (layer.contains("ffn_moe_topk")) layers_[layer["layer"].get<int64_t>()] = &layer;
  }
  void reroute(int64_t layer, int64_t n_tokens, int64_t n_used, int32_t* ids, float* weights) override {
    if (n_tokens != n_prompt_) return;  // only the prompt batch has reference internals
    const auto it = layers_.find(layer);
    if (it == layers_.end()) return;
    const json& l = *it->second;
    const json& w = l[weights_key(l)];
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::set<int32_t> mine(ids + t * n_used, ids + (t + 1) * n_used), theirs;
      for (const json& id : l["ffn_moe_topk"][t]) theirs.insert(id.get<int32_t>());
      if (mine == theirs) continue;
      for (int64_t i = 0; i < n_used; ++i) {
        ids[t * n_used + i] = l["ffn_moe_topk"][t][i].get<int32_t>();
        weights[t * n_used + i] = w[t][i].get<float>();
      }
      if (softmax_selected_) cpu::softmax(weights + t * n_used, n_used);
      forced_.insert({layer, t});
    }
  }
  // The reference's final mixing weights of a layer.
  static const char* weights_key(const json& layer) {
    return layer.contains("ffn_moe_weights_scaled") ? "ffn_moe_weights_scaled"
           : layer.contains("ffn_moe_weights_norm") ? "ffn_moe_weights_norm"
                                                    : "ffn_moe_weights";
  }
  bool forced(int64_t layer, int64_t t) const { return forced_.count({layer, t}) != 0; }
  size_t n_forced() const { return forced_.size(); }

 private:
  int64_t n_prompt_;
  bool softmax_selected_;
  std::map<int64_t, const json*> layers_;
  std::set<std::pair<int64_t, int64_t>> forced_;
};

// The same for DeepSeek-V3.2's indexer: a query whose selected key set differs from the reference's (legitimate only
// below the reference's boundary gap, checked by the test) attends to the reference's keys instead.
class ForceReferenceSelection : public model::SelectionOverride {
 public:
  ForceReferenceSelection(const json* ix, int64_t n_prompt) : n_prompt_(n_prompt) {
    if (!ix) return;
    for (const json& layer : (*ix)["layers"]) layers_[layer["layer"].get<int64_t>()] = &prompt_rows(layer);
  }
  // A layer's selections and scores for the prompt batch: DeepSeek-V3.2's file holds them in the layer itself,
  // DeepSeek-V4's (ref_dsv4/1, its keys compressed blocks) under prompt_batch.
  static const json& prompt_rows(const json& layer) {
    return layer.contains("prompt_batch") ? layer["prompt_batch"] : layer;
  }
  void reselect(int64_t layer, int64_t n_tokens, int64_t top_k, int32_t* selected) override {
    if (n_tokens != n_prompt_) return;
    const auto it = layers_.find(layer);
    if (it == layers_.end()) return;
    for (int64_t t = 0; t < n_tokens; ++t) {
      int32_t* row = selected + t * top_k;
      std::set<int32_t> mine, theirs;
      for (int64_t i = 0; i < top_k; ++i)
        if (row[i] >= 0) mine.insert(row[i]);
      const json& want = (*it->second)["selected"][t];
      for (const json& p : want) theirs.insert(p.get<int32_t>());
      if (mine == theirs) continue;
      for (int64_t i = 0; i < top_k; ++i) row[i] = i < static_cast<int64_t>(want.size()) ? want[i].get<int32_t>() : -1;
      ++forced_;
    }
  }
  int n_forced() const { return forced_; }

 private:
  int64_t n_prompt_;
  std::map<int64_t, const json*> layers_;
  int forced_ = 0;
};

class Conformance : public testing::TestWithParam<Case> {};

TEST_P(Conformance, AgreesWithLlamaCpp) {
  const Case& tc = GetParam();
  const auto model_path = find_ref("models", tc.model);
  const auto expected_path = find_ref("expected", tc.expected);
  if (!model_path || !expected_path)
    HETMOE_MISSING_REFERENCE(tc.model << " or " << tc.expected << " is neither in tests/data nor in "
                                      << HETMOE_SHARED_REF);
  json ref;
  std::ifstream(*expected_path) >> ref;

  auto m = model::Model::load(model_path->string(), 2);
  const model::ModelConfig& c = m->config();
  const int64_t E = c.n_embd, V = c.n_vocab, T = static_cast<int64_t>(kPrompt.size());
  ASSERT_EQ(V, ref["n_vocab"].get<int64_t>());
  model::KvCache cache = m->make_cache(64);
  Recorder rec;
  ForceReferenceRouting force(ref, T, c.gating == model::Gating::kSoftmaxSelected);
  m->set_routing_override(&force);
  // DeepSeek-V3.2: the reference's indexer selections.
  json ix;
  if (c.indexer_heads > 0) {
    const std::string stem = tc.expected.substr(0, tc.expected.size() - 5);
    const auto indexer_path = find_ref("expected", stem + ".indexer.json");
    if (!indexer_path) HETMOE_MISSING_REFERENCE(stem << ".indexer.json");
    std::ifstream(*indexer_path) >> ix;
  }
  ForceReferenceSelection force_selection(c.indexer_heads > 0 ? &ix : nullptr, T);
  m->set_selection_override(&force_selection);
  std::vector<float> logits;
  m->forward(kPrompt, 0, cache, true, logits, &rec);
  m->set_routing_override(nullptr);
  m->set_selection_override(nullptr);

  // Layer by layer, every token. A token whose expert set differs from the reference's (legitimate only below the
  // reference's selection margin) ran on llama.cpp's choice from there on (ForceReferenceRouting), so its later
  // layers, logits and the tokens after it are all still compared.
  // DeepSeek-V3.2's indexer: each query's selected key positions as a set, wherever the reference's boundary gap
  // (8th minus 9th best score) is at least the tolerance (reference README 9.9: F16 3e-3, quantized 1e-2).
  int indexer_checked = 0, indexer_equal = 0, indexer_total = 0;
  const double indexer_gap_tol = tc.tol.logits_abs >= 0 ? 3e-3 : 1e-2;
  if (c.indexer_heads > 0) {
    const double gap_tol = indexer_gap_tol;
    for (const json& entry : ix["layers"]) {
      const int64_t l = entry["layer"].get<int64_t>();
      const json& layer = ForceReferenceSelection::prompt_rows(entry);
      const auto* mine = rec.ids(l, "indexer_topk");
      ASSERT_NE(mine, nullptr) << "layer " << l << " reported no indexer selection";
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> scores = layer["scores"][t].get<std::vector<double>>();
        std::sort(scores.rbegin(), scores.rend());
        const auto top_k = static_cast<size_t>(c.indexer_top_k);
        const double gap = scores.size() > top_k ? scores[top_k - 1] - scores[top_k] : INFINITY;
        std::set<int32_t> got;
        for (int64_t i = 0; i < c.indexer_top_k; ++i)
          if (const int32_t p = (*mine)[t * c.indexer_top_k + i]; p >= 0) got.insert(p);
        std::set<int32_t> want;
        for (const json& p : layer["selected"][t]) want.insert(p.get<int32_t>());
        indexer_equal += got == want;
        ++indexer_total;
        if (gap < gap_tol) continue;
        ++indexer_checked;
        EXPECT_EQ(got, want) << "indexer selection, layer " << l << " token " << t << " (gap " << gap << ")";
      }
    }
  }

  double worst_l_out = 0, worst_probs = 0;
  int sets_equal = 0, sets_total = 0;
  int64_t pairs_checked = 0, pairs_total = 0;
  for (const json& layer : ref["internals"]) {
    const int64_t l = layer["layer"].get<int64_t>();
    const double tol_l_out = l == 0 ? tc.tol.l_out_first : tc.tol.l_out_later;
    if (layer.contains("ffn_moe_topk")) {
      const auto* probs = rec.values(l, "ffn_moe_probs");
      const auto* topk = rec.ids(l, "ffn_moe_topk");
      const auto* weights = rec.values(l, "ffn_moe_weights");
      ASSERT_TRUE(probs && topk && weights) << "layer " << l << " reported no routing";
      const gguf::TensorInfo* bias_t = m->file().find_tensor(fmt::format("blk.{}.exp_probs_b.bias", l));
      const float* bias = bias_t ? reinterpret_cast<const float*>(bias_t->data) : nullptr;
      const char* last = ForceReferenceRouting::weights_key(layer);
      const auto* w = rec.values(l, last);
      ASSERT_NE(w, nullptr) << last;
      for (int64_t t = 0; t < T; ++t) {
        const json& rp = layer["ffn_moe_probs"][t];
        std::set<int32_t> mine(topk->begin() + t * c.n_expert_used, topk->begin() + (t + 1) * c.n_expert_used);
        std::set<int32_t> theirs;
        for (const json& id : layer["ffn_moe_topk"][t]) theirs.insert(id.get<int32_t>());
        ++sets_total;
        for (int64_t e = 0; e < c.n_expert; ++e) {
          const double d = std::abs((*probs)[t * c.n_expert + e] - rp[e].get<double>());
          worst_probs = std::max(worst_probs, d);
          EXPECT_LE(d, tc.tol.probs) << "layer " << l << " token " << t << " expert " << e;
        }
        if (mine != theirs) {
          const double margin = selection_margin(c, rp, bias);
          EXPECT_LT(margin, tc.tol.topk_margin)
              << "layer " << l << " token " << t << ": expert set differs although the reference margin is " << margin;
          EXPECT_TRUE(force.forced(l, t)) << "layer " << l << " token " << t;
          continue;  // its own weights belong to its own set; llama.cpp's went on
        }
        ++sets_equal;
        // The final mixing weights by expert id, at the probabilities' tolerance.
        for (int64_t i = 0; i < c.n_expert_used; ++i) {
          const int32_t id = layer["ffn_moe_topk"][t][i].get<int32_t>();
          const int64_t j =
              std::find(topk->begin() + t * c.n_expert_used, topk->begin() + (t + 1) * c.n_expert_used, id) -
              (topk->begin() + t * c.n_expert_used);
          EXPECT_LE(std::abs((*w)[t * c.n_expert_used + j] - layer[last][t][i].get<double>()), tc.tol.probs)
              << last << " layer " << l << " token " << t;
        }
      }
    }
    // l_out: the hidden state, or a hyper-connected model's whole state (DeepSeek-V4: 4 streams), compared as one
    // vector per token.
    const auto* l_out = rec.values(l, "l_out");
    ASSERT_NE(l_out, nullptr);
    const auto width = static_cast<int64_t>(layer["l_out"][0].size());
    ASSERT_EQ(width, E * std::max<int64_t>(1, c.hc_streams));
    for (int64_t t = 0; t < T; ++t) {
      ++pairs_total;
      const double r = rel_l2(l_out->data() + t * width, layer["l_out"][t], width);
      worst_l_out = std::max(worst_l_out, r);
      EXPECT_LE(r, tol_l_out) << "l_out layer " << l << " token " << t;
      ++pairs_checked;
    }
  }
  EXPECT_EQ(pairs_checked, pairs_total);
  EXPECT_EQ(pairs_total, T * static_cast<int64_t>(ref["internals"].size()));

  double worst_rel = 0, worst_abs = 0;
  for (const json& fl : ref["full_logits"]) {
    const int64_t p = fl["pos"].get<int64_t>();
    const float* mine = logits.data() + p * V;
    const double r = rel_l2(mine, fl["logits"], V);
    double a = 0;
    for (int64_t i = 0; i < V; ++i) a = std::max(a, std::abs(mine[i] - fl["logits"][i].get<double>()));
    worst_rel = std::max(worst_rel, r);
    worst_abs = std::max(worst_abs, a);
    EXPECT_LE(r, tc.tol.logits_rel) << "logits rel at position " << p;
    if (tc.tol.logits_abs >= 0) {
      EXPECT_LE(a, tc.tol.logits_abs) << "logits abs at position " << p;
    }
  }
  int top1_equal = 0, top1_checked = 0, top10_checked = 0;
  for (int64_t p = 0; p < T; ++p) {
    const json& top = ref["top10"][p];
    const double margin = top["logits"][0].get<double>() - top["logits"][1].get<double>();
    if (margin >= tc.tol.top1_margin) {
      ++top1_checked;
      const int32_t mine = argmax(logits.data() + p * V, V);
      top1_equal += mine == top["ids"][0].get<int32_t>();
      EXPECT_EQ(mine, top["ids"][0].get<int32_t>()) << "top-1 at position " << p << " (margin " << margin << ")";
    }
    if (tc.tol.top1_margin == 0) {
      // F32 files: every rank of the top 10 whose reference logit stands more than 1e-3 from both neighbours.
      std::vector<int32_t> order(V);
      for (int32_t i = 0; i < V; ++i) order[i] = i;
      const float* row = logits.data() + p * V;
      std::partial_sort(order.begin(), order.begin() + 10, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      const json& rl = top["logits"];
      for (size_t k = 0; k < top["ids"].size(); ++k) {
        const double prev = k == 0 ? INFINITY : rl[k - 1].get<double>() - rl[k].get<double>();
        const double next = k + 1 < rl.size() ? rl[k].get<double>() - rl[k + 1].get<double>() : INFINITY;
        if (prev <= 1e-3 || next <= 1e-3) continue;
        ++top10_checked;
        EXPECT_EQ(order[k], top["ids"][k].get<int32_t>()) << "rank " << k << " at position " << p;
      }
    }
  }

  // Greedy continuation through the KV cache. Every step must agree where the reference margin is at least the
  // tolerance (F32: every step); at a step below it either token is accepted, and a different one ends the run.
  int greedy_equal = 0, greedy_checked = 0;
  std::vector<float> step = std::vector<float>(logits.end() - V, logits.end());
  const json& steps = ref["greedy"]["steps"];
  for (int s = 0; s < 16; ++s) {
    const json& top = steps[s]["top10"];
    const double margin = top["logits"][0].get<double>() - top["logits"][1].get<double>();
    const int32_t mine = argmax(step.data(), V);
    const int32_t theirs = ref["greedy"]["tokens"][s].get<int32_t>();
    const bool binding = margin >= tc.tol.top1_margin;
    greedy_checked += binding;
    if (mine != theirs) {
      if (binding)
        ADD_FAILURE() << "greedy step " << s << ": " << mine << " vs " << theirs << " (margin " << margin << ")";
      break;
    }
    ++greedy_equal;
    if (s + 1 < 16) {
      const int32_t one[1] = {mine};
      Recorder step_rec;
      m->forward(one, T + s, cache, false, step, &step_rec);
      // DeepSeek-V4's file also holds the indexer's choice at each greedy step: the same set where the gap allows.
      for (const json& entry : ix.is_null() ? json::array() : ix["layers"]) {
        if (!entry.contains("greedy_steps")) continue;
        const json& gs = entry["greedy_steps"];
        const int64_t l = entry["layer"].get<int64_t>();
        for (size_t i = 0; i < gs["pos"].size(); ++i) {
          if (gs["pos"][i].get<int64_t>() != T + s) continue;
          std::vector<double> scores = gs["scores"][i].get<std::vector<double>>();
          std::sort(scores.rbegin(), scores.rend());
          const auto top_k = static_cast<size_t>(c.indexer_top_k);
          const double gap = scores.size() > top_k ? scores[top_k - 1] - scores[top_k] : INFINITY;
          const auto* mine_sel = step_rec.ids(l, "indexer_topk");
          ASSERT_NE(mine_sel, nullptr);
          std::set<int32_t> got, want;
          for (int32_t b : *mine_sel)
            if (b >= 0) got.insert(b);
          for (const json& b : gs["selected"][i]) want.insert(b.get<int32_t>());
          ++indexer_total;
          indexer_equal += got == want;
          if (gap < indexer_gap_tol) continue;
          ++indexer_checked;
          EXPECT_EQ(got, want) << "indexer selection at greedy step " << s << ", layer " << l << " (gap " << gap << ")";
        }
      }
    }
  }
  if (tc.tol.top1_margin == 0) {
    EXPECT_EQ(greedy_equal, 16);
  }

  std::cout << fmt::format(
                   "[ summary  ] {} (isa {}): (token, layer) pairs checked {}/{} ({:.0f}%), {} forced to llama.cpp's "
                   "experts; logits rel {:.2e} abs {:.2e}; worst l_out rel {:.2e}; router probs {:.2e}; expert sets "
                   "equal {}/{}; top-1 {}/{} checked, top-10 ranks {}; greedy {} equal in a row ({} steps above the "
                   "margin){}\n",
                   tc.expected, cpu::isa_name(cpu::kernels().isa), pairs_checked, pairs_total,
                   100.0 * static_cast<double>(pairs_checked) / static_cast<double>(pairs_total), force.n_forced(),
                   worst_rel, worst_abs, worst_l_out, worst_probs, sets_equal, sets_total, top1_equal, top1_checked,
                   top10_checked, greedy_equal, greedy_checked,
                   c.indexer_heads > 0
                       ? fmt::format("; indexer selections equal {}/{} ({} above the gap, {} forced)", indexer_equal,
                                     indexer_total, indexer_checked, force_selection.n_forced())
                       : std::string())
            << std::flush;
}

INSTANTIATE_TEST_SUITE_P(
    Models, Conformance,
    testing::Values(Case{"tiny-deepseek3-F32.gguf", "tiny-deepseek3-F32.json", kF32},
                    // llama.cpp's default F16 KV cache and flash attention: 0.05-0.2 % away from the F32 cache.
                    Case{"tiny-deepseek3-F32.gguf", "tiny-deepseek3-F32.kvf16-faauto.json", kF16},
                    Case{"tiny-deepseek3-Q8_0.gguf", "tiny-deepseek3-Q8_0.json", kQuant},
                    Case{"tiny-deepseek3-Q4_K_M.gguf", "tiny-deepseek3-Q4_K_M.json", kQuant},
                    Case{"tiny-deepseek2lite-F16.gguf", "tiny-deepseek2lite-F16.json", kF16},
                    Case{"tiny-deepseek2lite-Q4_K_M.gguf", "tiny-deepseek2lite-Q4_K_M.json", kQuant},
                    Case{"tiny-qwen3moe-F16.gguf", "tiny-qwen3moe-F16.json", kF16},
                    Case{"tiny-qwen3moe-Q4_K_M.gguf", "tiny-qwen3moe-Q4_K_M.json", kQuant},
                    Case{"tiny-mixtral-F16.gguf", "tiny-mixtral-F16.json", kF16},
                    Case{"tiny-mixtral-Q4_K_M.gguf", "tiny-mixtral-Q4_K_M.json", kQuant},
                    Case{"tiny-deepseek3-IQ2_XXS.gguf", "tiny-deepseek3-IQ2_XXS.json", kIq},
                    Case{"tiny-qwen3moe-IQ3_S.gguf", "tiny-qwen3moe-IQ3_S.json", kIq},
                    Case{"tiny-glm4moe-F16.gguf", "tiny-glm4moe-F16.json", kF16},
                    Case{"tiny-glm4moe-Q4_K_M.gguf", "tiny-glm4moe-Q4_K_M.json", kQuant},
                    Case{"tiny-minimax-m2-F16.gguf", "tiny-minimax-m2-F16.json", kF16},
                    Case{"tiny-minimax-m2-Q4_K_M.gguf", "tiny-minimax-m2-Q4_K_M.json", kQuant},
                    Case{"tiny-gptoss-F16.gguf", "tiny-gptoss-F16.json", kF16},
                    Case{"tiny-gptoss-Q4_K_M.gguf", "tiny-gptoss-Q4_K_M.json", kQuant},
                    Case{"tiny-gptoss-MXFP4_MOE.gguf", "tiny-gptoss-MXFP4_MOE.json", kQuant},
                    Case{"tiny-deepseek32-F16.gguf", "tiny-deepseek32-F16.json", kF16},
                    Case{"tiny-deepseek32-Q4_K_M.gguf", "tiny-deepseek32-Q4_K_M.json", kQuant},
                    Case{"tiny-qwen35moe-F16.gguf", "tiny-qwen35moe-F16.json", kF16},
                    Case{"tiny-qwen35moe-Q4_K_M.gguf", "tiny-qwen35moe-Q4_K_M.json", kQuant},
                    Case{"tiny-deepseek4-F16.gguf", "tiny-deepseek4-F16.json", kF16},
                    // The reference README's rules for this file are the IQ files' (hyper-connection mixes from a
                    // Q4_K product amplify single rounding events).
                    Case{"tiny-deepseek4-Q4_K_M.gguf", "tiny-deepseek4-Q4_K_M.json", kIq},
                    // llama.cpp's gguf-split of the Q4_K_M file into 3 shards: the same outputs (reference README 2.7).
                    Case{"sharded/tiny-deepseek3-Q4_K_M-00001-of-00003.gguf", "tiny-deepseek3-Q4_K_M.json", kQuant}),
    [](const testing::TestParamInfo<Case>& info) {
      std::string name = info.param.expected.substr(0, info.param.expected.size() - 5);
      if (info.param.model.starts_with("sharded/")) name += "_sharded";
      for (char& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

}  // namespace
}  // namespace hetmoe
