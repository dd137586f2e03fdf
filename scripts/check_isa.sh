#!/usr/bin/env bash
# Checks that only the ISA tiers' own code uses instructions past the x86-64 baseline.
#
# The AVX2 and AVX-512 kernels are compiled with -mavx2 / -mavx512*, and detect_isa() calls them only on CPUs that
# have those units. An inline function or template from a shared header that such a file instantiates is emitted
# there too, compiled with those flags; the linker keeps one copy of it for the whole program, and if it keeps that
# one, plain code calls AVX-512 instructions: an illegal instruction on an AVX2-only CPU. This lists every function
# of the binary that holds a VEX or EVEX instruction (v*, mask registers) or a BMI2 one and whose name does not put
# it in a tier (hetmoe::cpu::avx2, ::avx512, ::x86; a template instantiated with a tier's type names it too).
#
#   scripts/check_isa.sh build/tools/hetmoe     exit 1 and the functions when one is found
set -euo pipefail
binary=${1:?usage: scripts/check_isa.sh BINARY}
leaks=$(objdump -d --no-show-raw-insn -C "$binary" |
  awk '/^[0-9a-f]+ <.*>:$/ { fn = $0; next }
       /\t(v[a-z0-9]+|k[a-z]+[bwdq]|pext|pdep|shlx|shrx|sarx|rorx|bzhi)[ \t]/ { print fn }' |
  sort -u | grep -v -E 'hetmoe::cpu::(avx2|avx512|x86)::' || true)
if [[ -n "$leaks" ]]; then
  echo "check_isa: functions outside the ISA tiers use AVX/AVX-512/BMI2 instructions (a header function compiled" >&2
  echo "in a tier's file and kept by the linker for all callers; give it internal linkage or a tier namespace):" >&2
  echo "$leaks" >&2
  exit 1
fi
echo "check_isa: $binary: no AVX/AVX-512/BMI2 instructions outside the ISA tiers"
