// hetmoe kl: how far a model's next-token distributions are from a base model's on the same tokens (KL divergence
// per position), e.g. a split model at several --critical settings against the model it was split from.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/error.h"
#include "runtime/gguf/reader.h"
#include "runtime/model/config.h"
#include "runtime/text/tokenizer.h"
#include "tools/commands.h"

namespace hetmoe::cli {
namespace {

// log-softmax of one row of logits, in double.
std::vector<double> log_softmax(const float* logits, int64_t n) {
  const double top = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - top);
  const double log_sum = top + std::log(sum);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - log_sum;
  return out;
}

std::vector<float> all_logits(model::Model& m, const std::vector<int32_t>& tokens) {
  model::KvCache cache = m.make_cache(static_cast<int64_t>(tokens.size()));
  std::vector<float> logits;
  m.forward(tokens, 0, cache, /*all_logits=*/true, logits);
  return logits;
}

// KL divergence compares two distributions over the same tokens: the models must share the architecture, the hidden
// size and the vocabulary (every token's text, where the files carry a tokenizer), or the numbers mean nothing.
void check_comparable(const model::Model& base, const std::string& base_path, const std::string& path) {
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const model::ModelConfig other = model::read_config(file);
  const model::ModelConfig& c = base.config();
  if (other.arch_name != c.arch_name)
    fail("kl: {} is a {} model and {} a {} model; compare models of one architecture", path, other.arch_name, base_path,
         c.arch_name);
  if (other.n_embd != c.n_embd)
    fail("kl: {} has a hidden size of {}, {} of {}; compare variants of one model", path, other.n_embd, base_path,
         c.n_embd);
  if (other.n_vocab != c.n_vocab)
    fail("kl: {} has a vocabulary of {} tokens, {} of {}; compare models with one vocabulary", path, other.n_vocab,
         base_path, c.n_vocab);
  const gguf::Value* mine = base.file().find("tokenizer.ggml.tokens");
  const gguf::Value* theirs = file.find("tokenizer.ggml.tokens");
  if (mine && theirs && mine->strings() != theirs->strings()) {
    const auto& a = mine->strings();
    const auto& b = theirs->strings();
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    fail("kl: {} and {} have different vocabularies (token {} differs); compare models with one vocabulary", path,
         base_path, i);
  }
}

}  // namespace

int kl(const KlOptions& opt) {
  const int threads = resolve_threads(opt.threads);
  auto base = model::Model::load(opt.base, threads);
  check_comparable(*base, opt.base, opt.model);
  std::vector<int32_t> tokens = opt.tokens;
  std::string source = "--tokens";
  if (!opt.prompt.empty()) {
    tokens = open_tokenizer(base->file())->encode(opt.prompt, /*add_special=*/true, /*parse_special=*/false);
    source = "--prompt";
  } else if (tokens.empty()) {
    // Reproducible pseudo-random ids: the models this is for (random-weight test models) have no text to read.
    std::mt19937_64 rng(opt.seed);
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(base->config().n_vocab) - 1);
    for (int i = 0; i < opt.n_tokens; ++i) tokens.push_back(id(rng));
    source = fmt::format("{} pseudo-random ids, seed {}", opt.n_tokens, opt.seed);
  }
  if (tokens.empty()) fail("no tokens to evaluate");
  const int64_t n = static_cast<int64_t>(tokens.size()), n_vocab = base->config().n_vocab;
  const std::vector<float> want = all_logits(*base, tokens);

  fmt::print("base {}\nmodel {}\ntokens: {} ({})\n", opt.base, opt.model, n, source);
  fmt::print("{:<10} {:>12} {:>12} {:>12} {:>10}\n", "critical", "mean KL", "p99 KL", "max KL", "top-1 same");
  for (const std::string& critical : opt.critical) {
    const auto engine = engine::Engine::open({opt.model, threads, critical, opt.device});
    model::Model* m = &engine->model();
    const std::vector<float> got = all_logits(*m, tokens);
    std::vector<double> kls;
    int64_t same = 0;
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> p = log_softmax(&want[t * n_vocab], n_vocab),
                                q = log_softmax(&got[t * n_vocab], n_vocab);
      double kl = 0;
      for (int64_t i = 0; i < n_vocab; ++i) kl += std::exp(p[i]) * (p[i] - q[i]);
      kls.push_back(std::max(kl, 0.0));
      same += std::max_element(p.begin(), p.end()) - p.begin() == std::max_element(q.begin(), q.end()) - q.begin();
    }
    double mean = 0;
    for (double v : kls) mean += v;
    mean /= static_cast<double>(n);
    std::vector<double> sorted = kls;
    std::sort(sorted.begin(), sorted.end());
    const double p99 = sorted[std::min<size_t>(sorted.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(n)))];
    fmt::print("{:<10} {:>12.6f} {:>12.6f} {:>12.6f} {:>9.1f}%\n", critical.empty() ? "default" : critical, mean, p99,
               sorted.back(), 100.0 * static_cast<double>(same) / static_cast<double>(n));
  }
  return 0;
}

}  // namespace hetmoe::cli
