#!/usr/bin/env bash
# Session 29 run B: the instruction ceiling (bench_cuda_decode_lab: the digit kernel's K4 mix, variants 17 / 19, with
# no memory traffic) and the fused kernel's asymptote in the same run, twice (docs/kernels/exl3.md note 56), with
# the bounds each sets on the anchor table and on a Llama-3-8B step (--ceiling: the lab's best rate of that mix).
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
echo "== decode lab"
timeout 120 /tmp/b/f/bench_cuda_decode_lab > /tmp/lab.log 2>&1; head -1 /tmp/lab.log
grep -E '^1[79] ' /tmp/lab.log
CEIL=$(grep -E '^1[79] ' /tmp/lab.log | awk '{for (i = 2; i <= NF; i++) if ($i == "weights/clk/SM") print $(i - 1)}' |
       sort -n | tail -1)
echo "ceiling taken: $CEIL weights/clk/SM"
for round in 1 2; do
  echo "== asymptote, mul1, round $round"
  timeout 240 /tmp/b/f/bench_cuda_exl3 --asymptote --codebook mul1 --ks 2,3,4,5,6,8 --ceiling "$CEIL" 2>&1
done
