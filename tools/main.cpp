// The hetmoe command line. Every failure ends as one line on stderr and a non-zero exit status.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "runtime/error.h"
#include "tools/commands.h"
#include "tools/make_model.h"

namespace {

using namespace hetmoe;

void add_threads(CLI::App* cmd, int* threads) {
  cmd->add_option("-t,--threads", *threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hetmoe: DeepSeek-class MoE models from GGUF files on a CPU (+ GPU) workstation"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hetmoe 0.1");

  cli::InspectOptions inspect;
  CLI::App* c_inspect = app.add_subcommand("inspect", "architecture, hyperparameters and tensor table of a model");
  c_inspect->add_option("-m,--model", inspect.model, "GGUF file")->required();
  c_inspect->add_flag("--metadata", inspect.all_metadata, "also list every metadata key");
  int inspect_threads = 0;
  add_threads(c_inspect, &inspect_threads);

  cli::LogitsOptions logits;
  std::string logits_tokens;
  CLI::App* c_logits = app.add_subcommand("logits", "run token ids as one batch, write float32 logits [n][vocab]");
  c_logits->add_option("-m,--model", logits.model, "GGUF file")->required();
  c_logits->add_option("--tokens", logits_tokens, "token ids, e.g. 3,17,42")->required();
  c_logits->add_option("--out", logits.out, "output file (float32 little-endian, row-major)")->required();
  add_threads(c_logits, &logits.threads);

  cli::RunOptions run;
  std::string run_tokens;
  CLI::App* c_run = app.add_subcommand("run", "generate a continuation of token ids through the KV cache");
  c_run->add_option("-m,--model", run.model, "GGUF file")->required();
  c_run->add_option("--tokens", run_tokens, "prompt token ids, e.g. 3,17,42")->required();
  c_run->add_option("-n,--n-predict", run.n_predict, "tokens to generate")->check(CLI::NonNegativeNumber);
  c_run->add_option("--temp", run.temperature, "sampling temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  c_run->add_option("--seed", run.seed, "sampling seed");
  c_run->add_option("-c,--ctx-size", run.ctx_size, "context size (default: prompt + n)")->check(CLI::NonNegativeNumber);
  c_run->add_flag("--print-ids", run.print_ids, "print only the generated ids on stdout");
  add_threads(c_run, &run.threads);

  MakeModelOptions make;
  CLI::App* c_make = app.add_subcommand("make-model", "write a random-weight GGUF model of a real layout");
  c_make->add_option("--preset", make.preset, "model layout")->required()->check(CLI::IsMember(preset_names()));
  c_make->add_option("-o,--out", make.out_path, "output GGUF file")->required();
  c_make->add_option("--type", make.type, "file type")->check(CLI::IsMember(file_type_names()));
  c_make->add_option("--layers", make.layers, "number of blocks (default: the preset's)");
  c_make->add_option("--seed", make.seed, "weight seed");
  int make_threads = 0;
  add_threads(c_make, &make_threads);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "hetmoe: error: {} (see hetmoe --help)\n", e.what());
    return 2;
  }

  try {
    if (c_inspect->parsed()) return cli::inspect(inspect);
    if (c_logits->parsed()) {
      logits.tokens = cli::parse_token_list(logits_tokens);
      return cli::logits(logits);
    }
    if (c_run->parsed()) {
      run.tokens = cli::parse_token_list(run_tokens);
      return cli::run(run);
    }
    if (c_make->parsed()) {
      make.threads = cli::resolve_threads(make_threads);
      make_model(make, stderr);
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
