# Shared steps of the libFuzzer scripts (fuzz.sh, fuzz_tokenizer.sh); sourced, not run.

# fuzz_build BUILD_DIR TARGET...: configures BUILD_DIR with clang, ASan and UBSan and builds the targets.
fuzz_build() {
  local build=$1
  shift
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DHETMOE_FUZZ=ON -DHETMOE_CUDA=OFF >/dev/null
  ninja -C "$build" -j "${HETMOE_FUZZ_JOBS:-1}" "$@"
}

# fuzz_dirs BUILD_DIR PREFIX: sets corpus (kept across runs), seeds (made afresh) and crashes under BUILD_DIR.
fuzz_dirs() {
  corpus=$1/${2}corpus
  seeds=$1/${2}seeds
  crashes=$1/${2}crashes
  mkdir -p "$corpus" "$crashes"
  rm -rf "$seeds"
  mkdir -p "$seeds"
}

# fuzz_run NAME BINARY MAX_LEN SECONDS RSS_MB LOG: runs the fuzzer on corpus and seeds, reports, exits with its status.
fuzz_run() {
  local name=$1 binary=$2 max_len=$3 seconds=$4 rss=$5 log=$6 status=0
  "$binary" "$corpus" "$seeds" -max_len="$max_len" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb="$rss" -print_final_stats=1 -artifact_prefix="$crashes/" 2>&1 | tee "$log" ||
    status=$?
  echo "$name: corpus holds $(ls "$corpus" | wc -l) inputs; $(ls "$crashes" | wc -l) files in $crashes; log in $log"
  exit "$status"
}
