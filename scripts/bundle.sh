#!/usr/bin/env bash
# Packs a built tree's programs with the shared libraries they need that a machine without hetmoe's Debian -dev
# packages lacks (oneDNN, hwloc, libnuma, fmt, PCRE2, readline, cpp-httplib and what they pull in), so that a GPU
# machine with only the CUDA toolkit can run the CUDA checks without building: scripts/gpu_check.sh takes the
# unpacked folder as HETMOE_BUNDLE. glibc, the CUDA libraries and libstdc++ stay the target's own; libstdc++ and
# libgcc_s travel in lib-cxx/ for a target whose own are older than the build's.
# Usage: scripts/bundle.sh BUILD_DIR OUT.tar.xz
set -euo pipefail
build=${1:?build folder}
out=${2:?output .tar.xz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-cxx"

programs=(tools/hetmoe tools/libhetmoe_cuda.so tests/gpu/test_cuda tests/unit/cpu_kernels/test_cpu_kernels)
for p in "${programs[@]}"; do
  [ -f "$build/$p" ] || { echo "bundle: $build/$p is missing (a CUDA build with HETMOE_TESTS=ON?)" >&2; exit 1; }
  strip -o "$stage/bin/$(basename "$p")" "$build/$p"
done

# Every library the programs resolve here, but glibc's own and CUDA's.
for p in "${programs[@]}"; do ldd "$build/$p"; done | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  name=$(basename "$lib")
  case "$name" in
    libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | ld-linux*) ;;
    libcublas* | libcudart*) ;;
    libstdc++.so.* | libgcc_s.so.*) cp -L "$lib" "$stage/lib-cxx/$name" ;;
    *) cp -L "$lib" "$stage/lib/$name" ;;
  esac
done
tar -C "$stage" -cJf "$out" bin lib lib-cxx
echo "bundle: $out ($(du -h "$out" | cut -f1)): $(ls "$stage/bin" | tr '\n' ' ')+ $(ls "$stage/lib" | wc -l) libraries"
