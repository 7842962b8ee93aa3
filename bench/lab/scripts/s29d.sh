#!/usr/bin/env bash
# Session 29 run E: end to end at the bitrates the README did not cover -- random Llama-3-8B EXL3 models at 2, 3 and
# 5 bits a weight (6-bit head), beside 4 bits, batch 1 / 8 / 16 / 32 at context 512, two rounds.
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r2/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r2:${LD_LIBRARY_PATH:-}
for b in 2 3 4 5; do
  python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits $b --head-bits 6 --out /tmp/models/l8b$b \
    > /tmp/m$b.log 2>&1 || { echo "model $b failed"; tail -3 /tmp/m$b.log; } &
done
wait
for round in 1 2; do
  for b in 2 3 4 5; do
    echo "-- ${b}.0 bpw, round $round"
    timeout 90 /tmp/b/f/exl3 bench -m /tmp/models/l8b$b -d cuda -p 16 -b 1,8,16,32 -c 512 -g 128 2>&1 | tail -5
  done
done
