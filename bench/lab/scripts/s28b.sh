#!/usr/bin/env bash
# (The binaries are the branch wip/defer-output's build: docs/kernels/exl3.md note 55.)
# Session 28 run B: deferred outputs, v2 -- the consumer's pending path in a kernel of its own (128 registers, so that
# its blocks land beside the matmul's; run A's one build took 193 for every input rotation). Tests, then end to end
# EXL3_DEFER=0 against 1 (4.0 bpw three rounds, 6.0 bpw two).
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device/shared
(for b in 4 6; do python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits $b --head-bits 6 \
   --out /tmp/models/l8b$b > /tmp/m$b.log 2>&1 || echo "model $b failed"; done) &
echo "== tests"
/tmp/b/f/exl3_cuda_tests --gtest_filter='Exl3Cuda.*:CudaModel.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|^\[==' | head -20
wait
echo "== end to end"
for round in 1 2 3; do
  for d in 0 1; do
    echo "-- l8b4 defer=$d"; EXL3_DEFER=$d timeout 60 /tmp/b/f/exl3 bench -m /tmp/models/l8b4 -d cuda -p 16 -b 1,8,16,32 -c 512 -g 128 2>&1 | tail -4
  done
done
for round in 1 2; do
  for d in 0 1; do
    echo "-- l8b6 defer=$d"; EXL3_DEFER=$d timeout 40 /tmp/b/f/exl3 bench -m /tmp/models/l8b6 -d cuda -p 16 -b 1,8 -c 512 -g 128 2>&1 | tail -2
  done
done
