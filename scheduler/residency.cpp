#include "scheduler/residency.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace hetmoe::sched {

Residency::Residency(int64_t n_layer, int64_t n_expert, const Options& options)
    : n_layer_(n_layer),
      n_expert_(n_expert),
      options_(options),
      score_(static_cast<size_t>(n_layer * n_expert), 0.0),
      resident_(static_cast<size_t>(n_layer * n_expert), 0),
      rows_(static_cast<size_t>(n_layer * n_expert), 0.0),
      tokens_(static_cast<size_t>(std::max<int64_t>(n_layer, 0)), 0.0),
      excluded_(static_cast<size_t>(std::max<int64_t>(n_layer, 0)), 0) {
  if (n_layer <= 0 || n_expert <= 0 || options.slots < 0 || options.decay <= 0 || options.decay > 1 ||
      options.hysteresis < 0 || options.max_admissions < 0)
    throw std::invalid_argument("residency: layers and experts must be positive, slots and limits not negative");
}

size_t Residency::index(int64_t layer, int64_t expert) const {
  if (layer < 0 || layer >= n_layer_ || expert < 0 || expert >= n_expert_)
    throw std::out_of_range("residency: no expert " + std::to_string(expert) + " in layer " + std::to_string(layer));
  return static_cast<size_t>(layer * n_expert_ + expert);
}

void Residency::warm_start(const std::vector<std::vector<double>>& counts) {
  if (static_cast<int64_t>(counts.size()) != n_layer_)
    throw std::invalid_argument("residency: the routing trace has " + std::to_string(counts.size()) +
                                " layers, the model " + std::to_string(n_layer_));
  std::fill(resident_.begin(), resident_.end(), 0);
  for (int64_t l = 0; l < n_layer_; ++l) {
    if (static_cast<int64_t>(counts[l].size()) != n_expert_)
      throw std::invalid_argument("residency: the routing trace's layer " + std::to_string(l) + " has " +
                                  std::to_string(counts[l].size()) + " experts, the model " +
                                  std::to_string(n_expert_));
    for (int64_t e = 0; e < n_expert_; ++e) score_[index(l, e)] = counts[l][e];
  }
  std::vector<size_t> order(score_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score_[a] > score_[b]; });
  used_ = 0;
  for (size_t i : order) {
    if (used_ == options_.slots || score_[i] <= 0) break;
    if (excluded_[i / static_cast<size_t>(n_expert_)]) continue;
    resident_[i] = 1;
    ++used_;
  }
}

int64_t Residency::coldest() const {
  int64_t best = -1;
  for (size_t i = 0; i < resident_.size(); ++i)
    if (resident_[i] && (best < 0 || score_[i] <= score_[static_cast<size_t>(best)])) best = static_cast<int64_t>(i);
  return best;
}

std::vector<Residency::Change> Residency::observe(const LayerRouting& routing) {
  const int64_t l = routing.layer;
  for (int64_t e = 0; e < n_expert_; ++e) {
    score_[index(l, e)] *= options_.decay;
    rows_[index(l, e)] *= options_.decay;
  }
  tokens_[static_cast<size_t>(l)] =
      tokens_[static_cast<size_t>(l)] * options_.decay + static_cast<double>(routing.n_tokens);
  for (const LayerRouting::Expert& x : routing.experts) {
    score_[index(l, x.expert)] += static_cast<double>(x.rows) + options_.gate_weight * x.gate;
    rows_[index(l, x.expert)] += static_cast<double>(x.rows);
  }
  std::vector<Change> changes;
  if (!options_.adaptive || options_.slots == 0 || excluded_[static_cast<size_t>(l)]) return changes;
  // Candidates: this step's absent experts, best score first.
  std::vector<int64_t> candidates;
  for (const LayerRouting::Expert& x : routing.experts)
    if (!resident(l, x.expert)) candidates.push_back(x.expert);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](int64_t a, int64_t b) { return score(l, a) > score(l, b); });
  int64_t admitted = 0;
  for (int64_t e : candidates) {
    if (admitted == options_.max_admissions) break;
    const size_t i = index(l, e);
    if (used_ == options_.slots) {
      const int64_t cold = coldest();
      if (score_[i] <= score_[static_cast<size_t>(cold)] * (1 + options_.hysteresis)) break;  // the best did not win
      resident_[static_cast<size_t>(cold)] = 0;
      --used_;
      changes.push_back({cold / n_expert_, cold % n_expert_, false});
    }
    resident_[i] = 1;
    ++used_;
    ++admitted;
    changes.push_back({l, e, true});
  }
  return changes;
}

std::vector<int64_t> Residency::hottest_absent(int64_t layer, int64_t k) const {
  std::vector<int64_t> absent;
  for (int64_t e = 0; e < n_expert_; ++e)
    if (!resident(layer, e) && !prefetched(layer, e) && score(layer, e) > 0 && !excluded_[static_cast<size_t>(layer)])
      absent.push_back(e);
  std::stable_sort(absent.begin(), absent.end(),
                   [&](int64_t a, int64_t b) { return score(layer, a) > score(layer, b); });
  if (static_cast<int64_t>(absent.size()) > k) absent.resize(static_cast<size_t>(std::max<int64_t>(k, 0)));
  return absent;
}

double Residency::share(int64_t layer, int64_t expert) const {
  const size_t i = index(layer, expert);
  const double tokens = tokens_[static_cast<size_t>(layer)];
  return tokens > 0 ? rows_[i] / tokens : 0.0;
}

void Residency::set_prefetched(int64_t layer, std::vector<int64_t> experts) {
  for (int64_t e : experts) index(layer, e);  // throws for an expert the model lacks
  prefetched_layer_ = experts.empty() ? -1 : layer;
  prefetched_ = std::move(experts);
}

void Residency::exclude(int64_t layer) {
  index(layer, 0);
  excluded_[static_cast<size_t>(layer)] = 1;
  for (int64_t e = 0; e < n_expert_; ++e) {
    used_ -= resident_[index(layer, e)];
    resident_[index(layer, e)] = 0;
  }
}

}  // namespace hetmoe::sched
