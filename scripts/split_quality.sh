#!/usr/bin/env bash
# The KL table of README "Split experts": every reference model split with W^Q of --gpu-bits (default 2) and a
# 4-bit residual, compared with the unsplit model at --critical 0 (W^Q alone), 1, 2, 4 and all.
# Usage: scripts/split_quality.sh [BUILD_DIR] [GPU_BITS]   (reads ../shared/ref/models and tests/data/models)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bits=${2:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
models=()
for m in ../shared/ref/models/tiny-*.gguf; do [ -e "$m" ] && models+=("$m"); done
[ ${#models[@]} -gt 0 ] || models=(tests/data/models/tiny-*.gguf)
for m in "${models[@]}"; do
  name=$(basename "$m" .gguf)
  "$build/tools/hetmoe" split -m "$m" -o "$out/$name.split.gguf" --gpu-bits "$bits" --residual-bits 4 -t 2 \
    --report 2>/dev/null | awk -v n="$name" '$1 == "mean" { printf "%s: mean relative error W^Q %s, W^Q+W^R %s\n", n, $2, $3 }'
  "$build/tools/hetmoe" kl --base "$m" -m "$out/$name.split.gguf" --critical 0,1,2,4,all -t 2 | tail -n 5
  rm -f "$out/$name.split.gguf"
done
