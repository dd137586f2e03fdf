#!/usr/bin/env bash
# Fuzzes the multi-file GGUF reader (sharded sets) with libFuzzer on one core.
#
#   scripts/fuzz_shards.sh [SECONDS]        (default 300)
#
# Builds fuzz_gguf_shards with clang, ASan and UBSan in build-fuzz, seeds it with small shard sets the writer
# makes, and runs. New inputs are kept in build-fuzz/shards-corpus across runs; a crashing input is saved under
# build-fuzz/shards-crashes and ends the run non-zero. HETMOE_FUZZ_JOBS sets the build's parallelism.
set -euo pipefail

seconds=${1:-300}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build-fuzz

# shellcheck source=scripts/fuzz_common.sh
source "$root/scripts/fuzz_common.sh"
fuzz_build "$build" fuzz_gguf_shards gguf_fuzz_seeds
fuzz_dirs "$build" shards-
"$build/tests/fuzz/gguf_fuzz_seeds" --shards "$seeds"
echo "fuzz_shards.sh: $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) inputs already in the corpus"

fuzz_run fuzz_shards.sh "$build/tests/fuzz/fuzz_gguf_shards" 65536 "$seconds" 2048 "$build/fuzz_shards.log"
