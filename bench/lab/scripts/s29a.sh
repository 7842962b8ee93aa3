#!/usr/bin/env bash
# Session 29 run A: the fused kernel's asymptote (docs/kernels/exl3.md note 56). Batch 1 on ever wider shapes
# (k = 8192, n = 8192..229376) for every K of the anchor table and the three codebooks' K4: the per-call fixed cost
# and the marginal rate by a line fit, and the bounds that rate sets on the anchor table's cells and on a
# Llama-3-8B step; then today's anchor table and the end-to-end step beside them (two rounds).
set -uo pipefail
mkdir -p /tmp/b && xz -dc .device/r1/bins.tar.xz | tar xf - -C /tmp/b
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
(python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b4 \
   > /tmp/m4.log 2>&1 || echo "model failed") &
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv
echo "== asymptote, mul1"
timeout 240 /tmp/b/f/bench_cuda_exl3 --asymptote --codebook mul1 --ks 2,3,4,5,6,8 2>&1
for cb in 3inst mcg; do
  echo "== asymptote, $cb, K4"
  timeout 60 /tmp/b/f/bench_cuda_exl3 --asymptote --codebook $cb --ks 4 2>&1 | grep -E '^\| K|Llama' 
done
echo "== anchor table (mul1)"
timeout 90 /tmp/b/f/bench_cuda_exl3 --codebook mul1 2>&1 | tail -11
wait
echo "== end to end"
for round in 1 2; do
  timeout 60 /tmp/b/f/exl3 bench -m /tmp/models/l8b4 -d cuda -p 16 -b 1,8 -c 512 -g 128 2>&1 | tail -3
done
