#!/usr/bin/env bash
# CUDA test binaries built here (sm_90) and packed by scripts/pack_device.sh, run on the GPU machine with a gtest
# filter each and a time limit each, in one device call: the build's source folder is linked to this checkout (the
# tests read tests/models through it) and the committed fixture extracts are unpacked where the build expects them.
# Prints each binary's verdict, its failures and the lines that carry figures; full logs in $OUT.
# Usage (device tool): bash scripts/device_packed_tests.sh [P=.device/r1] BIN:FILTER:SECONDS ...
#   e.g. exl3_cuda_tp_tests:'CudaTensorParallel.*':90 exl3_cuda_memory_tests:'*':60
set -uo pipefail
P=.device/r1
runs=()
for a in "$@"; do case "$a" in P=*) P=${a#P=} ;; *) runs+=("$a") ;; esac; done
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/tmp/bins; . scripts/device_unpack.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
for r in "${runs[@]}"; do
  bin=${r%%:*}; rest=${r#*:}; filter=${rest%:*}; secs=${rest##*:}
  echo "== [$(($(date +%s) - t0)) s] $bin --gtest_filter='$filter' (limit ${secs} s)"
  timeout "$secs" "$B/$bin" --gtest_filter="$filter" > "$OUT/$bin.log" 2>&1
  echo "exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \] [0-9]|worst|within|tiles/s|Failure|Expected|actual|error" "$OUT/$bin.log" \
    | grep -v "^\[  FAILED  \] .*, listed below" | head -40
done
echo "== done in $(($(date +%s) - t0)) s"
