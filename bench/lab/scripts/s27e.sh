#!/usr/bin/env bash
# Session 27 run E: three ring stages at K = 6-8 (t3: built by bench/lab/scripts/relink_variant.sh with a lab macro,
# EXL3_DEEP_STAGES=3, in place of ring_stages' 4; the macro is not kept in the source) against main's four (p4, whose
# PTX main's equals): the MUL1 anchor table at K6 / K8 and end to end at 6.0 bpw, two rounds.
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 6 --head-bits 6 --out /tmp/models/l8b6 \
  > /tmp/m6.log 2>&1 &
echo "== tests (t3)"
/tmp/b/t3/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED' | head -10
echo "== MUL1 anchor table (K6, K8)"
for v in p4 t3; do echo "-- $v"; timeout 60 /tmp/b/$v/bench_cuda_exl3 --codebook mul1 --ks 6,8 2>&1 | tail -8; done
wait
echo "== end to end, 6.0 bpw"
for round in 1 2; do
  for v in p4 t3; do
    echo "-- $v"; timeout 60 /tmp/b/$v/exl3 bench -m /tmp/models/l8b6 -d cuda -p 16 -b 1,8,16,32 -c 512 -g 64 2>&1 | tail -4
  done
done
