#!/usr/bin/env bash
# Session 26 run D: the paired kernel (17-32 rows) also takes 3INST / MCG half-word states by IDP.2A. .device/r1: the
# build with it (exl3, exl3_cuda_tests, bench_cuda_exl3); .device/beforeb: main's bench_cuda_exl3 before session 26.
# The EXL3 CUDA tests (the new one now 1-32 rows), the K4 batch sweep for 3INST before / after, then end to end after:
# random Llama-3-8B EXL3 4.0 bpw + 6-bit head, 3INST at batch 1-32 and MUL1 at batch 1 / 8.
set -uo pipefail
for d in beforeb r1; do mkdir -p /tmp/$d && xz -dc .device/$d/bins.tar.xz | tar xf - -C /tmp/$d; done
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
echo "== tests"
/tmp/r1/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -40
/tmp/r1/exl3_cuda_tests --gtest_filter='Exl3Cuda.ThreeInstAndMcgMatchCpuForEveryK' 2>&1 | grep 'max err' |
  sort -k17 -g | tail -3
for m in 3inst mul1; do
  python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --codebook $m \
    --out /tmp/models/l8b-$m > /tmp/model.log 2>&1 || { echo "model failed"; tail -5 /tmp/model.log; }
done
echo "== K4 batch sweep, 3INST"
for d in beforeb r1; do
  echo "-- $d"; /tmp/$d/bench_cuda_exl3 --codebook 3inst --shapes 0 --batch-sweep 2>&1 | tail -14
done
echo "== end to end (r1)"
for round in 1 2; do
  /tmp/r1/exl3 bench -m /tmp/models/l8b-3inst -d cuda -p 16 -b 1,8,16,32 -c 512 -g 128 2>&1 | tail -7
  /tmp/r1/exl3 bench -m /tmp/models/l8b-mul1 -d cuda -p 16 -b 1,8 -c 512 -g 128 2>&1 | tail -5
done
