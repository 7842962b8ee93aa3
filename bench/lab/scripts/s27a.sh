#!/usr/bin/env bash
# Session 27 run A: (1) the EXL3 / Viterbi CUDA tests of the build with the codebook constants shared with the host
# (quant/codebook.h; PTX byte-identical to the build before); (2) the ring depth: EXL3_RING_BYTES 32 KB (main) /
# 48 KB / 64 KB -- K5-K8 get only 2-3 stages at 32 KB; (3) K1 / K7 timings (bench_cuda_exl3 --ks 1,7), never taken.
# .device/r1/bins.tar.xz: r1/ (main), v48/, v64/ (bench_cuda_exl3, and exl3 for v48), m4/ (32 KB, at least 4
# stages: EXL3_RING_MIN_STAGES=4, i.e. only K5-K8 change).
# The variants were built here by compiling exl3_matmul.cu with the build's nvcc line plus -DEXL3_RING_BYTES=49152 /
# 65536 (m4: a since-removed EXL3_RING_MIN_STAGES=4, which also raised K5 and the paired kernel), putting the object
# into a copy of libexl3_cuda.a (ar r) and relinking exl3 / bench_cuda_exl3 with the build's link lines.
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
echo "== tests"
/tmp/b/r1/exl3_cuda_tests 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -20
/tmp/b/r1/exl3_viterbi_cuda_tests 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -10
(python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b4 > /tmp/m4.log 2>&1 &&
 python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 6 --head-bits 6 --out /tmp/models/l8b6 > /tmp/m6.log 2>&1) &
echo "== ring depth, MUL1 anchor table (K4-K8)"
for v in r1 v48; do echo "-- $v"; timeout 100 /tmp/b/$v/bench_cuda_exl3 --codebook mul1 --ks 4,5,6,8 2>&1 | tail -9; done
echo "-- m4"; timeout 80 /tmp/b/m4/bench_cuda_exl3 --codebook mul1 --ks 5,6,8 2>&1 | tail -9
wait
echo "== end to end, ring 32 KB (r1) vs 48 KB (v48) vs 32 KB with >= 4 stages (m4)"
for round in 1 2; do
  for m in l8b4 l8b6; do
    for v in r1 v48 m4; do
      echo "-- $m $v"; timeout 40 /tmp/b/$v/exl3 bench -m /tmp/models/$m -d cuda -p 16 -b 1,8 -c 512 -g 64 2>&1 | tail -2
    done
  done
done
echo "-- v64 (8B shapes)"; timeout 70 /tmp/b/v64/bench_cuda_exl3 --codebook mul1 --ks 4,5,6,8 --shapes 5 2>&1 | tail -6
echo "== K1 / K7 (8B shapes)"
for cb in mul1 3inst; do echo "-- $cb"; timeout 45 /tmp/b/r1/bench_cuda_exl3 --codebook $cb --ks 1,7 --shapes 5 2>&1 | tail -6; done
