#!/usr/bin/env bash
# Session 26 run G: MUL1 at K = 3 with two of its eight states' last step by IDP.2A (dp2a_states 0x22) instead of
# none (run E's 0xAA went both ways). .device/r1: exl3_cuda_tests + bench_cuda_exl3 with it; .device/beforeb3: the
# bench of 4d0060d (K = 3 on the ALU). The EXL3 CUDA tests, then the MUL1 anchor table before / after, twice.
set -uo pipefail
for d in beforeb3 r1; do mkdir -p /tmp/$d && xz -dc .device/$d/bins.tar.xz | tar xf - -C /tmp/$d; done
/tmp/r1/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED' | head -20
for round in 1 2; do
  for d in beforeb3 r1; do echo "-- mul1 $d"; /tmp/$d/bench_cuda_exl3 --codebook mul1 2>&1 | tail -8; done
done
