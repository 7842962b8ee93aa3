#!/usr/bin/env bash
# Session 22 run B: the lean paired kernel's tests after the PlansFit fix (48 rows are past the paired kernel).
set -uo pipefail
mkdir -p /tmp/r1 && tar xJf .device/r1/bins.tar.xz -C /tmp/r1
export LD_LIBRARY_PATH=$PWD/.device/r1:${LD_LIBRARY_PATH:-}
export EXL3_SHARED_DIR=$PWD/.device
echo "== PlansFit"; /tmp/r1/exl3_cuda_tests --gtest_filter='*PlansFit*' 2>&1 | grep -E "limit [0-9]+ in|^\[ *(FAILED|PASSED|  OK) " | head -20
for lim in 0 101376; do echo "== tests limit=$lim: $(EXL3_SMEM_LIMIT=$lim /tmp/r1/exl3_cuda_tests 2>&1 | grep -E '^\[ *(FAILED|PASSED) |Failure' | head -8 | tr '\n' ' ')"; done
