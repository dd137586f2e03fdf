#!/usr/bin/env bash
# The checks that need a GPU (and an AMX host), as one script for the short time a GPU machine is lent:
#   1. what the machine is: nvidia-smi, the CPU's flags (AMX?), the ISA tier hetmoe picks;
#   2. build with CUDA (tests on), then the `gpu` tests and the CPU kernel tests (on an AMX host these run the AMX
#      tier's tile kernels for real);
#   3. a bench model (DeepSeek-V2-Lite dimensions, HETMOE_GPU_LAYERS blocks) and its split;
#   4. calibrate against the GPU: the link, one expert there and each ISA tier's crossover;
#   5. `hetmoe bench` on the CPU and with --device cuda for each policy (the forward pass on the GPU, and with
#      --host-pass only the FFNs there), and the policies with the measured profile on Zipf-skewed routing;
#   6. what `hetmoe simulate` predicts for the same runs from the measured profile and the model's own routing, to
#      set against step 5's measurements;
#   7. the two splits (W^Q + W^R, and W^Q next to the source experts) and their benches;
#   8. `hetmoe tune --verify` with the measured profile: the best settings it predicts, each benched here;
#   9. CPU decode against the DRAM roofline at 2, 4, 8 and all threads, and where a step's time goes with all of them.
# Everything it prints also goes to $OUT/gpu_check.log when OUT is set (the device tool's result folder).
# Each step has a time limit (a hang must not eat a short lease) and a failed step does not stop the next.
# Usage: scripts/gpu_check.sh            (HETMOE_GPU_LAYERS=4 by default; JOBS=nproc)
#        HETMOE_BUNDLE=DIR scripts/gpu_check.sh
#            on a machine without hetmoe's -dev packages: DIR is scripts/bundle.sh's tarball unpacked (bin/, lib/,
#            lib-cxx/), built elsewhere; the tests' reference files must be where that build's source tree was.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
LAYERS=${HETMOE_GPU_LAYERS:-4}
log=${OUT:-/tmp}/gpu_check.log
exec > >(tee "$log") 2>&1

step() { echo; echo "=== $* ($(date +%T))"; }

step machine
nvidia-smi -L || echo "no nvidia-smi"
lscpu | grep -E "Model name|^CPU\(s\)|NUMA node\(s\)" || true
echo "AMX flags: $(grep -o -w -E 'amx_tile|amx_int8|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"

if [ -n "${HETMOE_BUNDLE:-}" ]; then
  step "bundle $HETMOE_BUNDLE (built elsewhere)"
  bin=$HETMOE_BUNDLE/bin
  export LD_LIBRARY_PATH="$HETMOE_BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! "$bin/hetmoe" --version >/dev/null 2>&1; then  # this machine's libstdc++ is older than the build's
    export LD_LIBRARY_PATH="$HETMOE_BUNDLE/lib-cxx:$LD_LIBRARY_PATH"
  fi
  export HETMOE_CUDA_LIBRARY=$bin/libhetmoe_cuda.so
  # Each CUDA library the device library needs and the loader does not find, from the toolkit or a Python wheel,
  # by its exact name (libcublas.so.13 for a CUDA 13 build).
  for lib in $(ldd "$HETMOE_CUDA_LIBRARY" | awk '/not found/ {print $1}'); do
    found=$(find /usr/local/cuda*/ /usr/lib /opt -name "$lib" 2>/dev/null | head -1)
    [ -n "$found" ] && export LD_LIBRARY_PATH="$(dirname "$found"):$LD_LIBRARY_PATH"
  done
  ldd "$HETMOE_CUDA_LIBRARY" | grep "not found" || true
  hetmoe=$bin/hetmoe
  test_cuda=$bin/test_cuda
  test_cpu=$bin/test_cpu_kernels
else
  step build
  build_log=${OUT:-/tmp}/gpu_build.log
  if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DHETMOE_TESTS=ON && ninja -C build-gpu -j "$JOBS"; } \
    >"$build_log" 2>&1; then
    tail -40 "$build_log"
    exit 1
  fi
  grep -E "hetmoe: (CUDA|oneDNN)" "$build_log"
  hetmoe=./build-gpu/tools/hetmoe
  test_cuda=./build-gpu/tests/gpu/test_cuda
  test_cpu=./build-gpu/tests/unit/cpu_kernels/test_cpu_kernels
fi
"$hetmoe" --version
# The binary links no CUDA library (the device is libhetmoe_cuda.so, loaded for --device cuda), and stays small.
echo "hetmoe links: $(ldd "$hetmoe" | grep -ciE 'cublas|cudart') CUDA libraries"
[ -x /usr/bin/time ] && /usr/bin/time -f "hetmoe --version: %M kB resident" "$hetmoe" --version >/dev/null

step "gpu tests"
# On this machine a test that skips for want of a GPU fails: the device library must load and see the GPU.
HETMOE_REQUIRE_GPU=1 timeout 240 "$test_cuda" --gtest_also_run_disabled_tests || echo "gpu tests: exit $?"
step "CPU kernel tests (the AMX tier where the CPU has it)"
timeout 60 "$test_cpu" --gtest_brief=1 || echo "CPU kernel tests: exit $?"

step "bench model: deepseek-v2-lite, $LAYERS blocks, Q4_K_M"
mkdir -p out
model=out/v2lite-${LAYERS}l-Q4_K_M.gguf
split=out/v2lite-${LAYERS}l.split.gguf
[ -f "$model" ] || timeout 180 "$hetmoe" make-model --preset deepseek-v2-lite --layers "$LAYERS" --type Q4_K_M \
  -o "$model" -t "$JOBS" 2>&1 | tail -1

step "calibrate against the GPU (link, one expert there, crossover per ISA tier)"
profile="${OUT:-/tmp}/profile-gpu.json"
timeout 120 "$hetmoe" calibrate -m "$model" --device cuda --max-rows 256 -t "$JOBS" -o "$profile"

step "bench: the source file"
# Progress lines (carriage returns) dropped; errors, the device notes and the scheduler's counts kept.
bench() {
  timeout 120 "$hetmoe" bench --repeat 3 -t "$JOBS" "$@" 2>&1 |
    tr '\r' '\n' | grep -vE ': (warm-up run|run [0-9]+/[0-9]+)'
}
short=(--prompt 128 --gen 32)
bench -m "$model" --policies cpu "${short[@]}"
bench -m "$model" --device cuda --policies static,kt,crossover "${short[@]}"
bench -m "$model" --device cuda --policies crossover --prompt 512 --gen 16
# The measured crossover against the fixed rules, with the routing skewed (admissions, prefetch).
bench -m "$model" --device cuda --policies static,kt,crossover --profile "$profile" --synthetic zipf:1.2 \
  --device-memory 1 --prompt 512 --gen 64

step "predicted: hetmoe simulate with the measured profile and the model's routing (set against the benches above)"
prompt=$(seq -s, 7 53 6778)  # 128 token ids
timeout 60 "$hetmoe" run -m "$model" --device cpu --tokens "$prompt" -n 32 --temp 0 -t "$JOBS" \
  --trace-routing "${OUT:-/tmp}/routing.jsonl" >/dev/null 2>&1
timeout 60 "$hetmoe" simulate --hw "$profile" --model-config deepseek-v2-lite --layers "$LAYERS" \
  --policies cpu,static,kt,crossover,split --prompt 128 --gen 32 --trace "${OUT:-/tmp}/routing.jsonl"

step "split: W^Q 2 bits + Q4_K residual, and its benches"
if [ ! -f "$split" ]; then
  t0=$(date +%s%N)
  timeout 240 "$hetmoe" split -m "$model" -o "$split" -t "$JOBS" --report 2>&1 | tail -4
  echo "split: $((($(date +%s%N) - t0) / 1000000)) ms for $(du -m "$model" | cut -f1) MB of source"
fi
bench -m "$split" --policies cpu "${short[@]}"
bench -m "$split" --device cuda --policies static,kt,crossover,split "${short[@]}"
bench -m "$split" --device cuda --policies crossover --host-pass "${short[@]}"

step "source split: W^Q next to the source experts (critical experts exact from the source), and its benches"
source_split=out/v2lite-${LAYERS}l.source-split.gguf
if [ ! -f "$source_split" ]; then
  t0=$(date +%s%N)
  timeout 240 "$hetmoe" split -m "$model" -o "$source_split" --critical-from source -t "$JOBS" 2>&1 | tail -2
  echo "source split: $((($(date +%s%N) - t0) / 1000000)) ms for $(du -m "$model" | cut -f1) MB of source"
fi
bench -m "$source_split" --device cuda --policies crossover,split "${short[@]}"

step "tune with the measured profile: the best settings predicted, then benched here (--verify)"
timeout 300 "$hetmoe" tune -m "$model" --hw "$profile" --prompt 128 --gen 32 --top 3 --verify -t "$JOBS" 2>&1 |
  tr '\r' '\n' | grep -vE ': (warm-up run|run [0-9]+/[0-9]+)'

step "CPU decode against the DRAM roofline, by thread count (two cores per memory system here against many)"
# bench's roofline % is decode tok/s x weight bytes a token over the bandwidth its probe reads after each run with the
# same threads; the profile's parts (one-token calls) say which part reads below it.
for t in $(printf '%s\n' 2 4 8 "$JOBS" | awk -v max="$JOBS" '$1 <= max' | sort -nu); do
  timeout 120 "$hetmoe" bench -m "$model" --policies cpu --prompt 128 --gen 64 --repeat 3 -t "$t" 2>&1 |
    tr '\r' '\n' | grep -E '^(policy|cpu) '
done
HETMOE_PROFILE=1 timeout 60 "$hetmoe" bench -m "$model" --policies cpu --prompt 16 --gen 128 --repeat 1 -t "$JOBS" \
  2>&1 | tr '\r' '\n' | grep -A5 'one-token calls'

step done
