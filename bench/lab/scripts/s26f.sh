#!/usr/bin/env bash
# Session 26 run F: the final build (MUL1 K = 3 back to the ALU extraction after run E) -- the EXL3 CUDA tests, the
# MUL1 and 3INST anchor tables, end to end MUL1 / 3INST at batch 1 / 8 (random Llama-3-8B EXL3 4.0 bpw + 6-bit head).
set -uo pipefail
mkdir -p /tmp/r1 && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
echo "== tests"
/tmp/r1/exl3_cuda_tests 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==|SKIPPED' | head -40
for m in 3inst mul1; do
  python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --codebook $m \
    --out /tmp/models/l8b-$m > /tmp/model.log 2>&1 || { echo "model failed"; tail -5 /tmp/model.log; }
done
echo "== anchor table"
for cb in mul1 3inst mcg; do echo "-- $cb"; /tmp/r1/bench_cuda_exl3 --codebook $cb 2>&1 | tail -8; done
echo "== end to end"
for round in 1 2; do
  for m in mul1 3inst; do
    echo "-- $m"; /tmp/r1/exl3 bench -m /tmp/models/l8b-$m -d cuda -p 16 -b 1,8,16,32 -c 512 -g 128 2>&1 | tail -4
  done
done
