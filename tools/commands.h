#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_kernels/thread_pool.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sampler.h"
#include "runtime/model/model.h"
#include "runtime/model/split_writer.h"
#include "runtime/text/tokenizer.h"

namespace hetmoe::cli {

using engine::DeviceOptions;

struct InspectOptions {
  std::string model;
  bool all_metadata = false;  // print tokenizer arrays' sizes too
};

struct LogitsOptions {
  std::string model;
  std::vector<int32_t> tokens;
  std::string out;
  DeviceOptions device;
  std::string critical;  // split models: --critical R|all (empty: the default)
  int threads = 0;
};

// Speculative decoding (--draft, --draft-max).
struct DraftOptions {
  std::string source = "none";  // none, ngram, mtp
  int max = 4;                  // drafts per step at most
};

struct RunOptions {
  std::string model;
  std::vector<int32_t> tokens;  // either these ids...
  std::string prompt;           // ...or this text, tokenized with the model's tokenizer
  int n_predict = 128;
  engine::SamplingParams sampling;
  bool ignore_eos = false;  // with a text prompt: keep going past the end-of-generation token
  int64_t ctx_size = 0;     // 0: prompt + n_predict, at most the training context
  bool print_ids = false;
  DeviceOptions device;
  std::string critical;  // split models: --critical R|all (empty: the default)
  int threads = 0;
  std::string trace_routing;  // write every MoE layer's routing here (hetmoe-routing/1)
  DraftOptions draft;
};

struct ChatOptions {
  std::string model;
  std::string system;
  std::string chat_template;  // empty: detect from the file
  engine::SamplingParams sampling;
  int64_t max_tokens = -1;  // per reply; < 0: until the end token or the context
  int64_t ctx_size = 0;     // 0: min(4096, training context)
  bool hide_think = false;  // R1/Qwen3 reasoning: hidden instead of dimmed
  bool enable_thinking = true;
  DraftOptions draft;
  DeviceOptions device;
  std::string critical;  // split models: --critical R|all (empty: the default)
  int threads = 0;
};

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;            // slots: sequences decoded together
  int64_t ctx_size = 0;        // all slots together; 0: min(4096, training context) per slot
  int64_t batch_size = 512;    // tokens per forward pass at most
  int64_t max_queue = 64;      // requests waiting for a slot; more get 503
  int64_t max_tokens = -1;     // a request's default max_tokens (-1: until the end token or the context)
  std::string api_key;         // required as "Authorization: Bearer KEY" when set
  std::string alias;           // the model's name in the API (default: the file's name)
  std::string chat_template;   // empty: detect from the file
  double max_body_mb = 8;      // larger request bodies get 413
  double shutdown_grace = 30;  // seconds the requests in flight get after SIGTERM
  engine::SamplingParams sampling;
  DraftOptions draft;
  DeviceOptions device;
  std::string critical;
  int threads = 0;
};

struct TokenizeOptions {
  std::string model;
  std::string file;
  bool no_bos = false;
};

struct BenchOptions {
  std::string model;
  std::vector<std::string> policies{"cpu"};
  int prompt = 128;  // prefill tokens
  int gen = 32;      // decoded tokens
  int depth = 0;     // tokens in the context before the measured prompt (llama-bench's -d), not timed
  std::string json;  // also write the results here
  std::string svg;   // and draw them (with the crossover curves of --profile's cost model)
  DeviceOptions device;
  std::string critical;  // split models: --critical R|all (empty: the default)
  int threads = 0;
  int repeat = 3;                // measured runs per policy (after one warm-up run); medians are reported
  std::string synthetic;         // "zipf:S": replace the model's routing by Zipf-skewed routing of exponent S
  std::string trace;             // or replay this routing trace (hetmoe run --trace-routing), cycled
  std::vector<int> concurrency;  // streams decoded together per level (the server's batcher); empty: one stream
  DraftOptions draft;            // decode with drafts, and measure the verification cost curve
  std::string draft_text;        // a prompt and a reply (split at a line "==="): the drafts' acceptance on the reply
  std::string vs_llama_bench;    // llama.cpp's llama-bench: run it on the same file, alternating, side by side
};

struct SimulateOptions {
  std::string hw;                            // hardware profile (hetmoe-hw/1) or calibrate's profile
  std::string model_config = "deepseek-v3";  // a make-model preset
  std::string model;                         // or a GGUF file (instead of the preset)
  std::string type = "Q4_K_M";               // the preset's file type
  int layers = -1;                           // blocks (-1: the real model's depth)
  std::vector<std::string> policies{"cpu", "static", "kt", "crossover", "split"};
  int64_t prompt = 500;
  int64_t gen = 128;
  std::string isa;                         // empty: the profile's best CPU tier
  double zipf = 1.0;                       // synthetic routing's skew
  std::string trace;                       // or replay this routing trace
  int64_t kt_experts = -1;                 // kt: experts on the device (-1: as many as fit)
  int64_t kt_prefill_tokens = 1024;        // kt: a prefill of this many tokens moves its experts to the device
  int64_t prefetch = 1;                    // crossover, split: next-layer experts prefetched per step over an idle link
  int64_t move_slots = 2;                  // crossover, split: the ring moved and prefetched experts go through
  int64_t admissions = 1;                  // crossover, split: experts admitted per layer step
  int64_t critical = 2;                    // split: residuals per token
  int gpu_bits = 2, residual_bits = 4;     // split: the formats
  std::string critical_from = "residual";  // split: critical rows add W^R ("residual") or run the source expert
  int64_t experts_per_token = 0;           // > 0: route this many experts per token instead of the model's
  uint64_t seed = 1;
  std::string svg;  // and the picture (policies, crossover curves)
  std::string json;
};

struct TuneOptions {
  std::string hw;            // hardware profile (hetmoe-hw/1) or calibrate's profile
  std::string model;         // a GGUF file (its routed experts as the file stores them), or...
  std::string model_config;  // ...a make-model preset at `type`
  std::string type = "Q4_K_M";
  int64_t prompt = 500;
  int64_t gen = 128;
  double zipf = 1.0;                 // synthetic routing's skew
  std::string trace;                 // or replay this routing trace
  std::string objective = "decode";  // rank by: decode, prefill or ttft
  int top = 5;                       // candidates printed
  bool exact = false;                // only settings whose output is the source model's
  int64_t min_critical = 0;          // split settings with fewer critical experts per token are left out
  double max_dram_gb = 0;            // > 0: at most this much DRAM (else the profile's capacity, when it states it)
  uint64_t seed = 1;
  std::string json;
  // With -m: bench the printed settings for real (their split files written to a temporary folder and removed),
  // each median of `verify_repeat` runs, on the profile's device (an emulated profile's own: its memory and link).
  bool verify = false;
  int verify_repeat = 1;
  int threads = 0;  // for --verify
};

struct KlOptions {
  std::string base;                   // the reference model
  std::string model;                  // the model compared with it (a split model, say)
  std::vector<std::string> critical;  // --critical settings to compare ("" = the model's default)
  std::vector<int32_t> tokens;        // the tokens; or...
  std::string prompt;                 // ...a text; or, neither given, n_tokens pseudo-random ids
  int n_tokens = 128;
  uint64_t seed = 1;
  int threads = 0;
  DeviceOptions device;  // where the compared model runs (a split model's W^Q on a device); the base on the CPU
};

struct CalibrateOptions {
  std::string model;
  std::string out = "hetmoe-profile.json";
  DeviceOptions device{.kind = "cpu"};  // with a device: its link and expert time are measured too
  std::string hw;                       // or: the link and GPU of this hardware profile (hetmoe-hw/1)
  int64_t max_rows = 1024;              // expert FFN timed at 1, 2, 4, ... rows up to this
  double max_seconds = 2.0;             // a tier stops growing the row count once one call takes longer
  int threads = 0;
};

int inspect(const InspectOptions& opt);
int simulate(const SimulateOptions& opt);
// Sweeps the policies and their settings in the simulator and prints the best few with the commands that run them.
int tune(const TuneOptions& opt);
// Writes the split file; with `report`, a table of each tensor's relative error.
int split(SplitOptions opt, bool report);
int calibrate(const CalibrateOptions& opt);
// Prints the KL divergence of `model`'s next-token distributions from `base`'s, per --critical setting.
int kl(const KlOptions& opt);
int bench(const BenchOptions& opt);
int logits(const LogitsOptions& opt);
int run(const RunOptions& opt);
int chat(const ChatOptions& opt);
int serve(const ServeOptions& opt);
// Prints the token ids of a file's exact bytes on one line.
int tokenize(const TokenizeOptions& opt);

// Thread count for 0 = "all cores".
using cpu::resolve_threads;
// Opens a model through the engine and prints on stderr what opening decided (which device, what it holds).
std::unique_ptr<engine::Engine> open_engine(const engine::EngineOptions& options);
// The file's tokenizer, its warnings (special ids dropped) printed on stderr.
std::unique_ptr<text::Tokenizer> open_tokenizer(const gguf::GgufFile& file);
// "3,17,42" or "3 17 42" to ids; fails on anything else.
std::vector<int32_t> parse_token_list(const std::string& text);

}  // namespace hetmoe::cli
