#!/usr/bin/env bash
# Session 26 run E: the generic extraction (K = 1, 3, 5-8) takes its last step (the shift right by 16, or the half-word)
# by IDP.2A for chosen states (dp2a_states: 3INST / MCG all, MUL1 every other state). .device/r1: the build with it;
# .device/beforeb2: bench_cuda_exl3 of da326b5 (3INST / MCG at one LOP3 a weight, no generic dp2a). The EXL3 CUDA tests,
# the anchor table for MUL1 and 3INST before / after, then end to end after (random Llama-3-8B EXL3 4.0 bpw + 6-bit
# head: the head is K6), MUL1 and 3INST, batch 1 / 8.
set -uo pipefail
for d in beforeb2 r1; do mkdir -p /tmp/$d && xz -dc .device/$d/bins.tar.xz | tar xf - -C /tmp/$d; done
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
echo "== tests"
/tmp/r1/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -40
for m in 3inst mul1; do
  python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --codebook $m \
    --out /tmp/models/l8b-$m > /tmp/model.log 2>&1 || { echo "model failed"; tail -5 /tmp/model.log; }
done
echo "== anchor table"
for cb in mul1 3inst; do
  for d in beforeb2 r1; do echo "-- $cb $d"; /tmp/$d/bench_cuda_exl3 --codebook $cb 2>&1 | tail -8; done
done
echo "== end to end (r1)"
for round in 1 2; do
  for m in mul1 3inst; do
    /tmp/r1/exl3 bench -m /tmp/models/l8b-$m -d cuda -p 16 -b 1,8 -c 512 -g 128 2>&1 | tail -2
  done
done
