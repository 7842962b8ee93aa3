#!/usr/bin/env bash
# On the GPU machine after scripts/device_all.sh (it built build-dev): a random Llama-3-8B-shaped EXL3 model (4.0 bpw,
# 6-bit head; tools/bench/make_random_model.py), then `exl3 bench` (prefill and decode beside the roofline), the
# generator under 1/8/32/128 concurrent jobs with fp16 and 8-bit KV (`exl3 bench --jobs`), and `exl3 serve` under
# 64 streaming clients (scripts/device_serve.sh; SERVE_BIN: an exl3 built with the server, e.g. carried from a build
# machine with libcpp-httplib next to it).
# Usage: [EXL3_BIN=exl3 to bench, default build-dev's] [SERVE_BIN=.device/srv/exl3] bash scripts/device_e2e.sh [--no-bench] [--no-jobs] [--no-serve]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
serve=1; jobs=1; bench=1
for a in "$@"; do
  case "$a" in --no-serve) serve=0 ;; --no-jobs) jobs=0 ;; --no-bench) bench=0 ;; esac
done
X=${EXL3_BIN:-build-dev/tools/exl3/exl3}
M=/tmp/models/l8b-exl3
t0=$(date +%s)
[ -f $M/config.json ] || python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out $M > "$OUT/make_model.log" 2>&1 \
  || { tail -5 "$OUT/make_model.log"; exit 1; }
echo "model: $(( $(date +%s) - t0 )) s, $(du -sh $M | cut -f1)"
if [ "$bench" = 1 ]; then
  echo "== exl3 bench: Llama-3-8B shape, EXL3 4.0 bpw + 6-bit head (random trellis)"
  $X bench -m $M -d cuda -p 512,2048 -b 1,8,32 -c 512 -g 64 2>&1 | tee "$OUT/bench_e2e_exl3.txt" | tail -14
fi
if [ "$jobs" = 1 ]; then
  echo "== generator: concurrent jobs, prompt 1024 + 256 new tokens, fp16 KV"
  $X bench -m $M -d cuda --jobs 1,8,32,128 --job-prompt 1024 --job-gen 256 2>&1 | tee "$OUT/bench_jobs_fp16.txt" | tail -12
  echo "== the same with 8-bit KV"
  $X bench -m $M -d cuda --jobs 1,8,32,128 --job-prompt 1024 --job-gen 256 --kv-bits 8 2>&1 | tee "$OUT/bench_jobs_kv8.txt" | tail -12
fi
if [ "$serve" = 1 ] && [ -n "${SERVE_BIN:-}" ]; then
  echo "== exl3 serve: 64 streaming clients x 4 requests x 256 tokens"
  export LD_LIBRARY_PATH="$(cd "$(dirname "$SERVE_BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  EXL3_BIN=$SERVE_BIN MODEL=$M CLIENTS=64 REQUESTS=4 MAX_TOKENS=256 bash scripts/device_serve.sh 2>&1 | tail -25
fi
