#!/usr/bin/env bash
# On the GPU machine, in one go: build the CUDA tests and benches (sm_90), run every CUDA test (models from
# .device/models, or unpacked from .device/pack/*.tar.xz), compute-sanitizer on the EXL3 op tests, the EXL3 kernel
# table beside the reference's, and decode attention at 16k context with fp16 and quantized KV.
# Usage (device tool): bash scripts/device_all.sh [--no-bench] [--filter GTEST_FILTER]
# Then scripts/device_e2e.sh (random Llama-3-8B-shaped model: exl3 bench, generator jobs, server under load).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bench=1; filter='*'
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --filter) filter="$2"; shift ;;
  esac
  shift
done
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
mkdir -p .device/models
for p in .device/pack/*.tar.xz; do
  [ -f "$p" ] && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$p" .device/models
done
ls .device/models
export EXL3_SHARED_DIR=$PWD/.device
t0=$(date +%s)
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DEXL3_CUDA_ARCHS=90 -DEXL3_BUILD_BENCH=ON > "$OUT/cmake.log" 2>&1 \
  || { tail -30 "$OUT/cmake.log"; exit 1; }
tests="exl3_cuda_tests exl3_cuda_prefix_cache_tests exl3_cuda_kv_quant_tests exl3_cuda_sampler_tests exl3_cuda_generator_tests exl3_viterbi_cuda_tests"
targets="$tests bench_cuda_exl3 bench_cuda_attention exl3"
avail=""; known=$(ninja -C build-dev -t targets all 2>/dev/null)  # not piped into grep -q: pipefail + SIGPIPE
for t in $targets; do grep -q "^$t:" <<< "$known" && avail="$avail $t"; done
cmake --build build-dev -j16 --target $avail > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build ($avail): $(( $(date +%s) - t0 )) s"
for t in $tests; do
  bin=$(find build-dev/tests -name "$t" -type f | head -1)
  [ -n "$bin" ] || continue
  s=$(date +%s)
  "$bin" --gtest_filter="$filter" > "$OUT/$t.log" 2>&1
  echo "== $t ($(( $(date +%s) - s )) s): $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|error" "$OUT/$t.log" | head -20
  grep -E "^  " "$OUT/$t.log" | grep -vE "^  (Expected|Which|  )" | head -30
done
if [ "$filter" = '*' ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build-dev/tests/cuda/exl3_cuda_tests --gtest_filter='Exl3Cuda.*' > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck Exl3Cuda.*: exit $? ($(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1))"
fi
if [ "$bench" = 1 ]; then
  echo "== EXL3 kernel table (bench_cuda_exl3, MUL1)"
  build-dev/bench/bench_cuda_exl3 2>&1 | tee "$OUT/bench_exl3.txt" | tail -11
  echo "== decode attention at 16k, fp16 and quantized KV (bench_cuda_attention kv)"
  build-dev/bench/bench_cuda_attention kv 2>&1 | tee "$OUT/bench_attention_kv.txt" | tail -30
fi
