#!/usr/bin/env bash
# Session 21 run B (prepared, not yet run): the lean paired kernel timed -- the batch sweep and the 8B model at the
# 99 KB plans with it and without it (EXL3_PAIR=0: passes of 16, session 20's behaviour), two rounds; then where the
# 99 KB plans lose at batch 1 / 8 (session 20: 3.081 / 3.771 against 2.594 / 3.119 ms): the H200's plans without the
# dual grid, without the cluster exchange, and both. (Since issue 40 the library reads no environment: the sweep's
# switches are bench_cuda_exl3 --tune flags; the end-to-end runs of `exl3 bench` below with EXL3_PAIR / EXL3_DUAL /
# EXL3_CLUSTER / EXL3_SMEM_LIMIT set reproduce that session only with its build.)
set -uo pipefail
mkdir -p /tmp/r1 /tmp/models && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
(python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b > /tmp/mk.log 2>&1) &
for lim in 0 101376; do for pair in 1 0; do
  echo "== sweep limit=$lim pair=$pair"; /tmp/r1/bench_cuda_exl3 --batch-sweep --shapes 5 --tune pair=$pair,smem_limit=$lim 2>&1 | grep -E "^\| 8B" | head -8
done; done
wait; tail -1 /tmp/mk.log
b() { /tmp/r1/exl3 bench -m /tmp/models/l8b -d cuda -p 16 "$@" -g 64 2>&1 | grep -E "^\| [0-9]+ \||rror" | cut -d'|' -f2,3,4 | tr '\n' ' '; }
for r in 1 2; do for lim in 0 101376; do for pair in 1 0; do
  echo "limit=$lim pair=$pair round $r: $(EXL3_PAIR=$pair EXL3_SMEM_LIMIT=$lim b -b 1,16,24,32 -c 512)"
done; done; done
for r in 1 2; do
  echo "dual=0 round $r: $(EXL3_DUAL=0 b -b 1,8 -c 512)"
  echo "cluster=0 round $r: $(EXL3_CLUSTER=0 b -b 1,8 -c 512)"
  echo "dual=0 cluster=0 round $r: $(EXL3_DUAL=0 EXL3_CLUSTER=0 b -b 1,8 -c 512)"
  echo "limit=101376 round $r: $(EXL3_SMEM_LIMIT=101376 b -b 1,8 -c 512)"
done
