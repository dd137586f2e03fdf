#include "scheduler/routing_trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>

namespace hetmoe::sched {

using nlohmann::json;

std::vector<std::vector<double>> RoutingTrace::counts() const {
  std::vector<std::vector<double>> c(static_cast<size_t>(n_layer), std::vector<double>(static_cast<size_t>(n_expert)));
  for (const RoutingStep& s : steps)
    for (int32_t id : s.ids) c[static_cast<size_t>(s.layer)][static_cast<size_t>(id)] += 1;
  return c;
}

std::string RoutingTrace::header_line() const {
  return json{{"format", "hetmoe-routing/1"},
              {"model", model},
              {"n_layer", n_layer},
              {"n_expert", n_expert},
              {"n_used", n_used}}
      .dump();
}

std::string RoutingTrace::step_line(const RoutingStep& step) const {
  return json{{"layer", step.layer}, {"n", step.n_tokens}, {"ids", step.ids}, {"weights", step.weights}}.dump();
}

std::string RoutingTrace::text() const {
  std::string out = header_line() + "\n";
  for (const RoutingStep& s : steps) out += step_line(s) + "\n";
  return out;
}

RoutingTrace RoutingTrace::parse(const std::string& text, const std::string& path) {
  std::istringstream f(text);
  RoutingTrace t;
  std::string line;
  int64_t number = 0;
  auto bad = [&](const std::string& what) {
    throw std::runtime_error(path + ":" + std::to_string(number) + ": " + what);
  };
  while (std::getline(f, line)) {
    ++number;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      bad("not a JSON line");
    }
    try {
      if (number == 1) {
        if (j.value("format", std::string()) != "hetmoe-routing/1") bad("not a hetmoe-routing/1 trace");
        t.model = j.value("model", std::string());
        t.n_layer = j.at("n_layer").get<int64_t>();
        t.n_expert = j.at("n_expert").get<int64_t>();
        t.n_used = j.at("n_used").get<int64_t>();
        if (t.n_layer <= 0 || t.n_expert <= 0 || t.n_used <= 0 || t.n_used > t.n_expert) bad("impossible shape");
        continue;
      }
      RoutingStep s;
      s.layer = j.at("layer").get<int64_t>();
      s.n_tokens = j.at("n").get<int64_t>();
      s.ids = j.at("ids").get<std::vector<int32_t>>();
      s.weights = j.at("weights").get<std::vector<float>>();
      if (s.layer < 0 || s.layer >= t.n_layer || s.n_tokens <= 0 ||
          static_cast<int64_t>(s.ids.size()) != s.n_tokens * t.n_used || s.weights.size() != s.ids.size())
        bad("a step of the wrong layer or size");
      for (int32_t id : s.ids)
        if (id < 0 || id >= t.n_expert) bad("expert id " + std::to_string(id) + " out of range");
      t.steps.push_back(std::move(s));
    } catch (const json::exception& e) {
      bad(std::string("a field is missing or of the wrong type (") + e.what() + ")");
    }
  }
  if (number == 0) throw std::runtime_error(path + ": the routing trace is empty");
  return t;
}

ZipfRouter::ZipfRouter(int64_t n_expert, int64_t n_used, double s, uint64_t ranking_seed, uint64_t draw_seed)
    : n_expert_(n_expert), n_used_(n_used), ranking_seed_(ranking_seed), rng_(draw_seed) {
  if (n_used > n_expert || n_used <= 0 || s < 0)
    throw std::invalid_argument("zipf routing: more experts per token than experts, or a negative exponent");
  for (int64_t i = 0; i < n_expert; ++i) law_.push_back(1.0 / std::pow(static_cast<double>(i + 1), s));
}

const std::vector<int32_t>& ZipfRouter::ranking(int64_t layer) {
  if (rankings_.size() <= static_cast<size_t>(layer)) rankings_.resize(static_cast<size_t>(layer) + 1);
  std::vector<int32_t>& r = rankings_[static_cast<size_t>(layer)];
  if (r.empty()) {
    r.resize(static_cast<size_t>(n_expert_));
    std::iota(r.begin(), r.end(), 0);
    std::mt19937_64 shuffle(ranking_seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(layer));
    std::shuffle(r.begin(), r.end(), shuffle);
  }
  return r;
}

RoutingStep ZipfRouter::draw(int64_t layer, int64_t n_tokens) {
  const std::vector<int32_t>& rank = ranking(layer);
  RoutingStep st{.layer = layer, .n_tokens = n_tokens, .ids = {}, .weights = {}};
  // Each pick as std::discrete_distribution over the remaining weights makes it (libstdc++: the weights divided by
  // their sum, their running sums with the last set to 1, the first sum not below a canonical draw), without
  // building one per pick: the same draws, several times faster.
  const size_t n = law_.size();
  cumulative_.resize(n);
  auto pick = [&] {
    double total = 0;
    for (double v : weights_) total += v;
    double running = 0;
    for (size_t i = 0; i < n; ++i) cumulative_[i] = running += weights_[i] / total;
    cumulative_[n - 1] = 1.0;
    const double p = std::generate_canonical<double, std::numeric_limits<double>::digits>(rng_);
    return static_cast<int64_t>(std::lower_bound(cumulative_.begin(), cumulative_.end(), p) - cumulative_.begin());
  };
  for (int64_t tok = 0; tok < n_tokens; ++tok) {
    weights_ = law_;
    double sum = 0;
    for (int64_t k = 0; k < n_used_; ++k) {
      const int64_t r = pick();
      weights_[static_cast<size_t>(r)] = 0;  // distinct experts per token
      st.ids.push_back(rank[static_cast<size_t>(r)]);
      const float weight = 1.0f / static_cast<float>(k + 2);
      st.weights.push_back(weight);
      sum += weight;
    }
    for (int64_t k = 0; k < n_used_; ++k)
      st.weights[st.weights.size() - static_cast<size_t>(n_used_ - k)] /= static_cast<float>(sum);
  }
  return st;
}

std::vector<std::vector<double>> ZipfRouter::counts(int64_t n_layer, int64_t first_moe_layer, int64_t tokens) {
  std::vector<std::vector<double>> c(static_cast<size_t>(n_layer), std::vector<double>(static_cast<size_t>(n_expert_)));
  for (int64_t l = first_moe_layer; l < n_layer; ++l)
    for (int32_t id : draw(l, tokens).ids) c[static_cast<size_t>(l)][static_cast<size_t>(id)] += 1;
  return c;
}

RoutingTrace RoutingTrace::zipf(int64_t n_layer, int64_t first_moe_layer, int64_t n_expert, int64_t n_used, double s,
                                int64_t steps, int64_t tokens, uint64_t seed) {
  if (first_moe_layer < 0 || first_moe_layer >= n_layer)
    throw std::invalid_argument("zipf routing: the first MoE layer is outside the model");
  RoutingTrace t;
  t.model = "zipf:" + std::to_string(s);
  t.n_layer = n_layer;
  t.n_expert = n_expert;
  t.n_used = n_used;
  ZipfRouter router(n_expert, n_used, s, seed, seed);
  for (int64_t step = 0; step < steps; ++step)
    for (int64_t l = first_moe_layer; l < n_layer; ++l) t.steps.push_back(router.draw(l, tokens));
  return t;
}

TraceReplay::TraceReplay(const RoutingTrace& trace)
    : trace_(trace),
      per_layer_(static_cast<size_t>(trace.n_layer)),
      step_(static_cast<size_t>(trace.n_layer), 0),
      token_(static_cast<size_t>(trace.n_layer), 0) {
  for (const RoutingStep& s : trace.steps)
    if (s.n_tokens > 0) per_layer_[static_cast<size_t>(s.layer)].push_back(&s);
}

RoutingStep TraceReplay::next(int64_t layer, int64_t n) {
  if (layer < 0 || layer >= trace_.n_layer || per_layer_[static_cast<size_t>(layer)].empty())
    throw std::invalid_argument("the routing trace has no token of MoE layer " + std::to_string(layer));
  const std::vector<const RoutingStep*>& steps = per_layer_[static_cast<size_t>(layer)];
  const int64_t nu = trace_.n_used;
  RoutingStep out{.layer = layer, .n_tokens = n, .ids = {}, .weights = {}};
  size_t& at = step_[static_cast<size_t>(layer)];
  int64_t& token = token_[static_cast<size_t>(layer)];
  while (static_cast<int64_t>(out.ids.size()) < n * nu) {
    const RoutingStep& s = *steps[at % steps.size()];
    if (token >= s.n_tokens) {
      ++at;
      token = 0;
      continue;
    }
    out.ids.insert(out.ids.end(), s.ids.begin() + token * nu, s.ids.begin() + (token + 1) * nu);
    out.weights.insert(out.weights.end(), s.weights.begin() + token * nu, s.weights.begin() + (token + 1) * nu);
    ++token;
  }
  return out;
}

LayerRouting layer_routing(const RoutingStep& step, int64_t n_used, int64_t n_critical) {
  std::map<int64_t, LayerRouting::Expert> by_id;
  for (int64_t t = 0; t < step.n_tokens; ++t)
    for (int64_t a = 0; a < n_used; ++a) {
      const size_t i = static_cast<size_t>(t * n_used + a);
      LayerRouting::Expert& x = by_id[step.ids[i]];
      x.expert = step.ids[i];
      x.rows += 1;
      x.critical_rows += is_critical(step.weights.data() + t * n_used, n_used, a, n_critical) ? 1 : 0;
      x.gate += step.weights[i];
    }
  LayerRouting r{.layer = step.layer, .n_tokens = step.n_tokens, .experts = {}};
  for (const auto& [id, x] : by_id) r.experts.push_back(x);
  return r;
}

}  // namespace hetmoe::sched
