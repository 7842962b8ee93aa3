#!/usr/bin/env bash
# On the GPU machine: the EXL3 kernels and what depends on them, in one go (issue 6; scripts/device_test.sh is the
# whole-suite script). Builds the CUDA test binaries, the kernel bench and `exl3` (sm_90), runs the CUDA tests
# (models from .device/models when carried: EXL3_SHARED_DIR), compute-sanitizer on the EXL3 op tests, the kernel
# table beside the reference's (anchors.md), and `exl3 bench` on random Llama-3-8B-shaped models: EXL3 4.0 bpw with a
# 6-bit head (tools/bench/make_random_model.py --exl3-bits 4) and bf16 for comparison.
# Usage: bash scripts/device_exl3.sh [--no-e2e] [--filter GTEST_FILTER]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
e2e=1; filter='*'
while [ $# -gt 0 ]; do
  case "$1" in
    --no-e2e) e2e=0 ;;
    --filter) filter="$2"; shift ;;
  esac
  shift
done
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
[ -d .device/models ] && export EXL3_SHARED_DIR=$PWD/.device
if [ "$e2e" = 1 ]; then
  mkdir -p /tmp/models
  ( [ -f /tmp/models/l8b-exl3/config.json ] || python3 tools/bench/make_random_model.py --shape llama3-8b --exl3-bits 4 --head-bits 6 --out /tmp/models/l8b-exl3
    [ -f /tmp/models/l8b/config.json ] || python3 tools/bench/make_random_model.py --shape llama3-8b --out /tmp/models/l8b ) > "$OUT/make_models.log" 2>&1 &
  models_pid=$!
fi
t0=$(date +%s)
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DEXL3_CUDA_ARCHS=90 -DEXL3_BUILD_BENCH=ON > "$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
targets="exl3_cuda_tests bench_cuda_exl3 exl3"
for t in exl3_cuda_prefix_cache_tests exl3_viterbi_cuda_tests; do
  ninja -C build-dev -t targets all 2>/dev/null | grep -q "^$t:" && targets="$targets $t"
done
cmake --build build-dev -j16 --target $targets > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -40; exit 1; }
echo "build ($targets): $(( $(date +%s) - t0 )) s"
for t in build-dev/tests/cuda/exl3_cuda_tests build-dev/tests/cuda/exl3_cuda_prefix_cache_tests build-dev/tests/convert/exl3_viterbi_cuda_tests; do
  [ -x "$t" ] || continue
  echo "== $(basename $t)"
  "$t" --gtest_filter="$filter" > "$OUT/$(basename $t).log" 2>&1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tiles/s|error CUDA" "$OUT/$(basename $t).log" | head -20
done
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build-dev/tests/cuda/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck Exl3Cuda.*: exit $? ($(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1))"
fi
echo "== kernel table (bench_cuda_exl3)"
build-dev/bench/bench_cuda_exl3 2>&1 | tee "$OUT/bench_exl3.txt" | tail -12
if [ "$e2e" = 1 ]; then
  wait $models_pid; tail -2 "$OUT/make_models.log"
  echo "== exl3 bench: Llama-3-8B shape, EXL3 4.0 bpw + 6-bit head (random trellis)"
  build-dev/tools/exl3/exl3 bench -m /tmp/models/l8b-exl3 -d cuda -p 512,2048 -b 1,8,32 -c 512 -g 64 2>&1 | tee "$OUT/bench_e2e_exl3.txt" | tail -14
  echo "== exl3 bench: the same shape in bf16"
  build-dev/tools/exl3/exl3 bench -m /tmp/models/l8b -d cuda -p 2048 -b 1,8 -c 512 -g 32 2>&1 | tee "$OUT/bench_e2e_bf16.txt" | tail -10
fi
