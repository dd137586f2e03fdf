#!/usr/bin/env bash
# Runs one libFuzzer target on one core.
#
#   scripts/fuzz.sh TARGET [SECONDS]      fuzz for SECONDS (default 300)
#   scripts/fuzz.sh TARGET --minimize     rewrite tests/fuzz/corpus/TARGET as the smallest set of the committed and
#                                         local inputs that keeps their coverage (libFuzzer -merge=1)
#
# TARGET is gguf (the GGUF reader), gguf_shards (split sets), tokenizer, model_config (model loading from mutated
# real layouts), chat_template or openai (the server's request parsing and reply assembly); docs/fuzzing.md says what
# each checks. The target is built with clang, ASan and UBSan in build-fuzz (HETMOE_FUZZ_BUILD overrides;
# HETMOE_FUZZ_JOBS sets the build's parallelism) and runs on the committed corpus tests/fuzz/corpus/TARGET, the seeds this script makes for it, and <build>/TARGET/corpus, where new
# inputs are kept across runs. A crashing input is saved under <build>/TARGET/crashes and ends the run non-zero; the
# log is <build>/TARGET.log. HETMOE_SHARED_REF overrides where the reference data lives.
set -euo pipefail

usage() {
  echo "usage: scripts/fuzz.sh gguf|gguf_shards|tokenizer|model_config|chat_template|openai [SECONDS|--minimize]" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
target=$1
mode=${2:-300}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HETMOE_FUZZ_BUILD:-$root/build-fuzz}
ref=${HETMOE_SHARED_REF:-$root/../shared/ref}
# Without ../shared/ref the suite's own copies in tests/data serve as seeds.
[[ -d $ref/models ]] || ref=$root/tests/data

# Per target: the longest input, the memory limit, and the tools its seeds need.
# fuzz_gguf: the reference headers are about 16 KiB; 64 KiB leaves the mutator room to grow them and their data.
# fuzz_tokenizer: its cost grows with the text (four encodings and decodings of it): 1 KiB keeps it at a few hundred
# runs a second, and its failures show in short texts.
# fuzz_model_config: an input is a list of mutations, a few bytes each; loading the largest layout takes 450 MB.
case $target in
  gguf) max_len=65536 rss=2048 tools=(gguf_fuzz_seeds) ;;
  gguf_shards) max_len=65536 rss=2048 tools=(gguf_fuzz_seeds) ;;
  tokenizer) max_len=1024 rss=4096 tools=() ;;
  model_config) max_len=1024 rss=4096 tools=() ;;
  chat_template) max_len=4096 rss=2048 tools=() ;;
  openai) max_len=4096 rss=2048 tools=() ;;
  *) usage ;;
esac
binary=$build/tests/fuzz/fuzz_$target
committed=$root/tests/fuzz/corpus/$target
corpus=$build/$target/corpus
seeds=$build/$target/seeds
crashes=$build/$target/crashes
log=$build/$target.log

# Line tables only (-g1): a crash's stack names file and line, and the build takes about half the time of -g.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DHETMOE_FUZZ=ON -DHETMOE_CUDA=OFF >/dev/null
ninja -C "$build" -j "${HETMOE_FUZZ_JOBS:-1}" "fuzz_$target" "${tools[@]}"
mkdir -p "$corpus" "$crashes" "$committed"

if [[ $mode == --minimize ]]; then
  # Only inputs of at most 16 KiB go in: the large ones are grown from the reference headers, which the seeds bring
  # on every run, and the committed corpus stays small.
  pool=$(mktemp -d)
  merged=$(mktemp -d)
  trap 'rm -rf "$pool" "$merged"' EXIT
  find "$committed" "$corpus" -type f -size -16385c -exec cp {} "$pool"/ \;
  "$binary" -merge=1 -max_len="$max_len" -rss_limit_mb="$rss" -timeout=10 "$merged" "$pool" 2>&1 | tail -2
  # The inputs that found a bug (fixed-*) stay, whatever their coverage: each is a regression check.
  find "$committed" -type f ! -name 'fixed-*' -delete
  for f in "$merged"/*; do
    [[ -e $committed/fixed-crash-$(basename "$f") ]] || cp "$f" "$committed"/
  done
  echo "fuzz.sh: $committed holds $(ls "$committed" | wc -l) inputs, $(du -sh --apparent-size "$committed" | cut -f1)"
  exit 0
fi
[[ $mode =~ ^[0-9]+$ ]] || usage

# Seeds made afresh on each run, besides the committed corpus.
rm -rf "$seeds"
mkdir -p "$seeds"
case $target in
  gguf)
    # Small synthetic files, a miniature of each reference model and the first 64 KiB of each: its whole header,
    # tokenizer included, and the start of its tensor data.
    models=("$ref"/models/*.gguf)
    for model in "${models[@]}"; do head -c "$max_len" "$model" >"$seeds/head-$(basename "$model")"; done
    "$build/tests/fuzz/gguf_fuzz_seeds" "$seeds" "${models[@]}"
    ;;
  gguf_shards) "$build/tests/fuzz/gguf_fuzz_seeds" --shards "$seeds" ;;
  tokenizer)
    # llama.cpp's tokenizer test strings behind the two selector bytes the target reads first (vocabulary, flags).
    n=0
    for inp in "$root"/tests/data/vocab/*.inp "$ref"/vocab/*.inp; do
      [[ -f $inp ]] || continue
      for selector in '\x00\x00' '\x01\x01' '\x02\x00' '\x03\x01' '\x04\x00'; do
        { printf %b "$selector"; cat "$inp"; } >"$seeds/seed-$n"
        n=$((n + 1))
      done
    done
    ;;
esac
echo "fuzz.sh: $target: $(ls "$committed" | wc -l) committed inputs, $(ls "$seeds" | wc -l) seeds," \
  "$(ls "$corpus" | wc -l) inputs already in $corpus"

status=0
"$binary" "$corpus" "$seeds" "$committed" -max_len="$max_len" -max_total_time="$mode" -timeout=10 \
  -rss_limit_mb="$rss" -print_final_stats=1 -artifact_prefix="$crashes/" 2>&1 | tee "$log" || status=$?
echo "fuzz.sh: $target: corpus holds $(ls "$corpus" | wc -l) inputs; $(ls "$crashes" | wc -l) files in $crashes;" \
  "log in $log"
exit "$status"
