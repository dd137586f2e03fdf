#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer on one core.
#
#   scripts/fuzz.sh [SECONDS]        (default 600)
#
# Builds fuzz_gguf with clang, ASan and UBSan in build-fuzz, writes a seed corpus to build-fuzz/seeds (small
# synthetic files, a miniature of each reference model and the first 64 KiB of each reference model: its whole
# header, tokenizer included, and the start of its tensor data), and runs. New inputs are kept in
# build-fuzz/corpus across runs; a crashing input is saved under build-fuzz/crashes and ends the run non-zero.
# HETMOE_SHARED_REF overrides where the reference data lives; HETMOE_FUZZ_JOBS the build's parallelism.
set -euo pipefail

seconds=${1:-600}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build-fuzz
ref=${HETMOE_SHARED_REF:-$root/../shared/ref}
# The reference headers are about 16 KiB; 64 KiB leaves the mutator room to grow them and their data.
max_len=65536

# shellcheck source=scripts/fuzz_common.sh
source "$root/scripts/fuzz_common.sh"
fuzz_build "$build" fuzz_gguf gguf_fuzz_seeds
fuzz_dirs "$build" ""

models=()
# Without ../shared/ref the suite's own copies in tests/data serve as seeds.
[[ -d $ref/models ]] || ref=$root/tests/data
if [[ -d $ref/models ]]; then
  for model in "$ref"/models/*.gguf; do
    models+=("$model")
    head -c "$max_len" "$model" >"$seeds/head-$(basename "$model")"
  done
else
  echo "fuzz.sh: no reference models in $ref/models; the seeds are synthetic only"
fi
"$build/tests/fuzz/gguf_fuzz_seeds" "$seeds" "${models[@]}"
echo "fuzz.sh: $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) inputs already in the corpus"

fuzz_run fuzz.sh "$build/tests/fuzz/fuzz_gguf" "$max_len" "$seconds" 2048 "$build/fuzz.log"
