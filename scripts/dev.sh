#!/usr/bin/env bash
# hetmoe's two entry points. Both install the Debian packages they need first (scripts/deps.sh).
#
#   scripts/dev.sh demo   build hetmoe, generate a tiny DeepSeek-V3-architecture model, inspect it, generate tokens
#   scripts/dev.sh test   build everything, run the whole test suite, check format and naming, then the unit and
#                         conformance tests again under ASan + UBSan
#
# Build folders: build/ (RelWithDebInfo) and build-asan/. Generated models go to out/.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

configure() {  # dir, extra cmake args...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
}

# GPU tests carry the ctest label `gpu` and run only where a GPU answers.
ctest_filter() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo ""
  else
    echo "-LE gpu"
  fi
}

demo() {
  # Builds only the hetmoe target, but leaves the tests configured: switching them off here left ctest running the
  # stale test binaries of an earlier build.
  configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHETMOE_TESTS=ON
  ninja -C build -j "$JOBS" hetmoe
  mkdir -p out
  local model=out/tiny-deepseek-v3-Q4_K_M.gguf
  ./build/tools/hetmoe make-model --preset tiny-deepseek-v3 --type Q4_K_M --seed 1 -o "$model"
  ./build/tools/hetmoe inspect -m "$model"
  echo
  echo "generating 16 tokens after the prompt 3,17,42,100,7 (greedy):"
  ./build/tools/hetmoe run -m "$model" --tokens 3,17,42,100,7 -n 16 --temp 0
}

# STYLE.md rule 11: the formatting and the naming rules are checked, not hoped for.
lint() {
  git ls-files '*.cpp' '*.h' '*.inc' '*.cu' | xargs clang-format --dry-run -Werror
  git ls-files 'quant/*.cpp' 'cpu_kernels/*.cpp' 'runtime/*.cpp' 'tools/*.cpp' |
    xargs -P "$JOBS" -n 4 clang-tidy -p build --quiet 2>/dev/null
}

test_all() {
  configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHETMOE_TESTS=ON
  ninja -C build -j "$JOBS"
  (cd build && ctest -j "$JOBS" --output-on-failure $(ctest_filter))
  lint

  # Second stage: the unit and conformance tests under AddressSanitizer and UndefinedBehaviorSanitizer.
  # CUDA stays out of the sanitizer build: ASan and the CUDA runtime do not share an address space layout.
  configure build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DHETMOE_SANITIZE=ON -DHETMOE_TESTS=ON \
    -DHETMOE_CUDA=OFF
  ninja -C build-asan -j "$JOBS"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest -j "$JOBS" --output-on-failure -L "unit|conformance" $(ctest_filter))

  # Third: a minute of fuzzing the GGUF reader as a smoke test (scripts/fuzz.sh runs it for longer).
  scripts/fuzz.sh 60 >build-fuzz.log 2>&1 || { tail -40 build-fuzz.log; exit 1; }
  grep -E "^(stat::number_of_executed_units|fuzz.sh: corpus)" build-fuzz.log
  # And half a minute of the multi-file reader on shard sets (scripts/fuzz_shards.sh runs it for longer).
  scripts/fuzz_shards.sh 30 >build-fuzz-shards.log 2>&1 || { tail -40 build-fuzz-shards.log; exit 1; }
  grep -E "^(stat::number_of_executed_units|fuzz_shards.sh: corpus)" build-fuzz-shards.log
}

case "${1:-}" in
  demo) scripts/deps.sh && demo ;;
  test) scripts/deps.sh && test_all ;;
  *)
    echo "usage: scripts/dev.sh demo|test" >&2
    exit 2
    ;;
esac
