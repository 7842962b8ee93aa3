#!/usr/bin/env bash
# Session 27 run C: the final build (f/: four ring stages where 32 KB holds two, K = 6-8, H = 1; the stages beyond the
# 32 KB ring's requested after the activations) against r1/ (the build before). The EXL3 CUDA tests (also at the 99 KB
# and 163 KB plans), the anchor tables (MUL1 K1-K8, 3INST K4-K8), end to end at 4.0 bpw (batch 1-32, for the README)
# and 6.0 bpw (f against r1), two rounds.
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
(for b in 4 6; do python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits $b --head-bits 6 \
   --out /tmp/models/l8b$b > /tmp/m$b.log 2>&1 || echo "model $b failed"; done) &
echo "== tests (f)"
/tmp/b/f/exl3_cuda_tests 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -20
for lim in 101376 166912; do
  echo "-- EXL3_SMEM_LIMIT=$lim"
  EXL3_SMEM_LIMIT=$lim /tmp/b/f/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED' | head -10
done
echo "== anchor tables"
echo "-- f mul1"; timeout 60 /tmp/b/f/bench_cuda_exl3 --codebook mul1 2>&1 | tail -11
echo "-- f mul1 K1 K7"; timeout 50 /tmp/b/f/bench_cuda_exl3 --codebook mul1 --ks 1,7 2>&1 | tail -8
for v in r1 f; do echo "-- $v 3inst"; timeout 50 /tmp/b/$v/bench_cuda_exl3 --codebook 3inst --ks 5,6,7,8 2>&1 | tail -8; done
wait
echo "== end to end"
for round in 1 2; do
  echo "-- l8b4 f"; timeout 60 /tmp/b/f/exl3 bench -m /tmp/models/l8b4 -d cuda -p 16 -b 1,8,16,32 -c 512 -g 128 2>&1 | tail -4
  for v in r1 f; do
    echo "-- l8b6 $v"; timeout 40 /tmp/b/$v/exl3 bench -m /tmp/models/l8b6 -d cuda -p 16 -b 1,8,16 -c 512 -g 128 2>&1 | tail -3
  done
done
