#!/usr/bin/env bash
# On the GPU machine: build (sm_90), run every CUDA test, compute-sanitizer on the op tests, and the benchmarks.
# Usage (from the device tool): bash scripts/device_test.sh [--no-bench] [--only-tests REGEX]
# Expects the shared models the tests use in .device/models (carried), linked as ../shared is not there.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bench=1; filter='*'
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --only-tests) filter="$2"; shift ;;
  esac
  shift
done
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
if [ -d .device/models ]; then export EXL3_SHARED_DIR=$PWD/.device; fi
t0=$(date +%s)
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DEXL3_CUDA_ARCHS=90 -DEXL3_BUILD_BENCH=ON > "$OUT/cmake.log" 2>&1 \
  || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-dev -j16 > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
./build-dev/tests/cuda/exl3_cuda_tests --gtest_filter="$filter" 2>&1 | tee "$OUT/cuda_tests.log" | grep -vE "^\[ +(RUN|OK) \]" | tail -40
for t in build-dev/tests/cuda/exl3_cuda_prefix_cache_tests build-dev/tests/convert/exl3_viterbi_cuda_tests; do
  [ -x "$t" ] && "$t" --gtest_filter="$filter" 2>&1 | tee "$OUT/$(basename "$t").log" | grep -E "^\[  (PASSED|FAILED)|tiles/s"
done
if [ "$filter" = '*' ] && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck on the op tests and a CUDA model run"
  compute-sanitizer --tool memcheck --error-exitcode 9 ./build-dev/tests/cuda/exl3_cuda_tests \
    --gtest_filter='Act/OpsFixture*:CudaModel.TinyDraftMatchesCpu' > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer exit $? ($(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1))"
fi
if [ "$bench" = 1 ] && [ -f scripts/device_bench.sh ]; then bash scripts/device_bench.sh; fi
