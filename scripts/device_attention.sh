#!/usr/bin/env bash
# Builds and runs the paged attention tests and benchmark on the GPU machine in one go:
#   bash scripts/device_attention.sh            (from the repository root; logs go to $OUT when it is set)
# Steps: configure + build (exl3_cuda_tests, bench_cuda_attention), the attention tests, compute-sanitizer
# (memcheck on small cases, racecheck/synccheck on one small case each), then the benchmark table (printed last).
set -uo pipefail
OUT=${OUT:-/tmp/attn_out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-dev}
JOBS=${JOBS:-16}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader || true

# The lead includes bench/cuda_attention.cmake from bench/CMakeLists.txt; until then, include it in this copy.
if [ -f bench/cuda_attention.cmake ] && ! grep -q cuda_attention.cmake bench/CMakeLists.txt; then
    echo 'if(EXL3_HAVE_CUDA)
  include(${CMAKE_CURRENT_SOURCE_DIR}/cuda_attention.cmake)
endif()' >> bench/CMakeLists.txt
fi

t0=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEXL3_CUDA_ARCHS=90 -DEXL3_BUILD_BENCH=ON \
    > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$BUILD" --target exl3_cuda_tests bench_cuda_attention -j"$JOBS" > "$OUT/build.log" 2>&1
build_rc=$?
TEST_BIN="$BUILD/tests/cuda/exl3_cuda_tests"
BENCH_BIN="$BUILD/bench/bench_cuda_attention"
if [ $build_rc -ne 0 ]; then
    # Someone else's file in the shared targets may not build right now: build ours alone.
    echo "== cmake build failed (rc $build_rc); building the attention files alone"
    grep -E "error|FAILED" "$OUT/build.log" | head -20
    cmake --build "$BUILD" --target exl3_cpu exl3_core -j"$JOBS" >> "$OUT/build.log" 2>&1
    FB=$BUILD/attn_fallback
    mkdir -p "$FB"
    for f in attention decode prefill kv_append; do
        nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Isrc -Iinclude -DEXL3_HAVE_CUDA=1 \
            -c src/backend/cuda/attention/$f.cu -o "$FB/$f.o" &
    done
    wait
    ar rcs "$FB/libattn.a" "$FB"/*.o
    CUDA_LIBS="-L/usr/local/cuda/lib64 -lcudart_static -ldl -lpthread -lrt"
    g++ -std=c++20 -O2 -Isrc -Iinclude -Itests -I/usr/local/cuda/include -DEXL3_HAVE_CUDA=1 \
        tests/cuda/attention_test.cpp "$FB/libattn.a" "$BUILD/src/backend/cpu/libexl3_cpu.a" \
        "$BUILD/src/core/libexl3_core.a" -lgtest -lgtest_main $CUDA_LIBS -o "$FB/attention_tests" || exit 1
    g++ -std=c++20 -O2 -Isrc -Iinclude -I/usr/local/cuda/include bench/cuda_attention_bench.cpp "$FB/libattn.a" \
        $CUDA_LIBS -o "$FB/bench_cuda_attention" || exit 1
    TEST_BIN="$FB/attention_tests"
    BENCH_BIN="$FB/bench_cuda_attention"
fi
echo "== build: $(( $(date +%s) - t0 )) s"
grep -A3 "paged_attention_kernel" "$OUT/build.log" | grep -E "registers|spill" | head -4

echo "== tests"
timeout 240 "$TEST_BIN" --gtest_filter='*PagedAttention*' 2>&1 | tee "$OUT/test.log" | grep -E "^\[attn\]|FAILED|PASSED|Failure|error" 
echo "== test rc ${PIPESTATUS[0]}"

echo "== compute-sanitizer"
SMALL='Cases/PagedAttention.MatchesCpuReference/mixed_bf16_d128_g4_p16:Cases/PagedAttention.MatchesCpuReference/decode_bf16_d128_long_split:Cases/PagedAttention.MatchesCpuReference/mixed_bf16_d256_g2_p64:PagedAttentionGraph.*'
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 "$TEST_BIN" --gtest_filter="$SMALL" \
    > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck.log" | tr '\n' ' ')"
TINY='Cases/PagedAttention.MatchesCpuReference/decode_f16_d64_g4_p64_w37'
for tool in racecheck synccheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 3 "$TEST_BIN" --gtest_filter="$TINY" \
        > "$OUT/$tool.log" 2>&1
    echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/$tool.log" | tr '\n' ' ')"
done

echo "== lab: decode split count forced (--decode-splits), default plan in the main table below"
for n in ${LAB_SPLITS:-16}; do
    echo "-- splits $n"
    timeout 60 "$BENCH_BIN" "decode ctx 16384" --decode-splits $n 2>&1 | grep -E "^decode" | tee -a "$OUT/lab.log"
done

echo "== ncu: per-kernel device time of one batch-1 16k decode step (attention kernel + split combine)"
timeout 90 ncu --clock-control none -k 'regex:paged_attention|attention_combine' --launch-skip 6 --launch-count 6 \
    --metrics gpu__time_duration.sum "$BENCH_BIN" "decode ctx 16384 batch 1" > "$OUT/ncu.log" 2>&1
grep -E "paged_attention_kernel|attention_combine|gpu__time_duration" "$OUT/ncu.log" | sed 's/(exl3::cuda::attn::KernelParams)//' \
    | cut -c1-110 | head -12

echo "== bench"
timeout 200 "$BENCH_BIN" 2>&1 | tee "$OUT/bench.log"
echo "== total $(( $(date +%s) - t0 )) s"
