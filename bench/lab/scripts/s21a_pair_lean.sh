#!/usr/bin/env bash
# Session 21 run A (prepared, not yet run: no device was lent in session 21): the paired kernel's lean build (17-32
# rows where the default build exceeds the block's shared memory: 99 KB on sm_86 / sm_89) -- the CUDA tests at three
# limits, racecheck / synccheck at 99 KB. Binaries: bash scripts/pack_device.sh build-90 exl3 exl3_cuda_tests
# bench_cuda_exl3 (-> .device/r1), then run with carry [".device"]. Run B (s21b_pair_lean_bench.sh) times it.
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
echo "== PlansFit"; /tmp/r1/exl3_cuda_tests --gtest_filter='*PlansFit*' 2>&1 | grep -E "^\[ *(FAILED|PASSED|  OK) |Failure|Expected|Which|Value of|Actual" | head -20
for lim in 0 101376 166912; do echo "== tests limit=$lim: $(EXL3_SMEM_LIMIT=$lim /tmp/r1/exl3_cuda_tests 2>&1 | grep -E '^\[ *(FAILED|PASSED) |Failure' | head -8 | tr '\n' ' ')"; done
for tool in racecheck synccheck; do
  echo "== $tool (99 KB, ragged shapes, every K and codebook): $(EXL3_SMEM_LIMIT=101376 timeout 200 compute-sanitizer --tool $tool /tmp/r1/exl3_cuda_tests --gtest_filter='*RaggedShapes*' 2>&1 | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED' | head -4 | tr '\n' ' ')"
done
