// The hetmoe command line. Every failure ends as one line on stderr and a non-zero exit status.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/io/output_file.h"
#include "runtime/model/make_model.h"
#include "scheduler/policies.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace {

using namespace hetmoe;

void add_threads(CLI::App* cmd, int* threads) {
  cmd->add_option("-t,--threads", *threads, "CPU threads (default: all cores; more than the machine has are capped)")
      ->transform(cli::thread_count());
}

void add_max_shard_size(CLI::App* cmd, uint64_t* bytes) {
  cmd->add_option("--max-shard-size", *bytes,
                  "write shards of at most this much data, as llama.cpp's gguf-split names them (e.g. 50GB, 500MB)")
      ->transform(CLI::AsSizeValue(true));
}

void add_critical(CLI::App* cmd, std::string* critical) {
  cmd->add_option("--critical", *critical,
                  "split models: how many of each token's experts (largest weights first) add their CPU residual; "
                  "0 = W^Q only, 'all' (or any count above the experts per token) = every expert");
}

void add_link(CLI::App* cmd, cli::DeviceOptions* d) {
  cmd->add_option("--link-gbs", d->link_gb_s, "emulated: host-device bandwidth in GB/s (0: unthrottled)")
      ->check(cli::in_range(0, 1e4, "GB/s"));
  cmd->add_option("--link-latency-us", d->link_latency_us, "emulated: latency per copy in microseconds")
      ->check(cli::in_range(0, 1e6, "us"));
}

// llama_flags: also take llama.cpp's offload flags (not bench, whose --policies decide the policy of each run).
void add_device(CLI::App* cmd, cli::DeviceOptions* d, bool llama_flags = true) {
  cmd->add_option("--device", d->kind,
                  "where the pass and the experts that fit run: cpu, emulated (a GPU stand-in), cuda, auto")
      ->capture_default_str();
  cmd->add_option("--device-memory", d->memory_gb, "device memory for experts, GB (emulated default: 24)")
      ->check(cli::in_range(0, 1e5, "GB"));
  add_link(cmd, d);
  cmd->add_option("--move-rows", d->move_rows, "copy a non-resident expert to the device for a step of this many rows")
      ->capture_default_str()
      ->check(cli::at_least(0, "rows"));
  cmd->add_option("--move-slots", d->move_slots,
                  "device slots (one expert each) that moved and prefetched experts go through in turn")
      ->capture_default_str()
      ->check(cli::in_range(0, 4096, "slots"));
  cmd->add_option("--admissions", d->admissions,
                  "crossover, split: experts admitted to the device per step by routing frequency (0: keep the "
                  "placement at load)")
      ->capture_default_str()
      ->check(cli::at_least(0, "experts"));
  cmd->add_option("--prefetch", d->prefetch,
                  "crossover, split: next-layer experts copied in per step while the link is idle (at most half "
                  "the move slots)")
      ->capture_default_str()
      ->check(cli::at_least(0, "experts"));
  cmd->add_option(
      "--policy", d->policy,
      "offload policy for routed experts: " + sched::policy_list() +
          " (default: crossover with a device, cpu without; a device policy with --device cpu is an error)");
  cmd->add_option("--profile", d->profile,
                  "machine profile for the crossover (hetmoe calibrate's, or a hetmoe-hw/1 file); "
                  "without one, --move-rows is the threshold");
  cmd->add_option("--warm-trace", d->warm_trace, "routing trace whose hottest experts go to the device first");
  cmd->add_flag("--host-pass", d->host_pass,
                "keep norms, attention and the KV cache on the CPU (only FFN weights go to the device)");
  if (!llama_flags) return;
  // llama.cpp's offload flags, read as hetmoe's settings once the command line is parsed.
  auto llama = std::make_shared<cli::LlamaOffload>();
  cli::add_llama_offload(cmd, llama.get());
  cmd->callback([llama, d] {
    for (std::string& line : cli::apply_llama_offload(*llama, *d)) cli::flag_notes().push_back(std::move(line));
  });
}

void add_sampling(CLI::App* cmd, engine::SamplingParams* p) {
  cmd->add_option("--temp", p->temperature, "temperature (0: greedy)")->check(cli::in_range(0, 100));
  cmd->add_option("--top-k", p->top_k, "keep the k most likely tokens (0: off)")->check(cli::at_least(0, "tokens"));
  cmd->add_option("--top-p", p->top_p, "keep the smallest set with this probability mass (1: off)")
      ->check(cli::in_range(0, 1));
  cmd->add_option("--min-p", p->min_p, "drop tokens below this fraction of the best one's probability (0: off)")
      ->check(cli::in_range(0, 1));
  cmd->add_option("--repeat-penalty", p->repeat_penalty, "divide repeated tokens' logits by this (1: off)")
      ->check(cli::in_range(0.01, 100));
  cmd->add_option("--presence-penalty", p->presence_penalty, "subtract for tokens already present (0: off)")
      ->check(cli::in_range(-2, 2));
  cmd->add_option("--frequency-penalty", p->frequency_penalty, "subtract per occurrence (0: off)")
      ->check(cli::in_range(-2, 2));
  cmd->add_option("--repeat-last-n", p->penalty_last_n, "tokens the penalties look back on (-1: all)")
      ->check(cli::at_least(-1, "tokens"));
  cmd->add_option("--seed", p->seed, "sampling seed");
}

void add_draft(CLI::App* cmd, cli::DraftOptions* d) {
  cmd->add_option("--draft", d->source,
                  "speculative decoding: where drafts come from (none; ngram: the context's own n-grams; mtp: the "
                  "model's multi-token-prediction block, in DeepSeek-V3/V3.2, GLM-4.5 and Qwen3.5 files)")
      ->check(CLI::IsMember({"none", "ngram", "mtp"}))
      ->capture_default_str();
  cmd->add_option("--draft-max", d->max, "tokens drafted per step at most")
      ->check(cli::in_range(1, 64, "tokens"))
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  io::install_signal_cleanup();
  CLI::App app{"hetmoe: DeepSeek-class MoE models from GGUF files on a CPU workstation, with or without a GPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hetmoe 0.1");

  cli::InspectOptions inspect;
  CLI::App* c_inspect = app.add_subcommand("inspect", "architecture, hyperparameters and tensor table of a model");
  c_inspect->add_option("-m,--model", inspect.model, "GGUF file")->required();
  c_inspect->add_flag("--metadata", inspect.all_metadata, "also list every metadata key");

  SplitOptions split;
  bool split_report = false;
  CLI::App* c_split = app.add_subcommand(
      "split",
      "write a model whose routed experts are a low-bit GPU part (W^Q) plus a CPU residual (W^R), or W^Q next "
      "to the source experts");
  c_split->add_option("-m,--model", split.model, "GGUF file to split")->required();
  c_split->add_option("-o,--out", split.out, "split GGUF to write")->required();
  c_split->add_option("--gpu-bits", split.gpu_bits, "bits per value of W^Q (2, 3 or 4)")
      ->capture_default_str()
      ->check(CLI::IsMember({2, 3, 4}));
  c_split->add_option("--group", split.group, "values per scale and offset of W^Q (64 or 128)")
      ->capture_default_str()
      ->check(CLI::IsMember({64, 128}));
  c_split->add_option("--residual-bits", split.residual_bits, "bits of W^R (2, 3, 4, 5, 6 or 8; K-quant or Q8_0)")
      ->capture_default_str()
      ->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  std::map<std::string, model::CriticalFrom> critical_from_names{{"residual", model::CriticalFrom::kResidual},
                                                                 {"source", model::CriticalFrom::kSource}};
  c_split
      ->add_option("--critical-from", split.critical_from,
                   "what the CPU computes a token's critical experts from: a residual W^R added to W^Q (residual), "
                   "or the source expert itself, kept in the file as it is (source: exact, no W^R)")
      ->transform(CLI::CheckedTransformer(critical_from_names))
      ->default_str("residual");
  c_split->add_flag("--report", split_report, "print each tensor's relative error of W^Q and of W^Q + W^R");
  add_max_shard_size(c_split, &split.max_shard_bytes);
  add_threads(c_split, &split.threads);

  cli::SimulateOptions simulate;
  CLI::App* c_simulate =
      app.add_subcommand("simulate", "predict the policies' speed and memory for a model on a hardware profile");
  c_simulate->add_option("--hw", simulate.hw, "hardware profile (hetmoe-hw/1) or a calibrate profile")->required();
  CLI::Option* o_sim_preset =
      c_simulate->add_option("--model-config", simulate.model_config, "a make-model preset (deepseek-v3, ...)")
          ->capture_default_str();
  c_simulate->add_option("-m,--model", simulate.model, "or a GGUF file: its sizes instead of a preset's")
      ->excludes(o_sim_preset);
  c_simulate->add_option("--type", simulate.type, "its file type")->capture_default_str();
  c_simulate->add_option("--layers", simulate.layers, "blocks (default: the real model's depth)")
      ->check(cli::in_range(1, 1e4, "blocks"));
  c_simulate->add_option("--policies", simulate.policies, sched::policy_list())->delimiter(',');
  c_simulate->add_option("--prompt", simulate.prompt, "prompt tokens")
      ->check(cli::in_range(1, 1e7, "tokens"))
      ->capture_default_str();
  c_simulate->add_option("--gen", simulate.gen, "generated tokens")
      ->check(cli::in_range(0, 1e7, "tokens"))
      ->capture_default_str();
  c_simulate->add_option("--isa", simulate.isa, "the CPU tier of the profile (default: its best)");
  c_simulate->add_option("--zipf", simulate.zipf, "synthetic routing's skew s (0: uniform)")
      ->capture_default_str()
      ->check(cli::in_range(0, 100));
  c_simulate->add_option("--trace", simulate.trace, "replay this routing trace (hetmoe run --trace-routing)");
  c_simulate->add_option("--kt-experts", simulate.kt_experts, "kt: routed experts on the device (-1: all that fit)")
      ->capture_default_str()
      ->check(cli::at_least(-1, "experts"));
  c_simulate
      ->add_option("--kt-prefill-tokens", simulate.kt_prefill_tokens,
                   "kt: prompts of this many tokens move their experts to the device")
      ->capture_default_str()
      ->check(cli::at_least(0, "tokens"));
  c_simulate
      ->add_option("--prefetch", simulate.prefetch,
                   "crossover, split: next-layer experts prefetched per step while the link is idle")
      ->check(cli::at_least(0, "experts"))
      ->capture_default_str();
  c_simulate
      ->add_option("--move-slots", simulate.move_slots,
                   "crossover, split: device slots moved and prefetched experts go through (taken from the "
                   "experts' memory)")
      ->check(cli::in_range(0, 4096, "slots"))
      ->capture_default_str();
  c_simulate
      ->add_option("--admissions", simulate.admissions,
                   "crossover, split: experts the residency may admit per layer step (0: the placement stays)")
      ->check(cli::at_least(0, "experts"))
      ->capture_default_str();
  c_simulate->add_option("--critical", simulate.critical, "split: residuals per token")
      ->capture_default_str()
      ->check(cli::at_least(0, "experts"));
  c_simulate->add_option("--gpu-bits", simulate.gpu_bits, "split: W^Q bits")
      ->capture_default_str()
      ->check(CLI::IsMember({2, 3, 4}));
  c_simulate->add_option("--residual-bits", simulate.residual_bits, "split: W^R bits")
      ->capture_default_str()
      ->check(CLI::IsMember({2, 3, 4, 5, 6, 8}));
  c_simulate
      ->add_option(
          "--critical-from", simulate.critical_from,
          "split: a resident expert's critical rows add its residual W^R on the CPU (residual), or the CPU runs "
          "them on the source expert instead of the device's W^Q (source: no W^R, DRAM = the source file, "
          "and an expert the device lacks runs from the source too)")
      ->capture_default_str()
      ->check(CLI::IsMember({"residual", "source"}));
  c_simulate
      ->add_option("--experts-per-token", simulate.experts_per_token,
                   "route this many experts per token instead of the model's own count (as KTransformers' runs with "
                   "fewer experts)")
      ->check(cli::at_least(1, "experts"));
  c_simulate->add_option("--seed", simulate.seed, "synthetic routing's seed")->capture_default_str();
  c_simulate->add_option("--json", simulate.json, "also write the predictions here");
  c_simulate->add_option("--svg", simulate.svg, "and draw them with the crossover curves (SVG)");

  cli::TuneOptions tune;
  CLI::App* c_tune = app.add_subcommand(
      "tune",
      "sweep the policies and their settings in the simulator: the best few for a machine, with their commands");
  c_tune->add_option("--hw", tune.hw, "hardware profile (hetmoe-hw/1) or a calibrate profile")->required();
  CLI::Option* o_tune_model = c_tune->add_option("-m,--model", tune.model, "GGUF file");
  c_tune->add_option("--model-config", tune.model_config, "or a make-model preset (deepseek-v3, qwen3-235b, ...)")
      ->excludes(o_tune_model);
  c_tune->add_option("--type", tune.type, "the preset's file type")->capture_default_str();
  c_tune->add_option("--prompt", tune.prompt, "prompt tokens")
      ->check(cli::in_range(1, 1e7, "tokens"))
      ->capture_default_str();
  c_tune->add_option("--gen", tune.gen, "generated tokens")
      ->check(cli::in_range(1, 1e7, "tokens"))
      ->capture_default_str();
  c_tune->add_option("--zipf", tune.zipf, "synthetic routing's skew s (0: uniform)")
      ->capture_default_str()
      ->check(cli::in_range(0, 100));
  c_tune->add_option("--trace", tune.trace, "replay this routing trace (hetmoe run --trace-routing)");
  c_tune->add_option("--objective", tune.objective, "rank by decode, prefill or ttft")
      ->capture_default_str()
      ->check(CLI::IsMember({"decode", "prefill", "ttft"}));
  c_tune->add_option("--top", tune.top, "settings to print")->capture_default_str()->check(cli::in_range(1, 1000));
  c_tune->add_flag("--exact", tune.exact, "only settings whose output is the source model's (no approximate split)");
  c_tune
      ->add_option("--min-critical", tune.min_critical,
                   "split: at least this many critical experts per token (above the model's experts per token: all)")
      ->check(cli::at_least(0, "experts"));
  c_tune->add_option("--max-dram-gb", tune.max_dram_gb, "DRAM the model may use (default: the profile's capacity)")
      ->check(cli::in_range(0, 1e6, "GB"));
  c_tune->add_option("--seed", tune.seed, "seed of the synthetic routing")->capture_default_str();
  c_tune->add_option("--json", tune.json, "also write every setting's prediction as JSON");
  c_tune->add_flag("--verify", tune.verify,
                   "with -m: bench the printed settings on this machine (split files go to a temporary folder) and "
                   "print predicted against measured");
  c_tune->add_option("--verify-repeat", tune.verify_repeat, "--verify: measured runs per setting (the median)")
      ->capture_default_str()
      ->check(cli::in_range(1, 100, "runs"));
  add_threads(c_tune, &tune.threads);

  cli::KlOptions kl;
  std::string kl_tokens;
  CLI::App* c_kl = app.add_subcommand("kl", "KL divergence of a model's next-token distributions from a base model's");
  c_kl->add_option("--base", kl.base, "reference GGUF file")->required();
  c_kl->add_option("-m,--model", kl.model, "GGUF file to compare (a split model, say)")->required();
  c_kl->add_option("--critical", kl.critical, "split model: --critical settings to compare, e.g. 0,1,2,4,all")
      ->delimiter(',');
  CLI::Option* o_kl_prompt = c_kl->add_option("-p,--prompt", kl.prompt, "text to evaluate");
  c_kl->add_option("--tokens", kl_tokens, "token ids to evaluate")->excludes(o_kl_prompt);
  c_kl->add_option("--n-tokens", kl.n_tokens, "without a prompt: this many pseudo-random ids")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c_kl->add_option("--seed", kl.seed, "seed of the pseudo-random ids")->capture_default_str();
  add_threads(c_kl, &kl.threads);
  add_device(c_kl, &kl.device);

  cli::LogitsOptions logits;
  std::string logits_tokens;
  CLI::App* c_logits = app.add_subcommand("logits", "run token ids as one batch, write float32 logits [n][vocab]");
  c_logits->add_option("-m,--model", logits.model, "GGUF file")->required();
  c_logits->add_option("--tokens", logits_tokens, "token ids, e.g. 3,17,42")->required();
  c_logits->add_option("--out", logits.out, "output file (float32 little-endian, row-major)")->required();
  add_threads(c_logits, &logits.threads);
  add_critical(c_logits, &logits.critical);
  add_device(c_logits, &logits.device);

  cli::RunOptions run;
  std::string run_tokens;
  CLI::App* c_run = app.add_subcommand("run", "generate a continuation of a prompt (text or token ids)");
  c_run->add_option("-m,--model", run.model, "GGUF file")->required();
  CLI::Option* o_prompt = c_run->add_option("-p,--prompt", run.prompt, "prompt text");
  CLI::Option* o_tokens = c_run->add_option("--tokens", run_tokens, "prompt token ids, e.g. 3,17,42");
  o_prompt->excludes(o_tokens);
  c_run->add_option("-n,--n-predict,--max-tokens", run.n_predict, "tokens to generate")
      ->check(cli::in_range(0, 1e9, "tokens"));
  add_sampling(c_run, &run.sampling);
  c_run->add_flag("--ignore-eos", run.ignore_eos, "do not stop at the end-of-generation token");
  c_run->add_option("-c,--ctx-size", run.ctx_size, "context size (default: prompt + n)")
      ->check(cli::in_range(0, 1e9, "tokens"));
  c_run->add_flag("--print-ids", run.print_ids, "print only the generated ids on stdout");
  c_run->add_option("--trace-routing", run.trace_routing,
                    "write the experts every MoE layer chose for every token to this file (JSON lines)");
  add_draft(c_run, &run.draft);
  add_threads(c_run, &run.threads);
  add_critical(c_run, &run.critical);
  add_device(c_run, &run.device);

  cli::ChatOptions chat;
  CLI::App* c_chat = app.add_subcommand("chat", "interactive chat (one message per line when stdin is not a terminal)");
  c_chat->add_option("-m,--model", chat.model, "GGUF file")->required();
  c_chat->add_option("--system", chat.system, "system message");
  c_chat->add_option("--chat-template", chat.chat_template, "override the template found in the file");
  add_sampling(c_chat, &chat.sampling);
  c_chat->add_option("-n,--n-predict,--max-tokens", chat.max_tokens, "tokens per reply at most (-1: no limit)")
      ->check(cli::in_range(-1, 1e9, "tokens"));
  c_chat->add_option("-c,--ctx-size", chat.ctx_size, "context size (default: min(4096, the model's))")
      ->check(cli::in_range(0, 1e9, "tokens"));
  c_chat->add_flag("--hide-think", chat.hide_think, "hide a reasoning model's <think> block instead of dimming it");
  c_chat->add_flag("!--no-think", chat.enable_thinking, "ask Qwen3 or GLM-4.5 not to think (enable_thinking = false)");
  add_draft(c_chat, &chat.draft);
  add_threads(c_chat, &chat.threads);
  add_critical(c_chat, &chat.critical);
  add_device(c_chat, &chat.device);

  cli::ServeOptions serve;
  CLI::App* c_serve = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server: several requests decoded together (continuous batching)");
  c_serve->add_option("-m,--model", serve.model, "GGUF file")->required();
  c_serve->add_option("--host", serve.host, "address to listen on (default 127.0.0.1: this machine only)");
  c_serve->add_option("--port", serve.port, "TCP port (0: any free one)")->check(cli::in_range(0, 65535, "port"));
  c_serve->add_option("-P,--parallel,--np", serve.parallel, "slots: requests decoded together (default 4)")
      ->check(cli::in_range(1, 256, "slots"));
  c_serve
      ->add_option("-c,--ctx-size", serve.ctx_size,
                   "context of all slots together, split evenly (default: min(4096, the model's) per slot)")
      ->check(cli::in_range(0, 1e9, "tokens"));
  c_serve->add_option("-b,--batch-size", serve.batch_size, "tokens per forward pass at most (default 512)")
      ->check(cli::in_range(1, 1e6, "tokens"));
  c_serve->add_option("--max-queue", serve.max_queue, "requests waiting for a slot before 503 (default 64)")
      ->check(cli::in_range(0, 1e6, "requests"));
  c_serve->add_option("-n,--n-predict", serve.max_tokens, "default max_tokens of a request (-1: no limit)")
      ->check(cli::in_range(-1, 1e9, "tokens"));
  c_serve->add_option("--api-key", serve.api_key, "require this key (Authorization: Bearer KEY)");
  c_serve->add_option("-a,--alias", serve.alias, "the model's name in the API (default: the file name)");
  c_serve->add_option("--chat-template", serve.chat_template, "override the template found in the file");
  c_serve->add_option("--max-body-mb", serve.max_body_mb, "larger request bodies get 413 (default 8)")
      ->check(cli::in_range(0.001, 1024, "MB"));
  c_serve
      ->add_option("--shutdown-grace", serve.shutdown_grace,
                   "seconds requests in flight get to finish after SIGTERM (default 30)")
      ->check(cli::in_range(0, 86400, "seconds"));
  add_sampling(c_serve, &serve.sampling);
  add_draft(c_serve, &serve.draft);
  add_threads(c_serve, &serve.threads);
  add_critical(c_serve, &serve.critical);
  add_device(c_serve, &serve.device);

  cli::TokenizeOptions tokenize;
  CLI::App* c_tokenize = app.add_subcommand("tokenize", "print the token ids of a text file's exact bytes");
  c_tokenize->add_option("-m,--model", tokenize.model, "GGUF file (a vocab-only one will do)")->required();
  c_tokenize->add_option("-f,--file", tokenize.file, "text file")->required();
  c_tokenize->add_flag("--no-bos", tokenize.no_bos, "do not add the BOS token the model asks for");

  cli::BenchOptions bench;
  CLI::App* c_bench = app.add_subcommand(
      "bench",
      "offload policies side by side: prefill and decode speed, time to first token, bytes moved, DRAM roofline");
  c_bench->add_option("-m,--model", bench.model, "GGUF file")->required();
  c_bench->add_option("--policies", bench.policies, "offload policies to compare: " + sched::policy_list())
      ->delimiter(',');
  c_bench->add_option("--prompt", bench.prompt, "prefill tokens")->check(cli::in_range(1, 1e6, "tokens"));
  c_bench->add_option("--gen", bench.gen, "decoded tokens")->check(cli::in_range(1, 1e6, "tokens"));
  c_bench
      ->add_option("--depth", bench.depth,
                   "tokens already in the context, evaluated before the timed prompt and not timed (llama-bench's "
                   "-d): prefill and decode speed at that depth")
      ->check(cli::in_range(0, 1e6, "tokens"));
  c_bench->add_option("--json", bench.json, "also write the results as JSON");
  c_bench->add_option("--svg", bench.svg, "draw the policies and --profile's crossover curves (SVG)");
  c_bench->add_option("--synthetic", bench.synthetic,
                      "zipf:S: replace the routing by Zipf-skewed routing (exponent S) to compare policies on a skew");
  c_bench->add_option("--trace", bench.trace,
                      "replay this routing trace (hetmoe run --trace-routing) instead of the model's routing; its "
                      "counts place the experts");
  c_bench
      ->add_option("--concurrency", bench.concurrency,
                   "levels of streams decoded together (e.g. 1,4,8): aggregate and per-stream decode, TTFT, CPU "
                   "expert bytes and moves per token")
      ->delimiter(',')
      ->check(cli::in_range(1, 256, "streams"));
  c_bench->add_option("--repeat", bench.repeat, "measured runs per policy after a warm-up (median and spread)")
      ->check(cli::in_range(1, 1000, "runs"));
  add_draft(c_bench, &bench.draft);
  c_bench->add_option("--vs-llama-bench", bench.vs_llama_bench,
                      "llama.cpp's llama-bench binary: run it on the same file and threads, alternating with hetmoe's "
                      "runs, and print both side by side (CPU)");
  c_bench->add_option("--draft-text", bench.draft_text,
                      "with --draft: a text file, a prompt and its reply split at a line '===': the drafts' acceptance "
                      "on the reply (replayed) and the speedup it implies");
  add_threads(c_bench, &bench.threads);
  add_critical(c_bench, &bench.critical);
  add_device(c_bench, &bench.device, /*llama_flags=*/false);

  cli::CalibrateOptions calibrate;
  CLI::App* c_calibrate =
      app.add_subcommand("calibrate", "measure DRAM bandwidth and expert FFN time per ISA; write a JSON profile");
  c_calibrate->add_option("-m,--model", calibrate.model, "GGUF file whose first MoE layer's expert is timed")
      ->required();
  c_calibrate->add_option("-o,--out", calibrate.out, "profile file");
  c_calibrate->add_option("--max-rows", calibrate.max_rows, "largest row count timed")
      ->check(cli::in_range(1, 65536, "rows"));
  add_threads(c_calibrate, &calibrate.threads);
  c_calibrate
      ->add_option("--device", calibrate.device.kind,
                   "also measure this device's link and expert time: "
                   "emulated, cuda, auto")
      ->capture_default_str();
  add_link(c_calibrate, &calibrate.device);
  c_calibrate->add_option("--hw", calibrate.hw,
                          "or take the link and GPU of this hardware profile (hetmoe-hw/1) for the crossovers");

  MakeModelOptions make;
  CLI::App* c_make = app.add_subcommand("make-model", "write a random-weight GGUF model of a real layout");
  c_make->add_option("--preset", make.preset, "model layout")->required()->check(CLI::IsMember(preset_names()));
  c_make->add_option("-o,--out", make.out_path, "output GGUF file")->required();
  c_make->add_option("--type", make.type, "file type")->check(CLI::IsMember(file_type_names()));
  c_make->add_option("--layers", make.layers, "number of blocks (default: the preset's)")
      ->check(cli::in_range(1, 1e5, "blocks"));
  c_make->add_option("--seed", make.seed, "weight seed");
  c_make->add_flag("--mtp", make.mtp,
                   "add an MTP block after the trunk (deepseek2, deepseek32, glm4moe presets), for --draft mtp");
  add_max_shard_size(c_make, &make.max_shard_bytes);
  int make_threads = 0;
  add_threads(c_make, &make_threads);

  try {
    app.name("hetmoe");
    std::vector<std::string> args = cli::rename_llama_flags(argc, argv);
    std::reverse(args.begin(), args.end());
    if (!args.empty()) args.pop_back();  // the program's name (App::parse of a vector wants it gone, reversed)
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "hetmoe: error: {} (see hetmoe --help)\n", e.what());
    return 2;
  } catch (const Error& e) {  // a command's flags that contradict each other
    fmt::print(stderr, "hetmoe: error: {}\n", e.what());
    return 2;
  }

  try {
    if (c_inspect->parsed()) return cli::inspect(inspect);
    if (c_split->parsed()) return cli::split(split, split_report);
    if (c_kl->parsed()) {
      if (!kl_tokens.empty()) kl.tokens = cli::parse_token_list(kl_tokens);
      if (kl.critical.empty()) kl.critical.push_back("");
      return cli::kl(kl);
    }
    if (c_logits->parsed()) {
      logits.tokens = cli::parse_token_list(logits_tokens);
      return cli::logits(logits);
    }
    if (c_run->parsed()) {
      if (!run_tokens.empty()) run.tokens = cli::parse_token_list(run_tokens);
      if (run.tokens.empty() && run.prompt.empty()) fail("run needs a prompt: -p TEXT or --tokens IDS");
      return cli::run(run);
    }
    if (c_chat->parsed()) return cli::chat(chat);
    if (c_serve->parsed()) return cli::serve(serve);
    if (c_bench->parsed()) return cli::bench(bench);
    if (c_calibrate->parsed()) return cli::calibrate(calibrate);
    if (c_simulate->parsed()) return cli::simulate(simulate);
    if (c_tune->parsed()) {
      if (tune.model.empty() && tune.model_config.empty())
        throw Error("tune: give a model (-m FILE or --model-config NAME)");
      if (tune.verify && tune.model.empty())
        throw Error("tune --verify: give the model file (-m FILE); a preset has no weights to run");
      return cli::tune(tune);
    }
    if (c_tokenize->parsed()) return cli::tokenize(tokenize);
    if (c_make->parsed()) {
      make.threads = cli::resolve_threads(make_threads);
      make_model(make, [](const std::string& line) {
        fmt::print(stderr, "{}\n", line);
        std::fflush(stderr);
      });
      return 0;
    }
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "hetmoe: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "hetmoe: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
