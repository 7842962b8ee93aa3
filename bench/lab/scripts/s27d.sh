#!/usr/bin/env bash
# Session 27 run D: the paired kernel (17-32 rows) with four ring stages at K = 6-8 (p4: -DEXL3_PAIR_DEEP=1, built by
# bench/lab/scripts/relink_variant.sh) against main (f). The Exl3Cuda tests on p4, then end to end at 6.0 and 4.0 bpw,
# batch 17 / 24 / 32, two rounds.
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
(for b in 6 4; do python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits $b --head-bits 6 \
   --out /tmp/models/l8b$b > /tmp/m$b.log 2>&1 || echo "model $b failed"; done) &
echo "== tests (p4)"
/tmp/b/p4/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED' | head -10
wait
echo "== end to end"
for round in 1 2; do
  for m in l8b6 l8b4; do
    for v in f p4; do
      echo "-- $m $v"; timeout 50 /tmp/b/$v/exl3 bench -m /tmp/models/$m -d cuda -p 16 -b 17,24,32 -c 512 -g 64 2>&1 | tail -3
    done
  done
done
