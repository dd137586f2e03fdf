#pragma once

// The expert residency cache: which experts' device parts (W^Q of a split model, the whole expert otherwise) live on
// the device, under a budget of slots of one expert each, with the statistics that admit and evict them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "scheduler/plan.h"

namespace hetmoe::sched {

class Residency {
 public:
  struct Options {
    int64_t slots = 0;           // experts the device holds, over all layers
    double decay = 0.98;         // each step of a layer multiplies its experts' scores by this
    double gate_weight = 1.0;    // a step adds rows + gate_weight * (sum of mixing weights) to an expert's score
    double hysteresis = 0.25;    // an expert is admitted when its score beats the coldest resident's by this share
    int64_t max_admissions = 1;  // per layer step (each one is a copy over the link)
    bool adaptive = true;        // false: what warm_start chose stays (KTransformers' static placement)
  };
  struct Change {
    int64_t layer = 0, expert = 0;
    bool admitted = false;  // false: evicted
  };

  Residency(int64_t n_layer, int64_t n_expert, const Options& options);

  bool resident(int64_t layer, int64_t expert) const { return resident_[index(layer, expert)] != 0; }
  int64_t used() const { return used_; }
  int64_t slots() const { return options_.slots; }
  double score(int64_t layer, int64_t expert) const { return score_[index(layer, expert)]; }
  // The expert's share of its layer's recent tokens (rows over tokens, both decayed like the scores; 0 before the
  // layer's first observed step): the chance that a given token picks it.
  double share(int64_t layer, int64_t expert) const;

  // Warm start from a routing trace: counts[layer][expert] (how often each was chosen); the hottest experts over all
  // layers fill the slots (ties: lower layer, then lower id; experts never chosen are not placed). Their counts become
  // the starting scores.
  void warm_start(const std::vector<std::vector<double>>& counts);
  // Records one step of routing.layer. When adaptive, admits up to max_admissions of its experts whose score beats
  // the coldest resident expert's (any layer) by the hysteresis, evicting that one; into a free slot, any expert with
  // a score is admitted (not those of an excluded layer). Returns the changes in order (an eviction precedes the
  // admission that caused it).
  std::vector<Change> observe(const LayerRouting& routing);
  // The k highest-scoring experts of `layer` that are neither resident nor prefetched (best first; those never seen
  // are not listed).
  std::vector<int64_t> hottest_absent(int64_t layer, int64_t k) const;

  // Experts of one layer copied in for that layer's next step only (prefetched while the link was idle): plans run
  // them on the device like resident ones. Replaces the previous set (an empty list clears it).
  void set_prefetched(int64_t layer, std::vector<int64_t> experts);
  bool prefetched(int64_t layer, int64_t expert) const {
    return layer == prefetched_layer_ && std::find(prefetched_.begin(), prefetched_.end(), expert) != prefetched_.end();
  }
  // Keeps `layer`'s experts off the device (it cannot run their weights' types): never placed, admitted or prefetched.
  void exclude(int64_t layer);
  bool excluded(int64_t layer) const { return excluded_.at(static_cast<size_t>(layer)) != 0; }

 private:
  size_t index(int64_t layer, int64_t expert) const;
  // The resident expert with the lowest score (ties: the later layer, then the higher id); -1 when none.
  int64_t coldest() const;

  int64_t n_layer_, n_expert_;
  Options options_;
  std::vector<double> score_;
  std::vector<uint8_t> resident_;
  std::vector<double> rows_;       // decayed rows per expert
  std::vector<double> tokens_;     // decayed tokens per layer
  std::vector<uint8_t> excluded_;  // per layer
  int64_t used_ = 0;
  int64_t prefetched_layer_ = -1;
  std::vector<int64_t> prefetched_;
};

}  // namespace hetmoe::sched
