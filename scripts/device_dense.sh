#!/usr/bin/env bash
# On the GPU machine, with binaries built elsewhere (BIN, default .device/bin; unpacked from .device/r1/bins.tar.xz and
# .device/r2/bins.tar.xz when carried): every CUDA test binary present, compute-sanitizer on the ops, attention and
# tiny-model tests, the decode GEMV table, and `exl3 bench` on random-weight Llama-3-8B-shaped models (bf16, and EXL3
# 4.0 bpw with a 6-bit head). Issue 5's decode figures in one call, without a build on the GPU machine.
# Usage: bash scripts/device_dense.sh [--tests-only] [--no-exl3] [--jobs] [--no-attention]
#   --jobs: also the generator under 1, 8 and 32 concurrent jobs on the EXL3 model (prompt 1024 + 256 new tokens)
#   BF16_ARGS: the bf16 bench's arguments (default -p 512,2048,8192 -b 1,8,32 -c 512,16384 -g 128)
# Pack with scripts/pack_device.sh (one archive: the binaries share their kernels, so xz with a large dictionary
# stores them about once). Carry (device tool) .device/r1 and .device/pack (tiny-target) -- 64 MiB a call in all,
# the tree included; .device/r2 can hold a second archive and model-exl3.tar.xz for another call.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tests_only=0; exl3=1; jobs=0; attention=1
for a in "$@"; do
  case "$a" in --tests-only) tests_only=1 ;; --no-exl3) exl3=0 ;; --jobs) jobs=1 ;; --no-attention) attention=0 ;; esac
done
BIN=${BIN:-.device/bin}
mkdir -p "$BIN" .device/models
for p in .device/r[12]/bins.tar.xz; do [ -f "$p" ] && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$p" "$BIN"; done
for p in .device/pack/*.tar.xz .device/r[12]/model*.tar.xz; do
  [ -f "$p" ] && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$p" .device/models
done
export EXL3_SHARED_DIR=$PWD/.device
for l in .device/r[12]/libcpp-httplib.so.0.11; do [ -f "$l" ] && cp "$l" "$BIN/"; done
export LD_LIBRARY_PATH="$(cd "$BIN" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader || true
echo "models: $(ls .device/models | tr '\n' ' ')"
for t in exl3_cuda_tests exl3_cuda_prefix_cache_tests exl3_cuda_kv_quant_tests exl3_cuda_sampler_tests exl3_cuda_generator_tests; do
  [ -x "$BIN/$t" ] || continue
  "$BIN/$t" > "$OUT/$t.log" 2>&1
  echo "== $t: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|SKIPPED \]" "$OUT/$t.log" | head -20
done
if [ -x "$BIN/exl3_cuda_tests" ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/exl3_cuda_tests" \
    --gtest_filter='Act/OpsFixture*:CudaModel.*Tiny*:*Attention*' > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck (ops, attention, tiny models): exit $? ($(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1))"
fi
[ "$tests_only" = 1 ] && exit 0
[ -x "$BIN/bench_cuda_gemv" ] && { echo "== bench_cuda_gemv"; "$BIN/bench_cuda_gemv" 2>&1 | tee "$OUT/bench_gemv.txt" | tail -12; }
M=/tmp/models/llama3-8b
t0=$(date +%s)
[ -f $M/config.json ] || python3 tools/bench/make_random_model.py --shape llama3-8b --out $M > "$OUT/make_model.log" 2>&1 \
  || { tail -5 "$OUT/make_model.log"; exit 1; }
echo "bf16 model: $(( $(date +%s) - t0 )) s"
echo "== exl3 bench, Llama-3-8B shape, bf16"
"$BIN/exl3" bench -m $M -d cuda ${BF16_ARGS:--p 512,2048,8192 -b 1,8,32 -c 512,16384 -g 128} 2>&1 | tee "$OUT/bench_bf16.txt" | tail -16
if [ "$exl3" = 1 ]; then
  E=/tmp/models/l8b-exl3
  [ -f $E/config.json ] || python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out $E > "$OUT/make_exl3.log" 2>&1 \
    || { tail -5 "$OUT/make_exl3.log"; exit 1; }
  echo "== exl3 bench, Llama-3-8B shape, EXL3 4.0 bpw + 6-bit head"
  "$BIN/exl3" bench -m $E -d cuda -p 512,2048 -b 1,8,32 -c 512 -g 128 2>&1 | tee "$OUT/bench_exl3.txt" | tail -10
  if [ "$jobs" = 1 ]; then
    echo "== generator: 1, 8, 32 concurrent jobs, prompt 1024 + 256 new tokens, fp16 KV"
    "$BIN/exl3" bench -m $E -d cuda --jobs 1,8,32 --job-prompt 1024 --job-gen 256 2>&1 | tee "$OUT/bench_jobs.txt" | tail -8
  fi
fi
if [ "$attention" = 1 ] && [ -x "$BIN/bench_cuda_attention" ]; then
  echo "== decode attention at 16k (bench_cuda_attention)"
  "$BIN/bench_cuda_attention" 2>&1 | tee "$OUT/bench_attention.txt" | tail -14
fi
