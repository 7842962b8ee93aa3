#!/usr/bin/env bash
# On the GPU machine, after scripts/device_test.sh has built build-dev: make random-weight models with real shapes
# and run `exl3 bench` on them; then the kernel benches. Tables go to stdout and $OUT.
# EXL3_BENCH_SHAPES (default "llama3-8b qwen2.5-7b") picks the models.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
shapes=${EXL3_BENCH_SHAPES:-"llama3-8b qwen2.5-7b"}
for shape in $shapes; do
  dir=/tmp/models/$shape
  [ -f "$dir/config.json" ] || python3 tools/bench/make_random_model.py --shape "$shape" --out "$dir" || exit 1
  case "$shape" in
    llama3-8b) args=(-p 512,2048,8192 -b 1,8,32 -c 512,16384 -g 32) ;;
    *) args=(-p 512,2048 -b 1,8,32 -c 512 -g 32) ;;
  esac
  echo "== $shape: exl3 bench -m $dir -d cuda ${args[*]}"
  ./build-dev/tools/exl3/exl3 bench -m "$dir" -d cuda "${args[@]}" 2>&1 | tee "$OUT/bench_$shape.txt"
  if [ "$shape" = llama3-8b ]; then
    echo "== $shape with cuBLAS for decode GEMMs (EXL3_GEMV=0), for comparison"
    EXL3_GEMV=0 ./build-dev/tools/exl3/exl3 bench -m "$dir" -d cuda -p 512 -b 1,8 -c 512 -g 32 2>&1 | tail -5
  fi
done
if [ -x build-dev/bench/bench_cuda_gemv ]; then ./build-dev/bench/bench_cuda_gemv 2>&1 | tee "$OUT/bench_gemv.txt"; fi
if [ -x build-dev/bench/bench_cuda_attention ]; then
  ./build-dev/bench/bench_cuda_attention 2>&1 | tee "$OUT/bench_attention.txt" | tail -30
fi
