#!/usr/bin/env bash
# Issue 42, batch-32 decode: the grouped MoE stage kernel (exl3_moe_kernel, exl3_moe_kernel.cuh) takes 126
# registers a thread at K4 MUL1 8-row passes, so two blocks of 256 threads fit an SM (25 % occupancy) and the
# eleventh session's Nsight Compute run found it latency-bound there (0.66 instructions issued a cycle per
# scheduler, 1.45 of 3.88 warps eligible). Three blocks need <= 80 registers. This builds exl3 variants that ask
# for it on the 8-row builds only (BT == 1: every decode step up to 32 tokens on Qwen3-30B-A3B), from patched copies
# of the sources (the library keeps no switch for it), and packs them beside the build as it is:
#   lb3    __launch_bounds__(256, 3) where BT == 1;
#   lb3nu  the same, and the weight ring's loop not unrolled where BT == 1 (fewer live registers, fewer spills).
# Prints each variant's registers and spills for the instances the Qwen3-30B-A3B shape runs (ptxas -v), then packs
# .device/r1 (pack_device.sh; the build as it is is `new`, and `base` too, so that two rounds compare like with like).
# The device call (one, ~5 min: the tests prove the build as it is; the variants differ only in register allocation):
#   ROUNDS=2 DECODE=1 DECODE_MEMCHECK=none DECODE_BATCHES=1,8,32 DECODE_VARIANTS="base lb3 lb3nu" \
#     BENCH_TOKENS=1,8,32 bash scripts/device_moe.sh
# Usage: bash bench/lab/scripts/s42_moe_occupancy.sh [BUILD_DIR (default build/release)]
set -euo pipefail
build=$(realpath "${1:-build/release}")
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
work=/tmp/s42-variants; rm -rf "$work"; mkdir -p "$work"
kernel=backend/cuda/exl3/exl3_moe_kernel.cuh
ninja -C "$build" exl3 bench_cuda_moe exl3_cuda_tests exl3_cuda_generator_tests exl3_cuda_tp_tests > /dev/null
cmd=$(cd "$build" && python3 - "$build" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1] + '/compile_commands.json')):
    if c['file'].endswith('/backend/cuda/exl3/exl3_moe.cu'):
        print(c['command'])
PY
)
patch_lb3() { sed -i 's/__launch_bounds__(kThreads, 2) exl3_moe_kernel/__launch_bounds__(kThreads, BT == 1 ? 3 : 2) exl3_moe_kernel/' "$1"; }
patch_nu() { sed -i 's/constexpr bool UNROLL_RING = !(CB == 2/constexpr bool UNROLL_RING = BT != 1 \&\& !(CB == 2/' "$1"; }
variants=()
for v in lb3 lb3nu; do
  d=$work/$v; mkdir -p "$d"; cp -r "$src/src" "$d/src"
  patch_lb3 "$d/src/$kernel"
  [ $v = lb3nu ] && patch_nu "$d/src/$kernel"
  grep -q "BT == 1 ? 3 : 2" "$d/src/$kernel" || { echo "$v: the patch no longer applies"; exit 1; }
  # The build's own nvcc line on the copy, with ptxas -v: the registers and spills of every instance.
  obj=$(basename "$(sed -E 's/.* -o ([^ ]+).*/\1/' <<< "$cmd")")
  c=${cmd//$src\/src/$d/src}; c=$(sed -E "s# -o [^ ]+# -o $d/$obj#" <<< "$c")
  (cd "$build" && set -f && $c -Xptxas -v) > "$d/ptxas.log" 2>&1
  echo "== $v: the Qwen3-30B-A3B shape's instances (K4, MUL1; 8- and 16-row passes)"
  awk '/Compiling entry/ { n = "" } /Compiling entry.*exl3_moe_kernelILi4ELi2ELi[12]E/ { n = ($0 ~ /ELi1E/) ? "BT1" : "BT2" }
       n && /spill stores/ { sp = $0; sub(/.*frame, /, "", sp) }
       n && /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); print "  " n ": " substr($0, RSTART, RLENGTH) ", " sp; n = "" }' \
    "$d/ptxas.log"
  cp "$build/src/backend/cuda/libexl3_cuda.a" "$d/"
  (cd "$d" && ar r libexl3_cuda.a "$obj")
  # The build's own link line for exl3, with this library and output.
  link=$(cd "$build" && ninja -t commands tools/exl3/exl3 | tail -1 | sed 's/^: && //; s/ && :$//')
  link=${link//src\/backend\/cuda\/libexl3_cuda.a/$d/libexl3_cuda.a}; link=${link//-o tools\/exl3\/exl3 /-o $d/exl3 }
  (cd "$build" && set -f && $link)
  variants+=("$v=$d/exl3")
done
BASE=$build/tools/exl3/exl3 VARIANTS="${variants[*]}" bash "$src/scripts/pack_device.sh" "$build" exl3 exl3_cuda_tests \
  exl3_cuda_generator_tests exl3_cuda_tp_tests bench_cuda_moe
