#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>

#include "runtime/error.h"
#include "runtime/model/model.h"
#include "tools/commands.h"

namespace hetmoe::cli {
namespace {

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;  // ties keep the lower id
  return static_cast<int32_t>(best);
}

int32_t sample(const float* logits, int64_t n, float temperature, std::mt19937_64& rng) {
  if (temperature <= 0) return argmax(logits, n);
  std::vector<double> p(n);
  const float max = *std::max_element(logits, logits + n);
  for (int64_t i = 0; i < n; ++i) p[i] = std::exp((logits[i] - max) / temperature);
  std::discrete_distribution<int32_t> dist(p.begin(), p.end());
  return dist(rng);
}

// Writes all of `bytes` or fails; the file is replaced only when everything was written.
void write_file(const std::string& path, const void* data, size_t size) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot open {} for writing", tmp);
  const bool ok = std::fwrite(data, 1, size, f) == size;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail("cannot write {}", path);
  }
}

}  // namespace

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ',' || text[i] == ' ') {
      ++i;
      continue;
    }
    size_t end = i;
    if (text[end] == '-') ++end;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == i || (text[i] == '-' && end == i + 1)) fail("--tokens: '{}' is not a list of token ids", text);
    const std::string num = text.substr(i, end - i);
    errno = 0;
    const long long v = std::strtoll(num.c_str(), nullptr, 10);
    if (errno != 0 || v < INT32_MIN || v > INT32_MAX) fail("--tokens: {} is out of range", num);
    ids.push_back(static_cast<int32_t>(v));
    i = end;
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

int logits(const LogitsOptions& opt) {
  auto model = model::Model::load(opt.model, resolve_threads(opt.threads));
  const int64_t n = static_cast<int64_t>(opt.tokens.size());
  model::KvCache cache = model->make_cache(std::min<int64_t>(n, model->config().n_ctx_train));
  std::vector<float> out;
  model->forward(opt.tokens, 0, cache, /*all_logits=*/true, out);
  write_file(opt.out, out.data(), out.size() * sizeof(float));
  return 0;
}

int run(const RunOptions& opt) {
  auto model = model::Model::load(opt.model, resolve_threads(opt.threads));
  const model::ModelConfig& c = model->config();
  const int64_t n_prompt = static_cast<int64_t>(opt.tokens.size());
  if (opt.n_predict < 0) fail("-n must not be negative");
  const int64_t ctx = opt.ctx_size > 0 ? opt.ctx_size : std::min<int64_t>(n_prompt + opt.n_predict, c.n_ctx_train);
  model::KvCache cache = model->make_cache(ctx);
  std::mt19937_64 rng(opt.seed);

  using Clock = std::chrono::steady_clock;
  std::vector<float> logits;
  const auto t0 = Clock::now();
  model->forward(opt.tokens, 0, cache, /*all_logits=*/false, logits);
  const auto t1 = Clock::now();
  int64_t pos = n_prompt;
  std::vector<int32_t> generated;
  for (int i = 0; i < opt.n_predict; ++i) {
    const int32_t next = sample(logits.data(), c.n_vocab, opt.temperature, rng);
    generated.push_back(next);
    fmt::print("{}{}", i ? " " : "", next);
    std::fflush(stdout);
    if (i + 1 == opt.n_predict) break;  // the last token is not evaluated
    if (pos >= cache.n_ctx()) {
      fmt::print("\n");
      std::fflush(stdout);
      fail("context full after {} tokens (context size {}); use a larger --ctx-size", pos, cache.n_ctx());
    }
    const int32_t one[1] = {next};
    model->forward(one, pos++, cache, false, logits);
  }
  const auto t2 = Clock::now();
  fmt::print("\n");
  std::fflush(stdout);
  if (!opt.print_ids) {
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    fmt::print(stderr, "prompt {} tokens in {:.3f} s ({:.1f} tok/s), generated {} tokens in {:.3f} s ({:.1f} tok/s)\n",
               n_prompt, prefill_s, n_prompt / std::max(prefill_s, 1e-9), generated.size(), decode_s,
               std::max<double>(0, static_cast<double>(generated.size()) - 1) / std::max(decode_s, 1e-9));
  }
  return 0;
}

}  // namespace hetmoe::cli
