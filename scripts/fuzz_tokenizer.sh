#!/usr/bin/env bash
# Fuzzes the tokenizer with libFuzzer on one core.
#
#   scripts/fuzz_tokenizer.sh [SECONDS]        (default 300)
#
# Builds fuzz_tokenizer with clang, ASan and UBSan in build-fuzz (HETMOE_FUZZ_BUILD overrides), seeds it with
# llama.cpp's tokenizer test strings, and runs. The vocabularies are the tiny models and vocab files in tests/data,
# or the GGUF files listed in HETMOE_FUZZ_VOCAB (':'-separated). New inputs are kept in <build>/tokenizer-corpus
# across runs; a crashing input is saved under <build>/tokenizer-crashes and ends the run non-zero.
# HETMOE_SHARED_REF overrides where the reference data lives; HETMOE_FUZZ_JOBS the build's parallelism.
set -euo pipefail

seconds=${1:-300}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HETMOE_FUZZ_BUILD:-$root/build-fuzz}
ref=${HETMOE_SHARED_REF:-$root/../shared/ref}
max_len=4096

# shellcheck source=scripts/fuzz_common.sh
source "$root/scripts/fuzz_common.sh"
fuzz_build "$build" fuzz_tokenizer
fuzz_dirs "$build" tokenizer-

# Seeds: each of llama.cpp's test files behind the two selector bytes the target reads first (vocabulary, flags).
n=0
for inp in "$root"/tests/data/vocab/*.inp "$ref"/vocab/*.inp; do
  [[ -f $inp ]] || continue
  for selector in '\x00\x00' '\x01\x01' '\x02\x00' '\x03\x01' '\x04\x00'; do
    { printf "$selector"; cat "$inp"; } >"$seeds/seed-$n"
    n=$((n + 1))
  done
done
echo "fuzz_tokenizer.sh: $n seeds, $(ls "$corpus" | wc -l) inputs already in the corpus"

fuzz_run fuzz_tokenizer.sh "$build/tests/fuzz/fuzz_tokenizer" "$max_len" "$seconds" 4096 "$build/fuzz_tokenizer.log"
