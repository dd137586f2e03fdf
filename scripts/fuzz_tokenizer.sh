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

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DHETMOE_FUZZ=ON >/dev/null
ninja -C "$build" -j "${HETMOE_FUZZ_JOBS:-1}" fuzz_tokenizer

corpus=$build/tokenizer-corpus
seeds=$build/tokenizer-seeds
crashes=$build/tokenizer-crashes
mkdir -p "$corpus" "$crashes"
rm -rf "$seeds"
mkdir -p "$seeds"

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

log=$build/fuzz_tokenizer.log
status=0
"$build/tests/fuzz/fuzz_tokenizer" "$corpus" "$seeds" -max_len="$max_len" -max_total_time="$seconds" \
  -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$crashes/" 2>&1 | tee "$log" ||
  status=$?

echo "fuzz_tokenizer.sh: corpus holds $(ls "$corpus" | wc -l) inputs; $(ls "$crashes" | wc -l) files in $crashes; log in $log"
exit "$status"
