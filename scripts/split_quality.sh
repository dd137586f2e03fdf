#!/usr/bin/env bash
# The KL tables of docs/split.md: every reference model split with W^Q of --gpu-bits (default 2), compared with the
# unsplit model at --critical 0 (W^Q alone), 1, 2, 4 and all.
#   residual (default): a 4-bit residual W^R, run on the CPU (W^Q's products there too);
#   source: the source experts kept for the critical items, run with W^Q on the emulated device (on the CPU alone a
#           source split runs every expert from the source, which is the source model exactly).
# Usage: scripts/split_quality.sh [BUILD_DIR] [GPU_BITS] [residual|source]
#   (reads ../shared/ref/models, else tests/data/models)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bits=${2:-2}
variant=${3:-residual}
case "$variant" in
  residual) split_flags=(--residual-bits 4); kl_flags=(--device cpu) ;;
  source) split_flags=(--critical-from source); kl_flags=(--device emulated) ;;
  *) echo "split_quality.sh: the variant is residual or source, not $variant" >&2; exit 2 ;;
esac
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
models=()
for m in ../shared/ref/models/tiny-*.gguf; do [ -e "$m" ] && models+=("$m"); done
[ ${#models[@]} -gt 0 ] || models=(tests/data/models/tiny-*.gguf)
for m in "${models[@]}"; do
  name=$(basename "$m" .gguf)
  "$build/tools/hetmoe" split -m "$m" -o "$out/$name.split.gguf" --gpu-bits "$bits" "${split_flags[@]}" -t 2 \
    --report 2>/dev/null | awk -v n="$name" '$1 == "mean" { printf "%s: mean relative error W^Q %s, critical %s\n", n, $2, $3 }' || continue
  [ -e "$out/$name.split.gguf" ] || continue
  "$build/tools/hetmoe" kl --base "$m" -m "$out/$name.split.gguf" --critical 0,1,2,4,all -t 2 "${kl_flags[@]}" | tail -n 5
  rm -f "$out/$name.split.gguf"
done
