#!/usr/bin/env bash
# hetmoe's two entry points. Both install the Debian packages they need first (scripts/deps.sh).
#
#   scripts/dev.sh demo   build hetmoe, generate a tiny DeepSeek-V3-architecture model, inspect it, generate tokens
#   scripts/dev.sh test   build everything, run the whole test suite, check format, naming and that no plain code
#                         uses a tier's instructions (scripts/check_isa.sh), then the unit and
#                         conformance tests again under ASan + UBSan, then each fuzz target for a short while
#   scripts/dev.sh tsan   the unit and conformance tests under ThreadSanitizer (clang; about ten minutes on 2 cores,
#                         so not part of `test`)
#
# Build folders: build/ (RelWithDebInfo, GCC), build-asan/, build-tsan/ and build-fuzz/ (clang).
# Generated models go to out/.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}

configure() {  # dir, extra cmake args...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
}

# The main build: optimized, with line tables only (-g1: perf, backtraces and sanitizer reports name file and line;
# a third less compile time than -g).
configure_main() {
  configure build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DHETMOE_TESTS=ON
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
  configure_main
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
  git ls-files 'quant/*.cpp' 'cpu_kernels/*.cpp' 'runtime/*.cpp' 'server/*.cpp' 'tools/*.cpp' |
    xargs -P "$JOBS" -n 4 clang-tidy -p build --quiet 2>/dev/null
  scripts/check_isa.sh build/tools/hetmoe
}

test_all() {
  configure_main
  ninja -C build -j "$JOBS"
  (cd build && ctest -j "$JOBS" --output-on-failure $(ctest_filter))
  lint

  # Second stage: the unit and conformance tests under AddressSanitizer and UndefinedBehaviorSanitizer, built by
  # clang: a second compiler's errors and warnings, UBSan checks GCC's lacks (pointer overflow, float-to-int
  # conversion), and a build in half GCC's time (the tests and the command-line front end unoptimized, see
  # CMakeLists.txt). CUDA stays out of it: ASan and the CUDA runtime do not share an address space layout.
  # Line tables only (-g1): the sanitizers' reports still name file and line, and the build takes half the time.
  configure build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DHETMOE_SANITIZE=ON \
    -DHETMOE_TESTS=ON -DHETMOE_CUDA=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  ninja -C build-asan -j "$JOBS"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    LSAN_OPTIONS="suppressions=$PWD/../tests/lsan.supp:print_suppressions=0" \
    ctest -j "$JOBS" --output-on-failure -L "unit|conformance" $(ctest_filter))

  # Third: every fuzz target for a short while, on its committed corpus and what it found before, as a smoke test;
  # a crash fails the stage (scripts/fuzz.sh runs a target for longer, docs/fuzzing.md has the long campaign). The
  # GGUF reader gets the longest: every file hetmoe opens goes through it.
  mkdir -p build-fuzz
  for run in gguf:30 gguf_shards:10 tokenizer:10 model_config:10 chat_template:10 openai:10; do
    local target=${run%:*} log=build-fuzz/ci-${run%:*}.log
    HETMOE_FUZZ_JOBS=$JOBS scripts/fuzz.sh "$target" "${run#*:}" >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
    grep -E "^(stat::number_of_executed_units|fuzz.sh: $target: corpus)" "$log"
  done
}

# The thread pool's hand-overs, the server's batcher and connections, the devices' streams: every unit and
# conformance test again with ThreadSanitizer, a report failing the test. tests/tsan.supp leaves out what it reports
# inside Debian's uninstrumented oneDNN and OpenMP runtime.
tsan() {
  configure build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DHETMOE_SANITIZE_THREAD=ON \
    -DHETMOE_TESTS=ON -DHETMOE_CUDA=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  ninja -C build-tsan -j "$JOBS"
  (cd build-tsan && TSAN_OPTIONS="exitcode=66 ignore_noninstrumented_modules=1 suppressions=$PWD/../tests/tsan.supp" \
    ctest -j "$JOBS" --output-on-failure -L "unit|conformance" $(ctest_filter))
}

case "${1:-}" in
  demo) scripts/deps.sh && demo ;;
  test) scripts/deps.sh && test_all ;;
  tsan) scripts/deps.sh && tsan ;;
  *)
    echo "usage: scripts/dev.sh demo|test|tsan" >&2
    exit 2
    ;;
esac
